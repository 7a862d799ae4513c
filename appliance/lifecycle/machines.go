package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// Machine records are written by this package only (top-level DESIGN.md,
// appliance/lifecycle/DESIGN.md): the operator's intended fields here
// (CreateMachine, UpdateIntended), discovery here and in boot.go, the BMC
// inventory after an enrollment here, everything else in the lifecycle's
// transitions. Each path applies the rules of package rules.

// Intended is the operator-owned part of a machine record: where it
// stands, its labels, the hardware it should have and how it is to boot.
// Its fields are those of store.Machine with the same names.
type Intended struct {
	Name         string
	Site         string
	Rack         string
	RackUnit     int // rack unit (U), 0..rules.MaxRackUnit
	Labels       map[string]string
	Hardware     store.Hardware // Machine.Intended
	RootDisk     store.DiskRule
	Wipe         bool
	BootMode     store.BootMode
	IPv4         string
	BootOverride string
	Netboot      *bool
}

// IntendedPatch changes some intended fields of one machine. A nil field is
// left as stored; Labels and Hardware replace the whole value.
// ResourceVersion is the version the caller read and is required: a
// machine written since is store.ErrConflict.
type IntendedPatch struct {
	ResourceVersion uint64
	Name            *string
	Site            *string
	Rack            *string
	RackUnit        *int
	Labels          *map[string]string
	Hardware        *store.Hardware
	RootDisk        *store.DiskRule
	Wipe            *bool
	BootMode        *store.BootMode
	IPv4            *string
	BootOverride    *string
	Netboot         *bool
}

// invalidField wraps a rule's *rules.FieldError as ErrInvalid.
func invalidField(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalid, err)
}

// CreateMachine records one machine in state registered with the intended
// fields in (rules.CheckIntended; MACs normalised), which needs at least
// one NIC MAC or a serial. The store picks the ID; a name, serial or MAC
// another machine holds is refused by the store. w.Reason defaults to
// "created". Errors: ErrInvalid wrapping *rules.FieldError, store errors
// (store.ErrConflict, store.ErrDuplicateMAC, store.ErrNotLeader).
func (c *Controller) CreateMachine(ctx context.Context, in Intended, w store.W) (store.Machine, error) {
	m := store.Machine{State: store.StateRegistered}
	setIntended(&m, in)
	if err := rules.CheckIntended(&m, true); err != nil {
		return store.Machine{}, invalidField(err)
	}
	if len(m.Intended.NICs) == 0 && m.Intended.Serial == "" {
		return store.Machine{}, invalidField(&rules.FieldError{Field: "intended.nics",
			Msg: "a machine needs at least one NIC MAC or a serial"})
	}
	out, err := c.st.PutMachine(ctx, m, withDefaults(w, "created"))
	if err != nil {
		return store.Machine{}, fmt.Errorf("lifecycle: create machine: %w", err)
	}
	return out, nil
}

func setIntended(m *store.Machine, in Intended) {
	m.Name, m.Site, m.Rack, m.RackUnit, m.Labels = in.Name, in.Site, in.Rack, in.RackUnit, in.Labels
	m.Intended, m.RootDisk, m.Wipe, m.BootMode = in.Hardware, in.RootDisk, in.Wipe, in.BootMode
	m.IPv4, m.BootOverride, m.Netboot = in.IPv4, in.BootOverride, in.Netboot
}

// UpdateIntended applies p to machine id with compare-and-set on
// p.ResourceVersion, in any state; the state, claim, step and boot token
// are kept as stored. The result is checked by rules.CheckIntended (the
// hardware only when p replaces it, so a stored value of an older rule does
// not block other edits). w.Reason defaults to "intended_updated". Errors:
// ErrInvalid wrapping *rules.FieldError (resource_version 0 among them),
// store.ErrNotFound, store.ErrConflict (the machine changed since the
// caller read it: read it again and retry), store errors.
func (c *Controller) UpdateIntended(ctx context.Context, id string, p IntendedPatch, w store.W) (store.Machine, error) {
	if p.ResourceVersion == 0 {
		return store.Machine{}, invalidField(&rules.FieldError{Field: "resource_version", Msg: "required: the resource_version you read"})
	}
	cur, err := c.st.GetMachine(id)
	if err != nil {
		return store.Machine{}, fmt.Errorf("lifecycle: machine %s: %w", id, err)
	}
	if cur.ResourceVersion != p.ResourceVersion {
		return store.Machine{}, fmt.Errorf("%w: machine %s is at resource_version %d, not %d; GET it and retry",
			store.ErrConflict, cur.ID, cur.ResourceVersion, p.ResourceVersion)
	}
	m := cloneMachine(cur)
	set := func(dst *string, v *string) {
		if v != nil {
			*dst = *v
		}
	}
	set(&m.Name, p.Name)
	set(&m.Site, p.Site)
	set(&m.Rack, p.Rack)
	set(&m.IPv4, p.IPv4)
	set(&m.BootOverride, p.BootOverride)
	if p.RackUnit != nil {
		m.RackUnit = *p.RackUnit
	}
	if p.Labels != nil {
		m.Labels = *p.Labels
	}
	if p.Hardware != nil {
		m.Intended = *p.Hardware
	}
	if p.RootDisk != nil {
		m.RootDisk = *p.RootDisk
	}
	if p.Wipe != nil {
		m.Wipe = *p.Wipe
	}
	if p.BootMode != nil {
		m.BootMode = *p.BootMode
	}
	if p.Netboot != nil {
		v := *p.Netboot
		m.Netboot = &v
	}
	if err := rules.CheckIntended(&m, p.Hardware != nil); err != nil {
		return store.Machine{}, invalidField(err)
	}
	out, err := c.st.PutMachine(ctx, m, withDefaults(w, "intended_updated"))
	if err != nil {
		return store.Machine{}, fmt.Errorf("lifecycle: update machine %s: %w", id, err)
	}
	return out, nil
}

// Labels and actor of records the DHCP path discovers.
const (
	DiscoveredByDHCP = "dhcp"                 // DiscoverDHCP recorded it (value of LabelDiscoveredBy)
	LabelArch        = "kiln.io/arch"         // the client's RFC 4578 architecture, named
	LabelVendorClass = "kiln.io/vendor-class" // the client's option 60, made a label value
	ActorDHCP        = "dhcp"
)

// DiscoverDHCP records an unknown MAC that asked for DHCP as a discovered
// machine (no name, no boot token; labels kiln.io/discovered-by=dhcp,
// kiln.io/arch=arch and kiln.io/vendor-class from vendorClass, reduced to
// what a label value may hold), so the site team sees every server that
// asks. It takes the same discovery limits as BootFor's (Config
// DiscoverRate, DiscoverBurst, MaxDiscovered): over them nothing is
// recorded and created is false with a nil error. A MAC a record already
// has is not recorded again (created false). Errors: ErrInvalid (mac),
// store errors.
func (c *Controller) DiscoverDHCP(ctx context.Context, mac, arch, vendorClass string) (created bool, err error) {
	mac, err = store.ParseMachineMAC(mac)
	if err != nil {
		return false, fmt.Errorf("%w: mac %v", ErrInvalid, err)
	}
	labels := map[string]string{LabelDiscoveredBy: DiscoveredByDHCP}
	if v := labelValue(arch); v != "" {
		labels[LabelArch] = v
	}
	if v := labelValue(vendorClass); v != "" {
		labels[LabelVendorClass] = v
	}
	out, res, err := c.recordDiscovered(ctx, mac, store.W{Actor: ActorDHCP, Reason: ReasonDiscovered},
		func() (store.Machine, error) {
			return store.Machine{State: store.StateDiscovered, Reason: ReasonDiscovered, Labels: labels,
				Intended: store.Hardware{NICs: []store.NIC{{MAC: mac}}}}, nil
		})
	if err != nil || res != discCreated {
		return false, err
	}
	c.logger().Info("discovered unknown machine", "machine", out.ID, "mac", mac, "by", DiscoveredByDHCP)
	return true, nil
}

// labelValue reduces text a machine sent to a label value that
// rules.CheckLabel accepts: printable ASCII without spaces, ',' or '=', at
// most 63 bytes.
func labelValue(s string) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= 63 {
			break
		}
		if r > ' ' && r < 0x7f && r != ',' && r != '=' {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Outcomes of recordDiscovered.
const (
	discCreated = iota // recorded now
	discKnown          // the MAC has a record (before, or written meanwhile)
	discRefused        // over the rate or the cap: nothing recorded
)

// recordDiscovered creates the discovered record build returns for an
// unknown mac, under discMu so that the cap check and the write are not
// interleaved with another discovery on this node. build runs only once
// the discovery is admitted (within the token bucket and MaxDiscovered).
func (c *Controller) recordDiscovered(ctx context.Context, mac string, w store.W, build func() (store.Machine, error)) (store.Machine, int, error) {
	c.discMu.Lock()
	defer c.discMu.Unlock()
	if _, err := c.st.MachineByMAC(mac); err == nil {
		return store.Machine{}, discKnown, nil
	}
	if !c.discoverToken() {
		c.m.discDropped.WithLabelValues(dropRate).Inc()
		c.logger().Debug("discovery refused: rate limit", "mac", mac)
		return store.Machine{}, discRefused, nil
	}
	counts, err := c.st.CountByState()
	if err != nil {
		return store.Machine{}, 0, fmt.Errorf("lifecycle: discover %s: count: %w", mac, err)
	}
	if n := counts[store.StateDiscovered]; n >= c.cfg.MaxDiscovered {
		c.m.discDropped.WithLabelValues(dropCap).Inc()
		c.logger().Debug("discovery refused: discovered cap reached", "mac", mac, "discovered", n)
		return store.Machine{}, discRefused, nil
	}
	m, err := build()
	if err != nil {
		return store.Machine{}, 0, err
	}
	if err := rules.CheckLabels("labels", m.Labels); err != nil {
		return store.Machine{}, 0, fmt.Errorf("lifecycle: discover %s: %w", mac, invalidField(err))
	}
	out, err := c.st.PutMachine(ctx, m, w)
	if err != nil {
		if again, gerr := c.st.MachineByMAC(mac); gerr == nil && again.ID != "" {
			return store.Machine{}, discKnown, nil
		}
		return store.Machine{}, 0, fmt.Errorf("lifecycle: discover %s: %w", mac, err)
	}
	return out, discCreated, nil
}

// BMCInventory is optionally implemented by the Config's BMC: what the BMC
// knows of its machine (Redfish ComputerSystem and EthernetInterfaces).
// ErrNoInventory (wrapped) when the BMC offers none (IPMI); other errors
// are the BMC's.
type BMCInventory interface {
	Inventory(ctx context.Context, machineID string) (Inventory, error)
}

// Inventory is a BMC's description of its machine; "" or nil where the BMC
// gave nothing. NICMACs are MACs in any case or separator form.
type Inventory struct {
	Serial       string
	Manufacturer string
	Model        string
	UUID         string
	NICMACs      []string
}

// ErrNoInventory: the machine's BMC offers no inventory (not a failure).
var ErrNoInventory = errors.New("lifecycle: the BMC offers no inventory")

// bmcInventoryTimeout bounds the inventory read that follows an enrollment.
const bmcInventoryTimeout = 15 * time.Second

// readInventory reads the BMC's inventory of machine id into its
// discovered fields (mergeInventory), so the site team sees what stands in
// the slot before it ever boots; the agent's inspection later replaces
// them with its fuller report. A failed read is recorded as an event
// (kind bmc_inventory, to failed, reason bmc_failed) and not returned: the
// enrollment stands either way.
func (c *Controller) readInventory(ctx context.Context, id string, w store.W) {
	bi, ok := c.bmc.(BMCInventory)
	if !ok || c.bmc == nil {
		return
	}
	ictx, cancel := context.WithTimeout(ctx, bmcInventoryTimeout)
	defer cancel()
	inv, err := bi.Inventory(ictx, id)
	switch {
	case errors.Is(err, ErrNoInventory):
		return
	case err != nil:
		if aerr := c.st.AppendEvents(ctx, []store.Event{{Subject: "machine/" + id, Kind: "bmc_inventory", To: "failed",
			Actor: w.Actor, Reason: ReasonBMCFailed, Message: truncate(sanitize(err.Error()), rules.MaxDescriptionLen)}}); aerr != nil {
			c.logger().Warn("bmc inventory failed; recording it failed too", "machine", id, "err", err, "record_err", aerr)
		}
		return
	}
	if _, err := c.update(ctx, id, store.W{Actor: "bmc", Reason: "bmc_inventory"}, func(m *store.Machine) error {
		mergeInventory(m, inv)
		return nil
	}); err != nil {
		c.logger().Warn("record bmc inventory", "machine", id, "err", err)
	}
}

// mergeInventory fills m.Discovered from a BMC's inventory where the BMC
// offered a value (free text sanitised and cut to rules.MaxTextLen); NICs
// it lists are added, in lower-case colon form, if not already known. MACs
// store.ParseMachineMAC refuses are skipped.
func mergeInventory(m *store.Machine, inv Inventory) {
	if m.Discovered == nil {
		m.Discovered = &store.Hardware{}
	}
	d := m.Discovered
	set := func(dst *string, v string) {
		if v = truncate(sanitize(v), rules.MaxTextLen); v != "" {
			*dst = v
		}
	}
	set(&d.Serial, inv.Serial)
	set(&d.Vendor, inv.Manufacturer)
	set(&d.Model, inv.Model)
	set(&d.UUID, inv.UUID)
	for _, s := range inv.NICMACs {
		mac, err := store.ParseMachineMAC(s)
		if err != nil {
			continue
		}
		known := false
		for _, n := range d.NICs {
			if strings.EqualFold(n.MAC, mac) {
				known = true
				break
			}
		}
		if !known {
			d.NICs = append(d.NICs, store.NIC{MAC: mac})
		}
	}
}
