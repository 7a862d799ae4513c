// The operator's intended fields of a machine record: CreateMachine and
// UpdateIntended, checked by package rules (rules.CheckIntended).

package lifecycle

import (
	"context"
	"fmt"

	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// Machine records are written by this package only (top-level DESIGN.md,
// appliance/lifecycle/DESIGN.md "Writers of machine records"): the
// operator's intended fields here (CreateMachine, UpdateIntended),
// discovery in discovery.go, the BMC inventory after an enrollment in
// bmcenroll.go, imports in import.go, everything else through update
// (update.go). Each path applies the rules of package rules.

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
