package client_test

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/api"
	"kiln/api/agentapi"
	"kiln/api/client"
	"kiln/appliance/lifecycle"
	"kiln/appliance/lifecycle/intake"
	"kiln/store"
	"kiln/store/storetest"
)

// Tokens of the test server, one per role.
const (
	adminTok    = "client-test-admin"
	operatorTok = "client-test-operator"
	viewerTok   = "client-test-viewer"
)

// backend is api.Backend over the real store and the real lifecycle
// controller, each method forwarding to the one that owns it (as
// appliance/adapters.go does; this package's tests may not import
// appliance).
type backend struct {
	st   *store.Store
	life *lifecycle.Controller
}

var _ api.Backend = backend{}

func (b backend) ListMachines(o store.ListOptions) ([]store.Machine, string, error) {
	return b.st.ListMachines(o)
}
func (b backend) GetMachine(id string) (store.Machine, error) { return b.st.GetMachine(id) }
func (b backend) PutMachine(ctx context.Context, m store.Machine, w store.W) (store.Machine, error) {
	return b.st.PutMachine(ctx, m, w)
}
func (b backend) ListSites() ([]store.Site, error) { return b.st.ListSites() }
func (b backend) PutSite(ctx context.Context, s store.Site, w store.W) (store.Site, error) {
	return b.st.PutSite(ctx, s, w)
}
func (b backend) ListRacks() ([]store.Rack, error) { return b.st.ListRacks() }
func (b backend) PutRack(ctx context.Context, r store.Rack, w store.W) (store.Rack, error) {
	return b.st.PutRack(ctx, r, w)
}
func (b backend) ListImages() ([]store.Image, error)           { return b.st.ListImages() }
func (b backend) GetImage(id string) (store.Image, error)      { return b.st.GetImage(id) }
func (b backend) ListJobs(machine string) ([]store.Job, error) { return b.st.ListJobs(machine) }
func (b backend) GetJob(id string) (store.Job, error)          { return b.st.GetJob(id) }
func (b backend) Events(after uint64, limit int) ([]store.Event, error) {
	return b.st.Events(after, limit)
}
func (b backend) WaitEvents(ctx context.Context, after uint64) error {
	return b.st.WaitEvents(ctx, after)
}
func (b backend) CountByState() (map[store.MachineState]int, error) { return b.st.CountByState() }
func (b backend) Health() api.Health {
	_, addr := b.st.Leader()
	return api.Health{Leader: addr, IsLeader: b.st.IsLeader(), Ready: b.st.Ready(), Version: "client-test"}
}
func (b backend) Import(ctx context.Context, r io.Reader, format string, w store.W) (intake.Result, error) {
	return b.life.Import(ctx, r, format, w)
}
func (b backend) Provision(ctx context.Context, id string, c store.Claim, w store.W) (store.Machine, error) {
	return b.life.Provision(ctx, id, c, w)
}
func (b backend) ClaimMachines(ctx context.Context, role string, labels map[string]string, n int, c store.Claim, w store.W) ([]store.Machine, error) {
	return b.life.ClaimMachines(ctx, role, labels, n, c, w)
}
func (b backend) Release(ctx context.Context, id string, w store.W) (store.Machine, error) {
	return b.life.Release(ctx, id, w)
}
func (b backend) Erase(ctx context.Context, id string, w store.W) (store.Machine, error) {
	return b.life.Erase(ctx, id, w)
}
func (b backend) Inspect(ctx context.Context, id string, w store.W) (store.Machine, error) {
	return b.life.Inspect(ctx, id, w)
}
func (b backend) EnrollBMC(ctx context.Context, id string, m store.BMC, pw string, w store.W) (store.BMC, error) {
	return b.life.EnrollBMC(ctx, id, m, pw, w)
}
func (b backend) UploadImage(ctx context.Context, meta store.Image, r io.Reader, w store.W) (store.Image, error) {
	return b.life.UploadImage(ctx, meta, r, w)
}
func (b backend) DeleteImage(ctx context.Context, id string, w store.W) error {
	return b.life.DeleteImage(ctx, id, w)
}
func (b backend) AgentRegister(ctx context.Context, id string, reg agentapi.Registration) (agentapi.Task, error) {
	return b.life.AgentRegister(ctx, id, reg)
}
func (b backend) AgentTask(ctx context.Context, id string) (agentapi.Task, error) {
	return b.life.AgentTask(ctx, id)
}
func (b backend) AgentReport(ctx context.Context, id string, rep agentapi.Report) error {
	return b.life.AgentReport(ctx, id, rep)
}
func (b backend) VerifyAgentToken(id, token string) bool { return b.life.VerifyAgentToken(id, token) }

// gcmSealer seals BMC passwords with AES-256-GCM under a random key.
type gcmSealer struct{ aead cipher.AEAD }

func (s gcmSealer) Seal(p []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return s.aead.Seal(nonce, nonce, p, nil), nil
}

// dirCatalog stores image files in a directory, hashing as it writes; a
// digest or size other than the declared one keeps nothing.
type dirCatalog struct{ dir string }

func (d dirCatalog) Upload(_ context.Context, name string, r io.Reader, want string, size int64) (lifecycle.CatalogEntry, error) {
	f, err := os.CreateTemp(d.dir, ".upload-*")
	if err != nil {
		return lifecycle.CatalogEntry{}, err
	}
	defer os.Remove(f.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return lifecycle.CatalogEntry{}, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if want != "" && sum != want {
		return lifecycle.CatalogEntry{}, fmt.Errorf("%w: sha256 %s, want %s", lifecycle.ErrDigest, sum, want)
	}
	if size >= 0 && n != size {
		return lifecycle.CatalogEntry{}, fmt.Errorf("%w: %d bytes, want %d", lifecycle.ErrImageSize, n, size)
	}
	if err := os.Rename(f.Name(), filepath.Join(d.dir, name)); err != nil {
		return lifecycle.CatalogEntry{}, err
	}
	return lifecycle.CatalogEntry{Name: name, Size: n, SHA256: sum}, nil
}

func (d dirCatalog) Delete(name string) error { return os.Remove(filepath.Join(d.dir, name)) }

// env is a real api.Server over the real store (storetest.NewLocal: the
// store's apply path, no raft) and the lifecycle controller, on an
// httptest listener.
type env struct {
	t    *testing.T
	st   *store.Store
	life *lifecycle.Controller
	url  string
	imgs string // the catalog's directory
}

func newEnv(t *testing.T) *env {
	t.Helper()
	st := storetest.NewLocal(t)
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	blk, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		t.Fatal(err)
	}
	imgs := t.TempDir()
	life, err := lifecycle.New(lifecycle.Config{ImageBaseURL: "http://127.0.0.1:1", Inspection: lifecycle.InspectManual,
		Sealer: gcmSealer{aead}, Catalog: dirCatalog{imgs}}, st, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Config{
		Tokens: []api.TokenSpec{
			{Name: "admin", Role: api.RoleAdmin, SHA256: api.HashToken(adminTok)},
			{Name: "operator", Role: api.RoleOperator, SHA256: api.HashToken(operatorTok)},
			{Name: "viewer", Role: api.RoleViewer, SHA256: api.HashToken(viewerTok)},
		},
		// The lifecycle's sentinels these tests meet; appliance/appliance.go
		// holds the appliance's whole table.
		ErrorClasses: []api.ErrorClass{
			{Err: lifecycle.ErrWrongState, Status: http.StatusConflict, Code: "wrong_state"},
			{Err: lifecycle.ErrInvalid, Status: http.StatusBadRequest, Code: "invalid"},
			{Err: lifecycle.ErrDigest, Status: http.StatusBadRequest, Code: "digest_mismatch"},
			{Err: lifecycle.ErrImageSize, Status: http.StatusBadRequest, Code: "size_mismatch"},
			{Err: lifecycle.ErrNotEnough, Status: http.StatusConflict, Code: "not_enough_machines"},
		},
	}, backend{st: st, life: life}, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &env{t: t, st: st, life: life, url: hs.URL, imgs: imgs}
}

// client returns a Client of the server with token.
func (e *env) client(token string) *client.Client {
	e.t.Helper()
	c, err := client.New(client.Config{Server: e.url, Token: token})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// machineIn writes a machine straight to the store and walks it through
// the lifecycle's transitions to state (test set-up: the store checks each
// transition, store.CanTransition).
func (e *env) machineIn(name, mac string, labels map[string]string, state store.MachineState) store.Machine {
	e.t.Helper()
	ctx := context.Background()
	m, err := e.st.PutMachine(ctx, store.Machine{Name: name, State: store.StateRegistered, Labels: labels,
		Intended: store.Hardware{NICs: []store.NIC{{MAC: mac}}}}, store.W{Actor: "test"})
	if err != nil {
		e.t.Fatal(err)
	}
	path := map[store.MachineState][]store.MachineState{
		store.StateAvailable:   {store.StateInspecting, store.StateAvailable},
		store.StateProvisioned: {store.StateInspecting, store.StateAvailable, store.StateProvisioning, store.StateProvisioned},
	}[state]
	for _, s := range path {
		m.State = s
		if m, err = e.st.PutMachine(ctx, m, store.W{Actor: "test"}); err != nil {
			e.t.Fatalf("%s → %s: %v", name, s, err)
		}
	}
	return m
}
