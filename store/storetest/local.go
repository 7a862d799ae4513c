package storetest

import (
	"testing"

	"kiln/store"
)

// NewLocal opens a local store (store.OpenLocal: the real apply path over a
// bbolt file, no raft, no listeners) in a fresh t.TempDir and closes it on
// t.Cleanup. It is the store for tests that need records, CAS, transitions
// and events but not replication; use NewCluster for those that do.
func NewLocal(t testing.TB) *store.Store {
	t.Helper()
	return OpenLocal(t, t.TempDir())
}

// OpenLocal is NewLocal on a given directory (reopen a directory a closed
// local store left, to test what survives). The store is closed on
// t.Cleanup; closing it earlier is fine.
func OpenLocal(t testing.TB, dir string) *store.Store {
	t.Helper()
	s, err := store.OpenLocal(dir, Logger())
	if err != nil {
		t.Fatalf("storetest: open local store in %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("storetest: close local store in %s: %v", dir, err)
		}
	})
	return s
}
