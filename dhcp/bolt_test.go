package dhcp

import (
	"encoding/json"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// boltBackend is a Backend over a bbolt file: one fsync'd transaction per
// CommitLeases batch (its accepted changes), so leases are durable as the
// real store's are; the address rule and the feed are the tests' leaseLog.
// The machines map stands in for the store's reservations.
type boltBackend struct {
	db       *bolt.DB
	mu       sync.Mutex
	machines map[string]MachineInfo
	leaseLog
	members
}

var leaseBucket = []byte("leases")

func newBoltBackend(t testing.TB) *boltBackend {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "leases.db"), 0o600, &bolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists(leaseBucket); return err }); err != nil {
		t.Fatal(err)
	}
	b := &boltBackend{db: db, machines: map[string]MachineInfo{}}
	b.save = b.persist
	return b
}

func (b *boltBackend) Machine(mac net.HardwareAddr) (MachineInfo, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m, ok := b.machines[mac.String()]
	return m, ok
}

func (b *boltBackend) Discovered(net.HardwareAddr, uint16, string) {}

// LoadLeases returns every durable lease (for the tests' checks).
func (b *boltBackend) LoadLeases() ([]Lease, error) {
	var out []Lease
	err := b.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(leaseBucket).ForEach(func(_, v []byte) error {
			var l Lease
			if err := json.Unmarshal(v, &l); err != nil {
				return err
			}
			out = append(out, l)
			return nil
		})
	})
	return out, err
}

func (b *boltBackend) persist(ls []Lease) error {
	return b.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(leaseBucket)
		for _, l := range ls {
			v, err := json.Marshal(l)
			if err != nil {
				return err
			}
			if err := bk.Put(l.IP.AsSlice(), v); err != nil { // keyed by IP, as the record is
				return err
			}
		}
		return nil
	})
}
