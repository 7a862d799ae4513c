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

// apiBackend is api.Backend: the domain (lifecycle.Service, which says
// who answers each call: the store's reads, the lifecycle controller's
// writes) plus Health, the one thing the appliance adds. Machines go to the
// wire as api view types, which have no boot-token field: nothing here
// needs to redact.
type apiBackend struct {
	*lifecycle.Service
	st      *store.Store  // Health and the cluster routes
	keys    *siteKeys     // site key rotation (sitekey.go); nil = none
	bk      *backupSource // GET /v1/backup (backup.go); nil = none
	images  *imageSync    // image presence in the site status (imagesync.go); nil = none
	env     *envCheck     // environment comparison in the site status (envcheck.go); nil = none
	version string
}

// NewAPIBackend returns the REST API's backend over the domain service svc
// and store st (for Health), reporting version: what appliance.New wires,
// exported for the tests of the API and of its clients.
func NewAPIBackend(svc *lifecycle.Service, st *store.Store, version string) api.Backend {
	return newAPIBackend(svc, st, nil, version)
}

func newAPIBackend(svc *lifecycle.Service, st *store.Store, keys *siteKeys, version string) *apiBackend {
	return &apiBackend{Service: svc, st: st, keys: keys, version: version}
}

// ImagePresence is api.ImagePresenceBackend: which node holds which image
// file (imageSync.ImagePresence); nil map and nil error without a replicator.
func (b *apiBackend) ImagePresence(ctx context.Context) (map[string][]string, error) {
	if b.images == nil {
		return nil, nil
	}
	return b.images.ImagePresence(ctx)
}

// EnvStatus is api.EnvBackend: the environment comparison (envcheck.go).
func (b *apiBackend) EnvStatus() (*api.EnvStatus, error) {
	if b.env == nil {
		return nil, nil
	}
	return b.env.EnvStatus()
}

// The cluster routes (api.ClusterBackend) are the store's own operations.

// CreateJoinToken is api.ClusterBackend: store.Store.CreateJoinToken.
func (b *apiBackend) CreateJoinToken(ctx context.Context, ttl time.Duration, w store.W) (string, store.JoinToken, error) {
	return b.st.CreateJoinToken(ctx, ttl, w)
}

// RotateCA is api.CABackend: store.Store.RotateCA.
func (b *apiBackend) RotateCA(ctx context.Context) (store.CARotation, error) {
	return b.st.RotateCA(ctx)
}

// Members is api.ClusterBackend: store.Store.Members.
func (b *apiBackend) Members() ([]store.ClusterMember, error) { return b.st.Members() }

// RemoveMember is api.ClusterBackend: store.Store.RemoveMember.
func (b *apiBackend) RemoveMember(ctx context.Context, id string, w store.W) error {
	return b.st.RemoveMember(ctx, id, w)
}

// Health reports raft leadership and readiness for /readyz and /v1/site/status.
func (b *apiBackend) Health() api.Health {
	_, leader := b.st.Leader()
	h := api.Health{
		Leader:   leader,
		IsLeader: b.st.IsLeader(),
		Ready:    b.st.Ready(),
		Stats:    b.st.Stats(),
		Version:  b.version,
	}
	if err := b.st.Halted(); err != nil {
		h.Halted = err.Error()
	}
	return h
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

// SealerFor is lifecycle.Sealer over the site key's sealer.
func SealerFor(s *bmc.Sealer) lifecycle.Sealer { return sealerAdapter{s} }

// CatalogFor is lifecycle.Catalog (and CatalogDeleter) over the boot
// HTTP server's image catalog.
func CatalogFor(c *httpboot.Catalog) lifecycle.Catalog { return catalogAdapter{c} }

type sealerAdapter struct{ s *bmc.Sealer }

func (a sealerAdapter) Seal(plain []byte) ([]byte, error) { return a.s.Seal(plain), nil }

// Open is lifecycle.Opener (issue 15: cluster and first-boot tokens).
func (a sealerAdapter) Open(sealed []byte) ([]byte, error) { return a.s.Open(sealed) }

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

// Inventory is lifecycle.BMCInventory: it asks the machine's BMC what it
// knows of the machine (Redfish ComputerSystem and EthernetInterfaces).
// lifecycle.ErrNoInventory where the BMC offers none (IPMI here).
func (a *bmcAdapter) Inventory(ctx context.Context, id string) (lifecycle.Inventory, error) {
	t, err := a.target(id)
	if err != nil {
		return lifecycle.Inventory{}, err
	}
	inv, err := a.ctl.Inventory(ctx, t)
	if errors.Is(err, bmc.ErrUnsupported) {
		return lifecycle.Inventory{}, fmt.Errorf("%w: %v", lifecycle.ErrNoInventory, err)
	}
	if err != nil {
		return lifecycle.Inventory{}, fmt.Errorf("bmc inventory (%s): %w", bmc.Reason(err), err)
	}
	return lifecycle.Inventory{Serial: inv.Serial, Manufacturer: inv.Manufacturer, Model: inv.Model, UUID: inv.UUID,
		NICMACs: inv.NICMACs}, nil
}

var (
	_ api.Backend        = (*apiBackend)(nil)
	_ api.ClusterBackend = (*apiBackend)(nil)
	_ api.SiteKeyBackend = (*apiBackend)(nil)
)

// Leases is api.LeaseBackend: this node's replica's address view.
func (b *apiBackend) Leases() (string, []store.Lease, error) {
	ls, err := b.st.AddressLeases()
	return b.st.NodeID(), ls, err
}
