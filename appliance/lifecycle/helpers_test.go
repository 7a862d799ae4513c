package lifecycle

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/api/agentapi"
	"kiln/deploy/lab/testkit"
	"kiln/store"
	"kiln/store/storetest"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// recBMC stands in for the lead's BMC adapter (kiln/bmc over Redfish/IPMI is
// exercised against ipmi_sim in package bmc): it records every call in
// order and fails the kinds listed in fail.
type recBMC struct {
	gate  chan struct{} // when set, every call waits for a receive or ctx end
	mu    sync.Mutex
	calls []string // "kind machineID"
	fail  map[string]error
}

func (b *recBMC) do(ctx context.Context, kind, id string) error {
	if b.gate != nil {
		select {
		case <-b.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, kind+" "+id)
	return b.fail[kind]
}
func (b *recBMC) setFail(kind string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail == nil {
		b.fail = map[string]error{}
	}
	if err == nil {
		delete(b.fail, kind)
	} else {
		b.fail[kind] = err
	}
}
func (b *recBMC) Calls() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.calls...)
}
func (b *recBMC) PowerOn(ctx context.Context, id string) error { return b.do(ctx, JobPowerOn, id) }
func (b *recBMC) PowerCycle(ctx context.Context, id string) error {
	return b.do(ctx, JobPowerCycle, id)
}
func (b *recBMC) PowerOff(ctx context.Context, id string) error { return b.do(ctx, JobPowerOff, id) }
func (b *recBMC) SetNextBootPXE(ctx context.Context, id string, _ store.BootMode) error {
	return b.do(ctx, JobBootPXE, id)
}

// gcmSealer is a real AES-256-GCM sealer (nonce || ciphertext).
type gcmSealer struct{ aead cipher.AEAD }

func newSealer(t *testing.T) *gcmSealer {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	blk, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	a, err := cipher.NewGCM(blk)
	if err != nil {
		t.Fatal(err)
	}
	return &gcmSealer{a}
}

func (s *gcmSealer) Seal(p []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return s.aead.Seal(nonce, nonce, p, nil), nil
}

func (s *gcmSealer) Open(b []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	return s.aead.Open(nil, b[:n], b[n:], nil)
}

// dirCatalog is a real on-disk catalog: streams into a temp file while
// hashing, checks the digest, renames into place.
type dirCatalog struct{ dir string }

func (d dirCatalog) Upload(_ context.Context, name string, r io.Reader, want string, size int64) (CatalogEntry, error) {
	f, err := os.CreateTemp(d.dir, ".upload-*")
	if err != nil {
		return CatalogEntry{}, err
	}
	defer os.Remove(f.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return CatalogEntry{}, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if want != "" && sum != want {
		return CatalogEntry{}, fmt.Errorf("digest %s, want %s", sum, want)
	}
	if size >= 0 && n != size {
		return CatalogEntry{}, fmt.Errorf("size %d, want %d", n, size)
	}
	if err := os.Rename(f.Name(), filepath.Join(d.dir, name)); err != nil {
		return CatalogEntry{}, err
	}
	return CatalogEntry{Name: name, Size: n, SHA256: sum}, nil
}

var _ CatalogDeleter = dirCatalog{}

func (d dirCatalog) Delete(name string) error {
	return os.Remove(filepath.Join(d.dir, name))
}

type harness struct {
	t   *testing.T
	c   *Controller
	st  Store
	bmc *recBMC
	clk *clock
	reg *prometheus.Registry
}

func newHarness(t *testing.T, st Store, mod func(*Config)) *harness {
	t.Helper()
	clk := &clock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	b := &recBMC{}
	cfg := Config{
		ImageBaseURL: "http://10.99.0.1:8080/",
		Interval:     20 * time.Millisecond,
		Workers:      2,
		Now:          clk.Now,
		Sealer:       newSealer(t),
		Catalog:      dirCatalog{t.TempDir()},
	}
	if mod != nil {
		mod(&cfg)
	}
	reg := prometheus.NewRegistry()
	c, err := New(cfg, st, b, reg)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, c: c, st: st, bmc: b, clk: clk, reg: reg}
}

// run starts the controller's loop until the test ends.
func (h *harness) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.c.Run(ctx, nil) }()
	h.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			h.t.Errorf("Run: %v", err)
		}
	})
}

// waitState polls until machine id is in state (or fails the test after 10 s).
func (h *harness) waitState(id string, s store.MachineState) store.Machine {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := h.st.GetMachine(id)
		if err == nil && m.State == s {
			return m
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("machine %s: state %s (err %v), want %s", id, m.State, err, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *harness) get(id string) store.Machine {
	h.t.Helper()
	m, err := h.st.GetMachine(id)
	if err != nil {
		h.t.Fatal(err)
	}
	return m
}

func (h *harness) mustState(id string, s store.MachineState) store.Machine {
	h.t.Helper()
	m := h.get(id)
	if m.State != s {
		h.t.Fatalf("machine %s: state %s (reason %q, %q), want %s", id, m.State, m.Reason, m.Message, s)
	}
	return m
}

// image records an image directly (tests that do not exercise UploadImage).
func (h *harness) image(name string) store.Image {
	h.t.Helper()
	im, err := h.st.PutImage(context.Background(), store.Image{Name: name, Version: "1", Format: "raw",
		SHA256: hex.EncodeToString(make([]byte, 32)), Size: 1 << 20}, store.W{Actor: "test"})
	if err != nil {
		h.t.Fatal(err)
	}
	return im
}

// inventory is what an agent on hardware matching m's intent reports.
func inventory(m store.Machine) agentapi.Inventory {
	inv := agentapi.Inventory{Serial: m.Intended.Serial, Vendor: m.Intended.Vendor, Product: m.Intended.Model,
		CPUs: m.Intended.CPUs, MemoryBytes: m.Intended.MemoryBytes - m.Intended.MemoryBytes/50}
	for i, d := range m.Intended.Disks {
		inv.Disks = append(inv.Disks, agentapi.Disk{Name: fmt.Sprintf("sd%c", 'a'+i), SizeBytes: d.SizeBytes, Health: "ok",
			Serial: fmt.Sprintf("DISK-%s-%d", m.Intended.Serial, i)})
	}
	for i, n := range m.Intended.NICs {
		inv.NICs = append(inv.NICs, agentapi.NIC{Name: fmt.Sprintf("eth%d", i), MAC: n.MAC, LinkUp: true})
	}
	return inv
}

// newStore is the store of these tests: the real one, local
// (storetest.NewLocal: the store's own apply path over a bbolt file in a
// temp dir, no raft), closed when the test ends.
func newStore(t testing.TB) *store.Store { return storetest.NewLocal(t) }

// leaderFlag is the real store with IsLeader overridden, so a test can show
// the controller a store that is not the leader (writes still go to the
// store, as they would be forwarded).
type leaderFlag struct {
	*store.Store
	follower atomic.Bool
}

func (l *leaderFlag) IsLeader() bool      { return !l.follower.Load() && l.Store.IsLeader() }
func (l *leaderFlag) setLeader(lead bool) { l.follower.Store(!lead) }

// allEvents returns every event s holds, oldest first.
func allEvents(t testing.TB, s *store.Store) []store.Event {
	t.Helper()
	return eventsAfter(t, s, 0)
}

// eventsAfter returns every event of s with Index > after, oldest first.
func eventsAfter(t testing.TB, s *store.Store, after uint64) []store.Event {
	t.Helper()
	var out []store.Event
	for {
		page, err := s.Events(after, 0)
		must(t, err)
		if len(page) == 0 {
			return out
		}
		out = append(out, page...)
		after = page[len(page)-1].Index
	}
}

// allJobs returns every job s holds in the order they were created (by the
// index of each job's first event; job IDs are random).
func allJobs(t testing.TB, s *store.Store) []store.Job {
	t.Helper()
	jobs, err := s.ListJobs("")
	must(t, err)
	first := map[string]uint64{}
	for _, ev := range allEvents(t, s) {
		if id, ok := strings.CutPrefix(ev.Subject, "job/"); ok {
			if _, seen := first[id]; !seen {
				first[id] = ev.Index
			}
		}
	}
	sort.SliceStable(jobs, func(i, j int) bool { return first[jobs[i].ID] < first[jobs[j].ID] })
	return jobs
}

// seed stores m (created registered) and moves it to state through legal
// transitions (pathTo): set-up under the real store's rules.
func seed(t testing.TB, s *store.Store, m store.Machine, state store.MachineState) store.Machine {
	t.Helper()
	m.State = ""
	out, err := s.PutMachine(bg, m, store.W{Actor: "test", Reason: "setup"})
	must(t, err)
	for _, st := range pathTo(state) {
		out.State = st
		out, err = s.PutMachine(bg, out, store.W{Actor: "test", Reason: "setup"})
		must(t, err)
	}
	return out
}

// openRealStore opens a single-node bbolt+raft store in a temp dir and waits
// until it leads.
func openRealStore(t testing.TB) *store.Store {
	t.Helper()
	cfg := storetest.Config("n1", t.TempDir())
	cfg.Bootstrap = true
	s, err := store.Open(cfg, storetest.Logger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, storetest.Logger()) }()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = s.Close()
	})
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := s.WaitLeader(wctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func isIllegal(err error, from, to store.MachineState) bool {
	var ite *store.IllegalTransitionError
	return errors.As(err, &ite) && ite.From == from && ite.To == to
}

// metric returns the value of the series of name with the given label
// pairs (testkit.Sample: gauge, counter, or a histogram's count).
func (h *harness) metric(name string, labels ...string) float64 {
	h.t.Helper()
	return testkit.Sample(h.t, h.reg, name, labels...)
}

// series counts the series of metric name.
func (h *harness) series(name string) int {
	h.t.Helper()
	return testkit.Series(h.t, h.reg, name)
}
