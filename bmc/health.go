package bmc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/stmcginnis/gofish/common"
)

// Bounds on what Health reads from a BMC.
const (
	// MaxHealthEvents is the most HealthEvents one Health returns (the newest).
	MaxHealthEvents = 20
	maxLogServices  = 4       // Redfish LogServices read per system
	maxLogPages     = 4       // pages (Members@odata.nextLink) read per LogService
	maxHealthDoc    = 4 << 20 // bytes read of one Redfish document
)

// Health reads the machine's health from its BMC.
//
// Redfish (DSP2046): the first ComputerSystem's Status.Health and Status.HealthRollup
// (System is the worse of the two), the Chassis its Links.Chassis names first (Chassis:
// the worse of that chassis' Health and HealthRollup; HealthUnknown without a link), and
// the Warning/Critical LogEntry resources of the system's LogServices (Severity, Created,
// Message, Id), if the system has LogServices. A ComputerSystem without Health and
// HealthRollup is ErrUnsupported — a BMC that cannot report never yields "OK".
//
// IPMI (ipmitool, IPMI 2.0): "sdr elist" sensors whose status is cr/nr (lcr, ucr, lnr,
// unr) are Critical, nc (lnc, unc) Warning; "sel elist" records whose event is a
// critical one (IERR, uncorrectable ECC, power supply failure, critical or
// non-recoverable threshold crossings, ...; selCritical) or a warning one (selWarning)
// raise System while the last record for that sensor and event is an assertion: a SEL
// assertion that is never deasserted (IERR) stays until the SEL is cleared after the
// repair ("ipmitool sel clear"). Events: the sensors out of range (undated), then the
// SEL's Warning/Critical records, newest first. Chassis is HealthUnknown. A BMC that
// does not answer both reads is an error, and one whose SDR lists no sensor is
// ErrUnsupported.
//
// Errors are *OpError like every Controller method (op "health"); the read is
// idempotent and retried as such.
func (c *Controller) Health(ctx context.Context, t Target) (Health, error) {
	var h Health
	err := c.run(ctx, t, "health", true, func(ctx context.Context, d driver) error {
		got, err := d.health(ctx)
		h = got
		return err
	})
	if err != nil {
		return Health{}, err
	}
	return h, nil
}

// worse returns the more severe of a and b (Critical > Warning > OK > unknown).
func worse(a, b HealthState) HealthState {
	rank := map[HealthState]int{HealthUnknown: 0, HealthOK: 1, HealthWarning: 2, HealthCritical: 3}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

// sortEvents orders events newest first (undated last, in their given order) and keeps
// at most MaxHealthEvents.
func sortEvents(ev []HealthEvent) []HealthEvent {
	sort.SliceStable(ev, func(i, j int) bool {
		if ev[i].Time.IsZero() != ev[j].Time.IsZero() {
			return !ev[i].Time.IsZero()
		}
		return ev[i].Time.After(ev[j].Time)
	})
	if len(ev) > MaxHealthEvents {
		ev = ev[:MaxHealthEvents]
	}
	return ev
}

// ---- Redfish ----

// rfStatusDoc is what Health reads of a ComputerSystem or Chassis (DSP2046
// ComputerSystem.v1 / Chassis.v1): Status, Links.Chassis and LogServices.
type rfStatusDoc struct {
	Health, Rollup HealthState // "" when null or absent
	Chassis        []string    // Links.Chassis @odata.id, in order
	LogServices    string      // LogServices @odata.id, "" if none
}

// reported is whether the resource gave any health.
func (d rfStatusDoc) reported() bool { return d.Health != HealthUnknown || d.Rollup != HealthUnknown }

func parseRfHealth(what string, p *string) (HealthState, error) {
	if p == nil {
		return HealthUnknown, nil
	}
	switch h := HealthState(*p); h {
	case HealthOK, HealthWarning, HealthCritical:
		return h, nil
	}
	return "", fmt.Errorf("%w: %s %.40q is not OK, Warning or Critical", ErrBadAnswer, what, *p)
}

// odataRef is a Redfish reference object {"@odata.id": "/redfish/v1/..."}.
type odataRef struct {
	ID *string `json:"@odata.id"`
}

func (r *odataRef) path(what string) (string, error) {
	if r == nil || r.ID == nil {
		return "", fmt.Errorf("%w: %s without @odata.id", ErrBadAnswer, what)
	}
	p := *r.ID
	if !strings.HasPrefix(p, "/redfish/v1/") || strings.ContainsAny(p, "?# \t\r\n\\") || strings.Contains(p, "..") || len(p) > 512 {
		return "", fmt.Errorf("%w: %s reference %.60q is not a /redfish/v1/ path", ErrBadAnswer, what, p)
	}
	return p, nil
}

// parseRfStatusDoc strictly decodes the Status, Links.Chassis and LogServices of a
// ComputerSystem or Chassis document. Health values outside the Resource.Health enum,
// and references that are not /redfish/v1/ paths, are ErrBadAnswer.
func parseRfStatusDoc(r io.Reader) (rfStatusDoc, error) {
	var doc struct {
		Status *struct {
			Health       *string
			HealthRollup *string
		}
		Links *struct {
			Chassis []*odataRef
		}
		LogServices *odataRef
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return rfStatusDoc{}, fmt.Errorf("%w: Redfish JSON: %v", ErrBadAnswer, err)
	}
	var out rfStatusDoc
	var err error
	if doc.Status != nil {
		if out.Health, err = parseRfHealth("Status.Health", doc.Status.Health); err != nil {
			return rfStatusDoc{}, err
		}
		if out.Rollup, err = parseRfHealth("Status.HealthRollup", doc.Status.HealthRollup); err != nil {
			return rfStatusDoc{}, err
		}
	}
	if doc.Links != nil {
		for _, c := range doc.Links.Chassis {
			p, err := c.path("Links.Chassis")
			if err != nil {
				return rfStatusDoc{}, err
			}
			out.Chassis = append(out.Chassis, p)
		}
	}
	if doc.LogServices != nil {
		if out.LogServices, err = doc.LogServices.path("LogServices"); err != nil {
			return rfStatusDoc{}, err
		}
	}
	return out, nil
}

// parseRfCollection decodes a resource collection's Members references and its
// Members@odata.nextLink ("" on the last page).
func parseRfCollection(r io.Reader) (members []string, next string, err error) {
	var doc struct {
		Members  []*odataRef `json:"Members"`
		NextLink *string     `json:"Members@odata.nextLink"`
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return nil, "", fmt.Errorf("%w: Redfish collection JSON: %v", ErrBadAnswer, err)
	}
	for _, m := range doc.Members {
		p, err := m.path("collection member")
		if err != nil {
			return nil, "", err
		}
		members = append(members, p)
	}
	if doc.NextLink != nil {
		if next, err = parseNextLink(*doc.NextLink); err != nil {
			return nil, "", err
		}
	}
	return members, next, nil
}

// parseNextLink checks a Members@odata.nextLink: a /redfish/v1/ path, optionally with
// a query ($skip=, $skiptoken=).
func parseNextLink(s string) (string, error) {
	path, q, hasQ := strings.Cut(s, "?")
	p, err := (&odataRef{ID: &path}).path("Members@odata.nextLink")
	if err != nil {
		return "", err
	}
	if hasQ {
		if q == "" || strings.ContainsAny(q, "?# \t\r\n\\") || len(q) > 256 {
			return "", fmt.Errorf("%w: Members@odata.nextLink query %.60q", ErrBadAnswer, q)
		}
		p += "?" + q
	}
	return p, nil
}

// parseRfLogService decodes a LogService's Entries reference (DSP2046 LogService.v1).
func parseRfLogService(r io.Reader) (string, error) {
	var doc struct {
		Entries *odataRef
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return "", fmt.Errorf("%w: LogService JSON: %v", ErrBadAnswer, err)
	}
	if doc.Entries == nil {
		return "", nil
	}
	return doc.Entries.path("LogService.Entries")
}

// parseRfLogEntries decodes one page of a LogEntryCollection whose Members are
// expanded LogEntry objects (DSP2046 LogEntry.v1: Id, Severity, Created, Message). It
// returns the Warning and Critical entries, the references of members that were not
// expanded (only @odata.id), and the next page. Severity "OK" or absent entries are
// skipped; any other Severity, and a Created that is not RFC 3339, is ErrBadAnswer.
func parseRfLogEntries(r io.Reader) (events []HealthEvent, refs []string, next string, err error) {
	var doc struct {
		Members  []json.RawMessage `json:"Members"`
		NextLink *string           `json:"Members@odata.nextLink"`
	}
	if err := json.NewDecoder(r).Decode(&doc); err != nil {
		return nil, nil, "", fmt.Errorf("%w: LogEntryCollection JSON: %v", ErrBadAnswer, err)
	}
	for _, raw := range doc.Members {
		ev, ok, ref, err := parseRfLogEntry(raw)
		if err != nil {
			return nil, nil, "", err
		}
		if ref != "" {
			refs = append(refs, ref)
		} else if ok {
			events = append(events, ev)
		}
	}
	if doc.NextLink != nil {
		if next, err = parseNextLink(*doc.NextLink); err != nil {
			return nil, nil, "", err
		}
	}
	return events, refs, next, nil
}

// parseRfLogEntry decodes one LogEntry. ref is set (and ok false) when the object is
// only a reference; ok is false for entries that are not Warning or Critical.
func parseRfLogEntry(raw []byte) (ev HealthEvent, ok bool, ref string, err error) {
	var e struct {
		ODataID  *string `json:"@odata.id"`
		ID       *string `json:"Id"`
		Severity *string
		Created  *string
		Message  *string
	}
	if err := json.Unmarshal(raw, &e); err != nil {
		return HealthEvent{}, false, "", fmt.Errorf("%w: LogEntry JSON: %v", ErrBadAnswer, err)
	}
	if e.ID == nil && e.Severity == nil && e.Message == nil && e.Created == nil {
		p, err := (&odataRef{ID: e.ODataID}).path("LogEntry")
		return HealthEvent{}, false, p, err
	}
	sev, err := parseRfHealth("LogEntry.Severity", e.Severity)
	if err != nil || sev == HealthUnknown || sev == HealthOK {
		return HealthEvent{}, false, "", err
	}
	ev = HealthEvent{Source: "redfish", Severity: sev}
	if e.ID != nil {
		ev.ID = clip(*e.ID, 64)
	}
	if e.Message != nil {
		ev.Message = clip(*e.Message, 256)
	}
	if e.Created != nil && *e.Created != "" {
		t, err := time.Parse(time.RFC3339, *e.Created)
		if err != nil {
			return HealthEvent{}, false, "", fmt.Errorf("%w: LogEntry.Created %.40q is not RFC 3339", ErrBadAnswer, *e.Created)
		}
		ev.Time = t.UTC()
	}
	return ev, true, "", nil
}

// clip trims s to at most n bytes on a rune boundary and makes it one line.
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(strings.ToValidUTF8(s, "?")), " ")
	if len(s) > n {
		s = s[:n]
		for len(s) > 0 && !utf8ValidEnd(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

func utf8ValidEnd(s string) bool { return strings.ToValidUTF8(s, "\x00") == s }

// getDoc GETs a Redfish path with the driver's session and hands the body (bounded) to parse.
func (d *redfishDriver) getDoc(path string, parse func(io.Reader) error) error {
	resp, err := d.gf.Get(path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return parse(io.LimitReader(resp.Body, maxHealthDoc))
}

// isNotFound reports a Redfish 404 (or 405/501) answer: the resource is not offered.
func isNotFound(err error) bool {
	var ce *common.Error
	if errors.As(err, &ce) {
		switch ce.HTTPReturnedStatusCode {
		case 404, 405, 501:
			return true
		}
	}
	return false
}

func (d *redfishDriver) health(ctx context.Context) (Health, error) {
	sys, err := d.system(ctx)
	if err != nil {
		return Health{}, err
	}
	var sd rfStatusDoc
	if err := d.getDoc(sys.ODataID, func(r io.Reader) (e error) { sd, e = parseRfStatusDoc(r); return }); err != nil {
		return Health{}, err
	}
	if !sd.reported() {
		return Health{}, fmt.Errorf("%w: ComputerSystem %s reports no Status.Health or HealthRollup", ErrUnsupported, sys.ODataID)
	}
	h := Health{System: worse(sd.Health, sd.Rollup)}
	if len(sd.Chassis) > 0 {
		var cd rfStatusDoc
		if err := d.getDoc(sd.Chassis[0], func(r io.Reader) (e error) { cd, e = parseRfStatusDoc(r); return }); err != nil {
			return Health{}, err
		}
		h.Chassis = worse(cd.Health, cd.Rollup)
	}
	if sd.LogServices != "" {
		ev, err := d.logEvents(ctx, sd.LogServices)
		if err != nil {
			return Health{}, err
		}
		h.Events = sortEvents(ev)
	}
	return h, nil
}

// logEvents reads the Warning and Critical entries of up to maxLogServices log
// services. A LogServices collection or service the BMC answers 404 for counts as absent.
func (d *redfishDriver) logEvents(ctx context.Context, collPath string) ([]HealthEvent, error) {
	var services []string
	err := d.getDoc(collPath, func(r io.Reader) (e error) { services, _, e = parseRfCollection(r); return })
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if len(services) > maxLogServices {
		services = services[:maxLogServices]
	}
	var out []HealthEvent
	for _, sp := range services {
		var entries string
		err := d.getDoc(sp, func(r io.Reader) (e error) { entries, e = parseRfLogService(r); return })
		if isNotFound(err) || (err == nil && entries == "") {
			continue
		}
		if err != nil {
			return nil, err
		}
		page := entries
		var refs []string
		for i := 0; i < maxLogPages && page != ""; i++ {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			var ev []HealthEvent
			var pr []string
			var next string
			err := d.getDoc(page, func(r io.Reader) (e error) { ev, pr, next, e = parseRfLogEntries(r); return })
			if isNotFound(err) {
				break
			}
			if err != nil {
				return nil, err
			}
			out = append(out, ev...)
			refs = append(refs, pr...)
			page = next
		}
		// members served as references only: read the last (newest, by the usual
		// oldest-first order) few individually
		if len(refs) > MaxHealthEvents {
			refs = refs[len(refs)-MaxHealthEvents:]
		}
		for _, ref := range refs {
			var ev HealthEvent
			var ok bool
			err := d.getDoc(ref, func(r io.Reader) error {
				b, err := io.ReadAll(r)
				if err != nil {
					return err
				}
				var inner string
				ev, ok, inner, err = parseRfLogEntry(b)
				if err == nil && inner != "" {
					return fmt.Errorf("%w: LogEntry %s is only a reference", ErrBadAnswer, ref)
				}
				return err
			})
			if err != nil && !isNotFound(err) {
				return nil, err
			}
			if ok {
				out = append(out, ev)
			}
		}
	}
	return out, nil
}
