package appliance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"kiln/api"
	"kiln/appliance/lifecycle"
	"kiln/bmc"
	"kiln/httpboot"
	"kiln/store"
)

// apiBackend is api.Backend: store reads and the lifecycle's operations.
type apiBackend struct {
	*store.Store
	*lifecycle.Controller
	bmc     *bmcAdapter // reads BMC inventory after an enrollment; nil = none
	keys    *siteKeys   // site key rotation (sitekey.go)
	version string
}

// DeleteImage goes through the lifecycle (it also removes the catalog file).
func (b *apiBackend) DeleteImage(ctx context.Context, id string, w store.W) error {
	return b.Controller.DeleteImage(ctx, id, w)
}

// Health reports raft leadership and readiness for /readyz and /v1/site/status.
func (b *apiBackend) Health() api.Health {
	_, leader := b.Store.Leader()
	return api.Health{
		Leader:   leader,
		IsLeader: b.Store.IsLeader(),
		Ready:    b.Store.Ready(),
		Stats:    b.Store.Stats(),
		Version:  b.version,
	}
}

// bootBackend is httpboot.Backend over the lifecycle controller, which issues
// per-boot tokens and applies the netboot policy.
type bootBackend struct{ life *lifecycle.Controller }

func (b *bootBackend) BootFor(ctx context.Context, mac net.HardwareAddr) (httpboot.Boot, error) {
	d, err := b.life.BootFor(ctx, strings.ToLower(mac.String()))
	if err != nil {
		if errors.Is(err, lifecycle.ErrAgentActive) {
			// Never displace a running agent; the machine retries shortly.
			return httpboot.Boot{}, fmt.Errorf("%w: %v", httpboot.ErrRetryLater, err)
		}
		return httpboot.Boot{}, err
	}
	return httpboot.Boot{Action: d.Action, MachineID: d.MachineID, Token: d.Token}, nil
}

type sealerAdapter struct{ s *bmc.Sealer }

func (a sealerAdapter) Seal(plain []byte) ([]byte, error) { return a.s.Seal(plain), nil }

type catalogAdapter struct{ c *httpboot.Catalog }

func (a catalogAdapter) Upload(ctx context.Context, name string, r io.Reader, want string, size int64) (lifecycle.CatalogEntry, error) {
	e, err := a.c.Upload(ctx, name, r, want, size)
	if err != nil {
		return lifecycle.CatalogEntry{}, err
	}
	return lifecycle.CatalogEntry{Name: e.Name, Size: e.Size, SHA256: e.SHA256}, nil
}

func (a catalogAdapter) Delete(name string) error { return a.c.Delete(name) }

// bmcAdapter is lifecycle.BMC: it finds a machine's BMC record, opens the
// sealed credential with the site key and calls kiln/bmc. Credentials live
// only in the Target for the duration of a call.
type bmcAdapter struct {
	st     *store.Store
	sealer *bmc.Sealer
	ctl    *bmc.Controller
}

// ErrNoBMC is returned for a machine with no enrolled BMC.
var ErrNoBMC = errors.New("machine has no BMC enrolled (kiln bmc enroll)")

func (a *bmcAdapter) target(machineID string) (bmc.Target, error) {
	m, err := a.st.GetMachine(machineID)
	if err != nil {
		return bmc.Target{}, err
	}
	if m.BMC == "" {
		return bmc.Target{}, ErrNoBMC
	}
	rec, err := a.st.GetBMC(m.BMC)
	if err != nil {
		return bmc.Target{}, fmt.Errorf("bmc %s: %w", m.BMC, err)
	}
	t := bmc.Target{Address: rec.Address, Driver: rec.Driver, Username: rec.Username, InsecureTLS: rec.InsecureTLS}
	if rec.CACertPEM != "" {
		t.CACertPEM = []byte(rec.CACertPEM)
	}
	if rec.CredentialRef != "" {
		sealed, err := a.st.Secret(rec.CredentialRef)
		if err != nil {
			return bmc.Target{}, fmt.Errorf("bmc %s credential: %w", m.BMC, err)
		}
		pw, err := a.sealer.Open(sealed)
		if err != nil {
			return bmc.Target{}, fmt.Errorf("bmc %s credential cannot be opened with the site key: %w", m.BMC, err)
		}
		t.Password = string(pw)
	}
	return t, nil
}

func (a *bmcAdapter) PowerOn(ctx context.Context, id string) error {
	t, err := a.target(id)
	if err != nil {
		return err
	}
	return a.ctl.Power(ctx, t, bmc.ActionOn)
}

func (a *bmcAdapter) PowerOff(ctx context.Context, id string) error {
	t, err := a.target(id)
	if err != nil {
		return err
	}
	return a.ctl.Power(ctx, t, bmc.ActionOff)
}

// PowerCycle resets a machine that is on and powers on one that is off.
func (a *bmcAdapter) PowerCycle(ctx context.Context, id string) error {
	t, err := a.target(id)
	if err != nil {
		return err
	}
	st, err := a.ctl.PowerState(ctx, t)
	if err != nil {
		return err
	}
	if st == bmc.PowerOff {
		return a.ctl.Power(ctx, t, bmc.ActionOn)
	}
	return a.ctl.Power(ctx, t, bmc.ActionCycle)
}

func (a *bmcAdapter) SetNextBootPXE(ctx context.Context, id string, mode store.BootMode) error {
	t, err := a.target(id)
	if err != nil {
		return err
	}
	m := bmc.BootUEFI
	if mode == store.BootModeLegacy {
		m = bmc.BootLegacy
	}
	return a.ctl.SetNextBootPXE(ctx, t, m)
}

// The API never shows a machine's boot-token hash: it is a credential's
// digest, of no use to an operator. These wrappers clear it on every path
// that returns machines to the API.
func redact(m store.Machine) store.Machine { m.BootTokenHash = ""; return m }

func redactAll(ms []store.Machine, err error) ([]store.Machine, error) {
	for i := range ms {
		ms[i] = redact(ms[i])
	}
	return ms, err
}

func (b *apiBackend) GetMachine(id string) (store.Machine, error) {
	m, err := b.Store.GetMachine(id)
	return redact(m), err
}

func (b *apiBackend) ListMachines(opt store.ListOptions) ([]store.Machine, string, error) {
	ms, next, err := b.Store.ListMachines(opt)
	ms, err = redactAll(ms, err)
	return ms, next, err
}

// PutMachine keeps the stored boot-token hash: the API read the machine
// redacted, so an update would otherwise clear a running agent's token. With
// the resource version the API always sends, the record read here is the one
// being replaced.
func (b *apiBackend) PutMachine(ctx context.Context, m store.Machine, w store.W) (store.Machine, error) {
	if m.ID != "" && m.BootTokenHash == "" {
		if cur, err := b.Store.GetMachine(m.ID); err == nil && (m.ResourceVersion == 0 || cur.ResourceVersion == m.ResourceVersion) {
			m.BootTokenHash = cur.BootTokenHash
		}
	}
	m, err := b.Store.PutMachine(ctx, m, w)
	return redact(m), err
}

func (b *apiBackend) Provision(ctx context.Context, id string, c store.Claim, w store.W) (store.Machine, error) {
	m, err := b.Controller.Provision(ctx, id, c, w)
	return redact(m), err
}

func (b *apiBackend) ClaimMachines(ctx context.Context, role string, labels map[string]string, n int, c store.Claim, w store.W) ([]store.Machine, error) {
	return redactAll(b.Controller.ClaimMachines(ctx, role, labels, n, c, w))
}

func (b *apiBackend) Release(ctx context.Context, id string, w store.W) (store.Machine, error) {
	m, err := b.Controller.Release(ctx, id, w)
	return redact(m), err
}

func (b *apiBackend) Erase(ctx context.Context, id string, w store.W) (store.Machine, error) {
	m, err := b.Controller.Erase(ctx, id, w)
	return redact(m), err
}

func (b *apiBackend) Inspect(ctx context.Context, id string, w store.W) (store.Machine, error) {
	m, err := b.Controller.Inspect(ctx, id, w)
	return redact(m), err
}

// Inventory asks the machine's BMC what it knows of the machine (Redfish
// ComputerSystem and EthernetInterfaces). bmc.ErrUnsupported where the BMC
// offers none (IPMI here).
func (a *bmcAdapter) Inventory(ctx context.Context, id string) (bmc.Inventory, error) {
	t, err := a.target(id)
	if err != nil {
		return bmc.Inventory{}, err
	}
	return a.ctl.Inventory(ctx, t)
}

// bmcInventoryTimeout bounds the inventory read that follows an enrollment.
const bmcInventoryTimeout = 15 * time.Second

// EnrollBMC enrolls the BMC, then reads the BMC's inventory (serial, vendor,
// model, UUID, NIC MACs) into the machine's discovered fields, so the site
// team sees what stands in the slot before it ever boots. The agent's
// inspection later replaces them with its fuller report. An inventory that
// fails is recorded as an event and does not undo the enrollment.
func (b *apiBackend) EnrollBMC(ctx context.Context, machineID string, rec store.BMC, password string, w store.W) (store.BMC, error) {
	out, err := b.Controller.EnrollBMC(ctx, machineID, rec, password, w)
	if err != nil || b.bmc == nil {
		return out, err
	}
	ictx, cancel := context.WithTimeout(ctx, bmcInventoryTimeout)
	defer cancel()
	inv, ierr := b.bmc.Inventory(ictx, machineID)
	switch {
	case errors.Is(ierr, bmc.ErrUnsupported):
		return out, nil
	case ierr != nil:
		_ = b.Store.AppendEvents(ctx, []store.Event{{Subject: "machine/" + machineID, Kind: "bmc_inventory",
			To: "failed", Actor: w.Actor, Reason: bmc.Reason(ierr), Message: ierr.Error()}})
		return out, nil
	}
	for attempt := 0; attempt < 3; attempt++ {
		m, err := b.Store.GetMachine(machineID)
		if err != nil {
			return out, nil
		}
		mergeBMCInventory(&m, inv)
		if _, err = b.Store.PutMachine(ctx, m, store.W{Actor: "bmc", Reason: "bmc_inventory"}); !errors.Is(err, store.ErrConflict) {
			return out, nil
		}
	}
	return out, nil
}

// mergeBMCInventory fills m.Discovered from a BMC's inventory where the BMC
// offered a value; NICs it lists are added if not already known.
func mergeBMCInventory(m *store.Machine, inv bmc.Inventory) {
	if m.Discovered == nil {
		m.Discovered = &store.Hardware{}
	}
	d := m.Discovered
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&d.Serial, inv.Serial)
	set(&d.Vendor, inv.Manufacturer)
	set(&d.Model, inv.Model)
	set(&d.UUID, inv.UUID)
	for _, mac := range inv.NICMACs {
		known := false
		for _, n := range d.NICs {
			if strings.EqualFold(n.MAC, mac) {
				known = true
				break
			}
		}
		if !known {
			d.NICs = append(d.NICs, store.NIC{MAC: strings.ToLower(mac)})
		}
	}
}
