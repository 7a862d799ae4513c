package rules

import (
	"fmt"
	"net/netip"
	"net/url"
	"sort"

	"kiln/store"
)

// FieldError is the error of the record-level checks below: Field names
// the offending field as a JSON path of the REST API's bodies ("name",
// "labels.zone", "intended.nics[1].mac", "claim.hostname"), Msg says what
// is wrong with it. The API answers it as 400 "invalid" naming the field.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func bad(field, format string, a ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, a...)}
}

// MaxRackUnit bounds Machine.RackUnit and Rack.Units (rack units, U).
const MaxRackUnit = 100

func text(field, v string, max int) error {
	if err := CheckText(v, max); err != nil {
		return bad(field, "%v", err)
	}
	return nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// CheckLabels applies CheckLabel to every label of l, in key order so that
// the first bad label named is always the same; field prefixes the key
// ("labels" → "labels.zone").
func CheckLabels(field string, l map[string]string) error {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := CheckLabel(k, l[k]); err != nil {
			return bad(field+"."+k, "%v", err)
		}
	}
	return nil
}

// CheckHardware checks intended hardware and normalises it in place: free
// text (serial, vendor, model, uuid, firmware, disk and NIC names) by
// CheckText, the BMC address by CheckHostPort, counts not negative, every
// NIC MAC and the BMC MAC by store.ParseMachineMAC (EUI-48, unicast, not
// all zeros; rewritten to lower-case colon form), no MAC twice. field is
// the JSON name of the value ("intended").
func CheckHardware(field string, h *store.Hardware) error {
	t := func(name, v string) error { return text(field+"."+name, v, MaxTextLen) }
	if err := firstErr(t("serial", h.Serial), t("vendor", h.Vendor), t("model", h.Model), t("uuid", h.UUID),
		t("firmware", h.Firmware)); err != nil {
		return err
	}
	if h.BMCAddress != "" {
		if err := CheckHostPort(h.BMCAddress); err != nil {
			return bad(field+".bmc_address", "%v", err)
		}
	}
	for i, d := range h.Disks {
		f := fmt.Sprintf("disks[%d].", i)
		if err := firstErr(t(f+"name", d.Name), t(f+"serial", d.Serial), t(f+"wwn", d.WWN), t(f+"model", d.Model)); err != nil {
			return err
		}
	}
	if h.CPUs < 0 {
		return bad(field+".cpus", "must not be negative")
	}
	if h.GPUs < 0 {
		return bad(field+".gpus", "must not be negative")
	}
	seen := map[string]bool{}
	for i := range h.NICs {
		if err := t(fmt.Sprintf("nics[%d].name", i), h.NICs[i].Name); err != nil {
			return err
		}
		f := fmt.Sprintf("%s.nics[%d].mac", field, i)
		m, err := store.ParseMachineMAC(h.NICs[i].MAC)
		if err != nil {
			return bad(f, "%v", err)
		}
		if seen[m] {
			return bad(f, "duplicate MAC %s", m)
		}
		seen[m] = true
		h.NICs[i].MAC = m
	}
	if h.BMCMAC != "" {
		m, err := store.ParseMachineMAC(h.BMCMAC)
		if err != nil {
			return bad(field+".bmc_mac", "%v", err)
		}
		h.BMCMAC = m
	}
	return nil
}

// CheckIntended checks the operator-owned fields of machine m, normalising
// MACs in place: the name (CheckName, when set), site, rack, boot override
// and root-disk serial and WWN (CheckText, MaxTextLen), the rack unit
// (0..MaxRackUnit), labels (CheckLabels), the boot mode (uefi, legacy or
// unset), the IPv4 reservation (an IPv4 address or unset) and, when hw is
// true, the intended hardware (CheckHardware). hw false skips the hardware,
// for an update that leaves it as stored. Errors: *FieldError.
func CheckIntended(m *store.Machine, hw bool) error {
	if m.Name != "" {
		if err := CheckName(m.Name); err != nil {
			return bad("name", "%v", err)
		}
	}
	if err := firstErr(text("site", m.Site, MaxTextLen), text("rack", m.Rack, MaxTextLen),
		text("boot_override", m.BootOverride, MaxTextLen),
		text("root_disk.serial", m.RootDisk.Serial, MaxTextLen), text("root_disk.wwn", m.RootDisk.WWN, MaxTextLen)); err != nil {
		return err
	}
	if m.RackUnit < 0 || m.RackUnit > MaxRackUnit {
		return bad("rack_unit", "must be 0..%d", MaxRackUnit)
	}
	if err := CheckLabels("labels", m.Labels); err != nil {
		return err
	}
	if hw {
		if err := CheckHardware("intended", &m.Intended); err != nil {
			return err
		}
	}
	switch m.BootMode {
	case "", store.BootModeUEFI, store.BootModeLegacy:
	default:
		return bad("boot_mode", "must be uefi or legacy")
	}
	if m.IPv4 != "" {
		a, err := netip.ParseAddr(m.IPv4)
		if err != nil || !a.Is4() {
			return bad("ipv4", "%q is not an IPv4 address", m.IPv4)
		}
	}
	return nil
}

// CheckClaim checks a claim's fields: an image ID is required (that it
// names a stored image is the store's rule, checked when the claim is
// written), the host name by CheckHostname, the role as free text
// (MaxTextLen), the labels by CheckLabels, the cluster block by
// CheckCluster (issue 15). field is the claim's JSON name
// ("claim"). Errors: *FieldError.
func CheckClaim(field string, cl store.Claim) error {
	if cl.Image == "" {
		return bad(field+".image", "required: an image ID from GET /v1/images")
	}
	if cl.Hostname != "" {
		if err := CheckHostname(cl.Hostname); err != nil {
			return bad(field+".hostname", "%v", err)
		}
	}
	if err := text(field+".role", cl.Role, MaxTextLen); err != nil {
		return err
	}
	if err := CheckWebhookURL(cl.DrainWebhook); err != nil {
		return bad(field+".drain_webhook", "%v", err)
	}
	if err := CheckLabels(field+".selector", cl.Selector); err != nil {
		return err
	}
	if cl.Cluster != nil {
		// Issue 15: the cluster block (release.go), normalised in place.
		if err := CheckCluster(field+".cluster", cl.Cluster, cl.Cluster.Token, cl.Cluster.TokenRef != ""); err != nil {
			return err
		}
	}
	return CheckLabels(field+".labels", cl.Labels)
}

// MaxWebhookLen bounds a webhook URL (bytes).
const MaxWebhookLen = 2048

// CheckWebhookURL checks a URL Kiln POSTs to (a claim's drain webhook):
// empty, or an absolute http or https URL with a host and no user
// information, at most MaxWebhookLen bytes.
func CheckWebhookURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if len(s) > MaxWebhookLen || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return fmt.Errorf("%q: want an http(s)://host/... URL without credentials, at most %d bytes", s, MaxWebhookLen)
	}
	return nil
}

// Health report values (POST /v1/machines/{id}/health).
const (
	MaxConditionTypeLen = 63
)

// CheckHealthReport checks an owner's health report: a condition type of 1
// to MaxConditionTypeLen letters, digits, '.', '_', '-' or '/' (as a label
// key), a status of OK, Warning or Critical (Redfish Resource.Health), a
// reason (label-key characters, at most MaxConditionTypeLen, may be empty)
// and a message of free text (MaxTextLen). Errors: *FieldError.
func CheckHealthReport(condType, status, reason, message string) error {
	if condType == "" || len(condType) > MaxConditionTypeLen || !labelKeyRe.MatchString(condType) {
		return bad("type", "%q: want 1 to %d letters, digits, '.', '_', '-' or '/', starting and ending with a letter or digit", condType, MaxConditionTypeLen)
	}
	switch status {
	case store.HealthOK, store.HealthWarning, store.HealthCritical:
	default:
		return bad("status", "%q: want OK, Warning or Critical", status)
	}
	if reason != "" && (len(reason) > MaxConditionTypeLen || !labelKeyRe.MatchString(reason)) {
		return bad("reason", "%q: want up to %d letters, digits, '.', '_', '-' or '/'", reason, MaxConditionTypeLen)
	}
	return text("message", message, MaxTextLen)
}

// CheckBMCDriver checks a BMC driver name: redfish, ipmi or auto (probe
// Redfish, then IPMI).
func CheckBMCDriver(d string) error {
	switch d {
	case "redfish", "ipmi", "auto":
		return nil
	}
	return fmt.Errorf("%q is not redfish|ipmi|auto", d)
}

// CheckImageFormat checks an image format: raw, gzip or zstd (the agent
// decompresses gzip and zstd while it writes the disk).
func CheckImageFormat(f string) error {
	switch f {
	case "raw", "gzip", "zstd":
		return nil
	}
	return fmt.Errorf("%q is not raw|gzip|zstd", f)
}
