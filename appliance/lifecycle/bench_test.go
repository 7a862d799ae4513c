package lifecycle

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"kiln/appliance/lifecycle/intake"
	"kiln/store"
)

// benchPlan writes an n-row rack plan in Kiln's CSV; run makes MACs,
// serials and names unique across runs.
func benchPlan(n, run int) string {
	var b strings.Builder
	b.WriteString("name,serial,vendor,model,site,rack,u,bmc_address,macs,cpus,memory_gib,disks,boot_mode,labels\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "b%d-n%05d,SN%d-%06d,Dell,R650,hall1,r%03d,%d,10.98.%d.%d,02:%02x:00:%02x:%02x:01;02:%02x:00:%02x:%02x:02,64,512,2x960GB,uefi,pool=p%d\n",
			run, i, run, i, i/40, i%40+1, i/250, i%250+1, run, i>>8, i&0xff, run, i>>8, i&0xff, i%4)
	}
	return b.String()
}

func median(d []time.Duration) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)/2]
}

func openBolt(t *testing.T, name string) *bbolt.DB {
	db, err := bbolt.Open(filepath.Join(t.TempDir(), name), 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestBenchLifecycle measures, on a real single-node store (raft + bbolt in
// a temp dir): importing a 2,000-row rack plan (Controller.Import: parse,
// MAC checks against the store, one all-or-nothing raft command) against
// the peer "parse the same CSV with intake.Parse, then write the rows as
// JSON with bare bbolt in one transaction"; and listing the machines of one
// state out of 12,000 (store.ListMachines via the state index) against the
// peer "full scan of the same 12,000 JSON records in bare bbolt, decode and
// filter in Go". Median of 3 imports and 5 listings.
func TestBenchLifecycle(t *testing.T) {
	if os.Getenv("KILN_BENCH") != "1" {
		t.Skip("set KILN_BENCH=1 to run benchmarks")
	}
	s := openRealStore(t)
	h := newHarness(t, s, nil)

	// Import.
	var kiln, peer []time.Duration
	for run := 0; run < 3; run++ {
		csv := benchPlan(2000, run)
		t0 := time.Now()
		res, err := h.c.Import(bg, strings.NewReader(csv), "csv", store.W{Actor: "bench"})
		kiln = append(kiln, time.Since(t0))
		must(t, err)
		if res.Created != 2000 {
			t.Fatalf("created %d", res.Created)
		}

		db := openBolt(t, fmt.Sprintf("peer-import-%d.db", run))
		t0 = time.Now()
		ms, err := intake.Parse(strings.NewReader(csv), "csv")
		must(t, err)
		err = db.Update(func(tx *bbolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("machines"))
			if err != nil {
				return err
			}
			for i := range ms {
				ms[i].ID = fmt.Sprintf("m-%016x", i)
				raw, err := json.Marshal(&ms[i])
				if err != nil {
					return err
				}
				if err := b.Put([]byte(ms[i].ID), raw); err != nil {
					return err
				}
			}
			return nil
		})
		peer = append(peer, time.Since(t0))
		must(t, err)
	}
	k, p := median(kiln), median(peer)
	fmt.Printf("bench: import_2000_rows_seconds kiln=%.4f peer=%.4f unit=s ratio=%.2f\n", k.Seconds(), p.Seconds(), k.Seconds()/p.Seconds())

	// Grow the store to 12,000 machines; move 3,000 to available through
	// legal transitions (registered → inspecting → available).
	for run := 3; run < 7; run++ {
		_, err := h.c.Import(bg, strings.NewReader(benchPlan(1500, run)), "csv", store.W{Actor: "bench"})
		must(t, err)
	}
	all, _, err := s.ListMachines(store.ListOptions{})
	must(t, err)
	if len(all) != 12000 {
		t.Fatalf("%d machines", len(all))
	}
	for _, to := range []store.MachineState{store.StateInspecting, store.StateAvailable} {
		for i := 0; i < 3000; i += 500 {
			batch := make([]store.Machine, 0, 500)
			for j := i; j < i+500; j++ {
				m, err := s.GetMachine(all[j*4].ID)
				must(t, err)
				m.State = to
				batch = append(batch, m)
			}
			_, err := s.PutMachines(bg, batch, store.W{Actor: "bench", Reason: "bench"})
			must(t, err)
		}
	}
	all, _, err = s.ListMachines(store.ListOptions{})
	must(t, err)
	peerDB := openBolt(t, "peer-list.db")
	must(t, peerDB.Update(func(tx *bbolt.Tx) error {
		b, err := tx.CreateBucket([]byte("machines"))
		if err != nil {
			return err
		}
		for i := range all {
			raw, err := json.Marshal(&all[i])
			if err != nil {
				return err
			}
			if err := b.Put([]byte(all[i].ID), raw); err != nil {
				return err
			}
		}
		return nil
	}))
	kiln, peer = nil, nil
	for run := 0; run < 5; run++ {
		t0 := time.Now()
		items, next, err := s.ListMachines(store.ListOptions{State: store.StateAvailable})
		kiln = append(kiln, time.Since(t0))
		must(t, err)
		if len(items) != 3000 || next != "" {
			t.Fatalf("kiln listed %d", len(items))
		}
		t0 = time.Now()
		var got []store.Machine
		err = peerDB.View(func(tx *bbolt.Tx) error {
			return tx.Bucket([]byte("machines")).ForEach(func(_, v []byte) error {
				var m store.Machine
				if err := json.Unmarshal(v, &m); err != nil {
					return err
				}
				if m.State == store.StateAvailable {
					got = append(got, m)
				}
				return nil
			})
		})
		peer = append(peer, time.Since(t0))
		must(t, err)
		if len(got) != 3000 {
			t.Fatalf("peer listed %d", len(got))
		}
	}
	k, p = median(kiln), median(peer)
	fmt.Printf("bench: list_12000_by_state_seconds kiln=%.4f peer=%.4f unit=s ratio=%.2f\n", k.Seconds(), p.Seconds(), k.Seconds()/p.Seconds())
}
