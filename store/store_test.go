package store_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/store"
	"kiln/store/storetest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// openSingle opens a bootstrapped single node in dir, runs it, and returns
// it with a stop function (also registered with t.Cleanup).
func openSingle(t *testing.T, dir string, reg *prometheus.Registry, mod ...func(*store.Config)) (*store.Store, func()) {
	t.Helper()
	cfg := storetest.Config("solo", dir)
	cfg.Bootstrap = true
	for _, m := range mod {
		m(&cfg)
	}
	s, err := store.Open(cfg, storetest.Logger(), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, storetest.Logger()) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	t.Cleanup(stop)
	if err := s.WaitLeader(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return s, stop
}

// eachStore runs f as two subtests: on a bootstrapped single raft node
// ("raft", with reg registered) and on a local store ("local",
// storetest.NewLocal, no metrics, reg nil). Both apply writes through the
// same FSM, so tests of records, CAS, transitions and events must pass on
// both alike.
func eachStore(t *testing.T, f func(t *testing.T, s *store.Store, reg *prometheus.Registry)) {
	t.Run("raft", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		s, _ := openSingle(t, t.TempDir(), reg)
		f(t, s, reg)
	})
	t.Run("local", func(t *testing.T) { f(t, storetest.NewLocal(t), nil) })
}

func mac(i int) string { return fmt.Sprintf("02:00:00:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff) }

func TestSingleNodeAPI(t *testing.T) { eachStore(t, testSingleNodeAPI) }

func testSingleNodeAPI(t *testing.T, s *store.Store, reg *prometheus.Registry) {
	ctx := ctxT(t)
	w := store.W{Actor: "test", Reason: "intake"}

	if !waitTrue(5*time.Second, s.Ready) {
		t.Fatal("single node never Ready")
	}
	m, err := s.PutMachine(ctx, store.Machine{Rack: "r1", Labels: map[string]string{"pool": "a"},
		Intended: store.Hardware{NICs: []store.NIC{{MAC: "02:AA:BB:CC:DD:EE"}}}}, w)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.ID, "m-") || len(m.ID) != 18 || m.ResourceVersion == 0 || m.State != store.StateRegistered || m.CreatedAt.IsZero() {
		t.Fatalf("created %+v", m.Meta)
	}
	byMAC, err := s.MachineByMAC("02-aa-bb-cc-dd-ee")
	if err != nil || byMAC.ID != m.ID {
		t.Fatalf("MachineByMAC: %v %v", byMAC.ID, err)
	}
	if _, err := s.MachineByMAC("02:00:00:00:00:99"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing MAC: %v", err)
	}
	// CAS: stale version conflicts, current version wins; transition event.
	stale := m
	m.State = store.StateInspecting
	m2, err := s.PutMachine(ctx, m, store.W{Actor: "ctl", Reason: "pxe_seen"})
	if err != nil {
		t.Fatal(err)
	}
	stale.Name = "late"
	if _, err := s.PutMachine(ctx, stale, w); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale update: %v", err)
	}
	m2.State = store.StateProvisioned
	var ite *store.IllegalTransitionError
	if _, err := s.PutMachine(ctx, m2, w); !errors.As(err, &ite) || ite.From != store.StateInspecting {
		t.Fatalf("illegal transition: %v", err)
	}
	// Bulk intake: one command, then list by state with paging.
	var batch []store.Machine
	for i := 0; i < 250; i++ {
		batch = append(batch, store.Machine{Meta: store.Meta{ID: fmt.Sprintf("b-%04d", i)}, Rack: fmt.Sprintf("r%d", i%5),
			Intended: store.Hardware{NICs: []store.NIC{{MAC: mac(i)}}}})
	}
	before := s.Stats()["last_log_index"]
	if _, err := s.PutMachines(ctx, batch, w); err != nil {
		t.Fatal(err)
	}
	if after := s.Stats()["last_log_index"]; after != fmt.Sprint(mustAtoi(t, before)+1) {
		t.Fatalf("PutMachines used %s→%s log entries, want one", before, after)
	}
	var all []store.Machine
	cursor := ""
	for {
		page, next, err := s.ListMachines(store.ListOptions{State: store.StateRegistered, After: cursor, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if next == "" {
			break
		}
		cursor = next
	}
	if len(all) != 250 || all[0].ID != "b-0000" || all[249].ID != "b-0249" {
		t.Fatalf("paged list: %d items", len(all))
	}
	r2, _, _ := s.ListMachines(store.ListOptions{Rack: "r2"})
	if len(r2) != 50 {
		t.Fatalf("rack filter: %d", len(r2))
	}
	lab, _, _ := s.ListMachines(store.ListOptions{Labels: map[string]string{"pool": "a"}})
	if len(lab) != 1 || lab[0].ID != m.ID {
		t.Fatalf("label filter: %v", lab)
	}
	counts, _ := s.CountByState()
	if counts[store.StateRegistered] != 250 || counts[store.StateInspecting] != 1 {
		t.Fatalf("counts %v", counts)
	}
	// Other records.
	img, err := s.PutImage(ctx, store.Image{Name: "flatcar", Version: "1", SHA256: "ab"}, w)
	if err != nil || !strings.HasPrefix(img.ID, "img-") {
		t.Fatalf("image %v %v", img.ID, err)
	}
	if l, _ := s.ListImages(); len(l) != 1 {
		t.Fatal("ListImages")
	}
	if err := s.DeleteImage(ctx, img.ID, w); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetImage(img.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted image: %v", err)
	}
	j, err := s.PutJob(ctx, store.Job{Machine: m.ID, Kind: "power_on", State: "pending"}, w)
	if err != nil {
		t.Fatal(err)
	}
	if js, _ := s.ListJobs(m.ID); len(js) != 1 || js[0].ID != j.ID {
		t.Fatalf("ListJobs %v", js)
	}
	if err := s.PutSecret(ctx, "bmc/x", []byte{1, 2, 3}, w); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Secret("bmc/x"); err != nil || len(v) != 3 {
		t.Fatalf("secret %v %v", v, err)
	}
	site, _ := s.PutSite(ctx, store.Site{Name: "hall-1"}, w)
	rack, _ := s.PutRack(ctx, store.Rack{Site: site.ID, Name: "A1"}, w)
	bmc, _ := s.PutBMC(ctx, store.BMC{Address: "10.0.0.1", Driver: "redfish"}, w)
	if _, err := s.GetRack(rack.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetBMC(bmc.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.PutLeases(ctx, []store.Lease{{MAC: "02:00:00:00:00:01", IP: "10.1.0.2", State: "bound", Expiry: time.Now().Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	if l, err := s.Lease("02:00:00:00:00:01"); err != nil || l.IP != "10.1.0.2" {
		t.Fatalf("lease %v %v", l, err)
	}
	if err := s.DeleteMachine(ctx, "b-0000", w); err != nil {
		t.Fatal(err)
	}

	// Events: paging by cursor and WaitEvents wake-up.
	evs, err := s.Events(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var transition *store.Event
	for i := range evs {
		if evs[i].Kind == "transition" {
			transition = &evs[i]
		}
	}
	if transition == nil || transition.From != "registered" || transition.To != "inspecting" || transition.Actor != "ctl" || transition.Reason != "pxe_seen" {
		t.Fatalf("transition event %+v", transition)
	}
	last := s.LastEventIndex()
	if evs[len(evs)-1].Index != last {
		t.Fatalf("last event %d, LastEventIndex %d", evs[len(evs)-1].Index, last)
	}
	page, _ := s.Events(0, 10)
	if len(page) < 10 {
		t.Fatalf("page of %d", len(page))
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if err := s.WaitEvents(wctx, last); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitEvents returned early: %v", err)
	}
	cancel()
	woke := make(chan error, 1)
	go func() { woke <- s.WaitEvents(ctx, last) }()
	time.Sleep(20 * time.Millisecond)
	if err := s.AppendEvents(ctx, []store.Event{{Subject: "machine/" + m.ID, Kind: "step", Message: "write 50%"}}); err != nil {
		t.Fatal(err)
	}
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Events(last, 0); len(e) != 1 || e[0].Kind != "step" || e[0].Time.IsZero() {
		t.Fatalf("events after cursor: %+v", e)
	}
	if err := s.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if reg == nil {
		return // a local store has no metrics
	}
	// Metrics exist under kiln_store_*.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"kiln_store_raft_state", "kiln_store_applied_index", "kiln_store_last_index",
		"kiln_store_commit_seconds", "kiln_store_apply_errors_total", "kiln_store_commands_total"} {
		if !names[n] {
			t.Errorf("metric %s missing (have %v)", n, names)
		}
	}
}

func mustAtoi(t *testing.T, s string) int {
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitTrue(d time.Duration, f func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if f() {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// TestRestartRebuildsFromSnapshotAndLog: data written before a snapshot and
// after it both survive a restart (fsm.db is rebuilt from snapshot + log).
func TestRestartRebuildsFromSnapshotAndLog(t *testing.T) {
	dir := t.TempDir()
	s, stop := openSingle(t, dir, nil)
	ctx := ctxT(t)
	nicOf := func(i int) store.Hardware {
		return store.Hardware{NICs: []store.NIC{{MAC: fmt.Sprintf("02:00:00:00:01:%02x", i)}}}
	}
	for i := 0; i < 20; i++ {
		if _, err := s.PutMachine(ctx, store.Machine{Meta: store.Meta{ID: fmt.Sprintf("m-%02d", i)}, Intended: nicOf(i)}, store.W{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Snapshot(); err != nil {
		t.Fatal(err)
	}
	for i := 20; i < 30; i++ {
		if _, err := s.PutMachine(ctx, store.Machine{Meta: store.Meta{ID: fmt.Sprintf("m-%02d", i)}, Intended: nicOf(i)}, store.W{}); err != nil {
			t.Fatal(err)
		}
	}
	lastEv := s.LastEventIndex()
	stop()
	s2, _ := openSingle(t, dir, nil)
	if !waitTrue(10*time.Second, s2.Ready) {
		t.Fatal("not ready after restart")
	}
	items, _, err := s2.ListMachines(store.ListOptions{})
	if err != nil || len(items) != 30 {
		t.Fatalf("after restart: %d machines, %v", len(items), err)
	}
	// The in-memory machine indexes are rebuilt from the snapshot (machines
	// 0-19) and the replayed log (20-29).
	for _, i := range []int{3, 25} {
		if m, err := s2.MachineByMAC(fmt.Sprintf("02:00:00:00:01:%02x", i)); err != nil || m.ID != fmt.Sprintf("m-%02d", i) {
			t.Fatalf("MachineByMAC after restart: %q %v", m.ID, err)
		}
	}
	if reg, _, err := s2.ListMachines(store.ListOptions{State: store.StateRegistered}); err != nil || len(reg) != 30 {
		t.Fatalf("by state after restart: %d, %v", len(reg), err)
	}
	if counts, _ := s2.CountByState(); counts[store.StateRegistered] != 30 {
		t.Fatalf("counts after restart: %v", counts)
	}
	// Every event written before the stop is back (the restarted leader may
	// add a node_registered event: its forward port is new).
	evs, _ := s2.Events(0, 10000)
	n := 0
	for _, ev := range evs {
		if ev.Index <= lastEv {
			n++
		}
	}
	if n != 31 || s2.LastEventIndex() < lastEv { // 30 created + 1 node_registered
		t.Fatalf("%d events up to index %d after restart, want 31", n, lastEv)
	}
}

// TestCorruptFiles: a truncated or garbled raft.db or fsm.db stops Open
// with an error wrapping ErrCorrupt that names the file; no panic, no reset.
func TestCorruptFiles(t *testing.T) {
	base := t.TempDir()
	s, stop := openSingle(t, base, nil)
	for i := 0; i < 50; i++ {
		if _, err := s.PutMachine(ctxT(t), store.Machine{Labels: map[string]string{"pad": strings.Repeat("x", 2000)}}, store.W{}); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	orig := map[string][]byte{}
	for _, f := range []string{store.RaftDBFile, store.FSMDBFile} {
		b, err := os.ReadFile(filepath.Join(base, f))
		if err != nil {
			t.Fatal(err)
		}
		orig[f] = b
	}
	damage := map[string]func([]byte) []byte{
		"truncated-half": func(b []byte) []byte { return b[:len(b)/2] },
		"truncated-zero": func(b []byte) []byte { return nil },
		"truncated-1k":   func(b []byte) []byte { return b[:1000] },
		"garbled-meta": func(b []byte) []byte {
			c := append([]byte{}, b...)
			for i := 0; i < 8192 && i < len(c); i++ { // both meta pages
				c[i] ^= 0x5a
			}
			return c
		},
		"garbled-root-page": func(b []byte) []byte {
			// bbolt meta: page header 16 B, root pgid at +16, txid at +48.
			c := append([]byte{}, b...)
			meta := 0
			if binary.LittleEndian.Uint64(c[4096+64:]) > binary.LittleEndian.Uint64(c[64:]) {
				meta = 4096
			}
			root := int(binary.LittleEndian.Uint64(c[meta+32:]))
			for i := root * 4096; i < root*4096+64; i++ {
				c[i] ^= 0xa5
			}
			return c
		},
		"garbled-pages": func(b []byte) []byte {
			c := append([]byte{}, b...)
			for i := 8192; i < len(c); i += 7 {
				c[i] ^= 0xff
			}
			return c
		},
	}
	for _, file := range []string{store.RaftDBFile, store.FSMDBFile} {
		for name, fn := range damage {
			t.Run(file+"/"+name, func(t *testing.T) {
				dir := t.TempDir()
				if err := os.CopyFS(dir, os.DirFS(base)); err != nil {
					t.Fatal(err)
				}
				path := filepath.Join(dir, file)
				if err := os.WriteFile(path, fn(orig[file]), 0o600); err != nil {
					t.Fatal(err)
				}
				cfg := storetest.Config("solo", dir)
				cfg.Bootstrap = true
				s, err := store.Open(cfg, storetest.Logger(), nil)
				if err == nil {
					s.Close()
					t.Fatalf("Open succeeded on damaged %s", file)
				}
				if !errors.Is(err, store.ErrCorrupt) || !strings.Contains(err.Error(), path) {
					t.Fatalf("error does not name %s: %v", path, err)
				}
				t.Logf("%s", err)
			})
		}
	}
}
