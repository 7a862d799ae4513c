package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"kiln/store"
	"kiln/store/storetest"
)

// dirSnapshot is every file under dir with its bytes.
func dirSnapshot(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if fi.IsDir() {
			out[rel+"/"] = nil
			return nil
		}
		b, err := os.ReadFile(p)
		out[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameDir(t *testing.T, before, after map[string][]byte) {
	t.Helper()
	var diff []string
	for k, v := range before {
		if w, ok := after[k]; !ok || !bytes.Equal(v, w) {
			diff = append(diff, "changed or removed: "+k)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			diff = append(diff, "created: "+k)
		}
	}
	sort.Strings(diff)
	if len(diff) > 0 {
		t.Fatalf("a refused Open changed the data directory:\n%s", strings.Join(diff, "\n"))
	}
}

// writeMachines stores n machines m-00.. and stops the node.
func writeMachines(t *testing.T, dir string, n int, mod ...func(*store.Config)) {
	t.Helper()
	s, stop := openSingle(t, dir, nil, mod...)
	for i := 0; i < n; i++ {
		if _, err := s.PutMachine(ctxT(t), store.Machine{Meta: store.Meta{ID: fmt.Sprintf("m-%02d", i)}}, store.W{}); err != nil {
			t.Fatal(err)
		}
	}
	stop()
}

func openRefused(t *testing.T, dir string, mod ...func(*store.Config)) error {
	t.Helper()
	cfg := storetest.Config("solo", dir)
	cfg.Bootstrap = true
	for _, m := range mod {
		m(&cfg)
	}
	s, err := store.Open(cfg, storetest.Logger(), nil)
	if err == nil {
		s.Close()
		t.Fatal("Open accepted an inconsistent data directory")
	}
	if !errors.Is(err, store.ErrInconsistentDataDir) {
		t.Fatalf("Open: %v, want ErrInconsistentDataDir", err)
	}
	return err
}

func mustContain(t *testing.T, msg string, parts ...string) {
	t.Helper()
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Errorf("message lacks %q:\n%s", p, msg)
		}
	}
}

func countMachines(t *testing.T, dir string, want int) {
	t.Helper()
	s, _ := openSingle(t, dir, nil)
	if !waitTrue(10*time.Second, s.Ready) {
		t.Fatal("not ready")
	}
	items, _, err := s.ListMachines(store.ListOptions{})
	if err != nil || len(items) != want {
		t.Fatalf("%d machines after reopening, want %d (%v)", len(items), want, err)
	}
}

// TestOpenRefusesFSMWithoutRaftLog: with raft.db gone (or replaced by one
// holding no raft state) but fsm.db holding state, Open refuses — it used to
// bootstrap a new empty cluster, report ready with no machines and replace
// fsm.db — names raft.db, fsm.db and the data directory and says how to
// recover, and changes nothing. Putting raft.db back recovers every machine.
func TestOpenRefusesFSMWithoutRaftLog(t *testing.T) {
	dir := t.TempDir()
	writeMachines(t, dir, 10)
	raftPath, fsmPath := filepath.Join(dir, store.RaftDBFile), filepath.Join(dir, store.FSMDBFile)
	saved, err := os.ReadFile(raftPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(raftPath); err != nil {
		t.Fatal(err)
	}
	before := dirSnapshot(t, dir)
	err = openRefused(t, dir)
	sameDir(t, before, dirSnapshot(t, dir))
	mustContain(t, err.Error(), raftPath+" is missing", fsmPath+" holds state up to raft index", dir,
		"restore "+raftPath, "move fsm.db, snapshots/ out of "+dir, "Nothing was changed")
	t.Logf("raft.db missing: %v", err)

	// raft.db present but empty of raft state (a fresh file): the same.
	fresh := t.TempDir()
	s, err := store.Open(storetest.Config("fresh", fresh), storetest.Logger(), nil) // no bootstrap: no raft state
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	empty, err := os.ReadFile(filepath.Join(fresh, store.RaftDBFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(raftPath, empty, 0o600); err != nil {
		t.Fatal(err)
	}
	before = dirSnapshot(t, dir)
	err = openRefused(t, dir)
	sameDir(t, before, dirSnapshot(t, dir))
	mustContain(t, err.Error(), raftPath+" holds no raft state")

	if err := os.WriteFile(raftPath, saved, 0o600); err != nil {
		t.Fatal(err)
	}
	countMachines(t, dir, 10)
}

// TestOpenRebuildsMissingFSM: raft.db present and fsm.db gone is not an
// inconsistency: fsm.db is a cache of snapshot + log, rebuilt on start.
func TestOpenRebuildsMissingFSM(t *testing.T) {
	dir := t.TempDir()
	writeMachines(t, dir, 10)
	if err := os.Remove(filepath.Join(dir, store.FSMDBFile)); err != nil {
		t.Fatal(err)
	}
	countMachines(t, dir, 10)
}

// TestOpenSnapshotsDir: with the log compacted behind a snapshot, a missing
// snapshots/ leaves entries that neither holds: refused, nothing changed.
// With the log complete from index 1, a missing snapshots/ is fine (replayed).
func TestOpenSnapshotsDir(t *testing.T) {
	dir := t.TempDir()
	compact := func(c *store.Config) { c.TrailingLogs = 4 }
	s, stop := openSingle(t, dir, nil, compact)
	for i := 0; i < 20; i++ {
		if _, err := s.PutMachine(ctxT(t), store.Machine{Meta: store.Meta{ID: fmt.Sprintf("m-%02d", i)}}, store.W{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Snapshot(); err != nil {
		t.Fatal(err)
	}
	stop()
	snaps := filepath.Join(dir, "snapshots")
	if err := os.Rename(snaps, snaps+".aside"); err != nil {
		t.Fatal(err)
	}
	before := dirSnapshot(t, dir)
	err := openRefused(t, dir, compact)
	sameDir(t, before, dirSnapshot(t, dir))
	mustContain(t, err.Error(), "the log in "+filepath.Join(dir, store.RaftDBFile)+" starts at index",
		"there is no snapshot", "move raft.db, fsm.db, snapshots/ out of "+dir)
	t.Logf("snapshots missing: %v", err)
	if err := os.Rename(snaps+".aside", snaps); err != nil {
		t.Fatal(err)
	}
	countMachines(t, dir, 20)

	// No snapshot ever taken: the log starts at 1; no snapshots/ is fine.
	full := t.TempDir()
	writeMachines(t, full, 5)
	if err := os.RemoveAll(filepath.Join(full, "snapshots")); err != nil {
		t.Fatal(err)
	}
	countMachines(t, full, 5)
}

// TestOpenRefusesOlderRaftLog: raft.db put back from a backup older than
// fsm.db would silently roll the state back: refused, naming both.
func TestOpenRefusesOlderRaftLog(t *testing.T) {
	dir := t.TempDir()
	writeMachines(t, dir, 3)
	raftPath := filepath.Join(dir, store.RaftDBFile)
	old, err := os.ReadFile(raftPath)
	if err != nil {
		t.Fatal(err)
	}
	s, stop := openSingle(t, dir, nil)
	for i := 3; i < 8; i++ {
		if _, err := s.PutMachine(ctxT(t), store.Machine{Meta: store.Meta{ID: fmt.Sprintf("m-%02d", i)}}, store.W{}); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	if err := os.WriteFile(raftPath, old, 0o600); err != nil {
		t.Fatal(err)
	}
	before := dirSnapshot(t, dir)
	err = openRefused(t, dir)
	sameDir(t, before, dirSnapshot(t, dir))
	mustContain(t, err.Error(), filepath.Join(dir, store.FSMDBFile)+" holds state up to raft index", "roll the state back",
		"move "+filepath.Join(dir, store.FSMDBFile)+" aside")
	t.Logf("older raft.db: %v", err)
	// Accepting the older log, as the message says: move fsm.db aside.
	if err := os.Rename(filepath.Join(dir, store.FSMDBFile), filepath.Join(t.TempDir(), "fsm.db")); err != nil {
		t.Fatal(err)
	}
	countMachines(t, dir, 3)
}
