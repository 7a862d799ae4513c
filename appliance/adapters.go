package appliance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

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
		if errors.Is(err, store.ErrNotFound) {
			return httpboot.Boot{}, fmt.Errorf("%w: %v", httpboot.ErrUnknownMachine, err)
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
