package store_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/store"
)

// TestPutReturnsStoredRecord: the record a Put returns (on the leader, the
// applied struct itself, not a decode of the stored JSON) deep-equals what
// the matching Get returns right after — for creates and updates, with
// caller input that JSON does not round-trip as is (empty non-nil maps and
// slices, upper-case MACs, non-UTC times with monotonic readings, nil vs set
// pointers).
func TestPutReturnsStoredRecord(t *testing.T) {
	eachStore(t, func(t *testing.T, s *store.Store, _ *prometheus.Registry) { testPutReturnsStoredRecord(t, s) })
}

func testPutReturnsStoredRecord(t *testing.T, s *store.Store) {
	ctx := ctxT(t)
	w := store.W{Actor: "test", Reason: "intake", Message: "m"}
	// The claim below must name a stored image (PutMachine's claim rule).
	if _, err := s.PutImage(ctx, store.Image{Meta: store.Meta{ID: "img-1"}, Name: "os", Format: "raw"}, w); err != nil {
		t.Fatal(err)
	}
	zone := time.FixedZone("X", 5*3600+1800)
	netboot := false
	rich := store.Machine{Name: "n1", Site: "s", Rack: "r", RackUnit: 7,
		Labels:   map[string]string{},
		Intended: store.Hardware{Serial: "SN", Disks: []store.Disk{}, NICs: []store.NIC{{Name: "eno1", MAC: "02:AA:BB:CC:DD:01"}}},
		Discovered: &store.Hardware{CPUs: 8, MemoryBytes: 1 << 34,
			Disks: []store.Disk{{Name: "vda", SizeBytes: 1 << 30, Rotational: true}},
			NICs:  []store.NIC{{Name: "eth0", MAC: "02-aa-bb-cc-dd-02", LinkUp: true}}},
		Diff:     []store.FieldDiff{{Field: "cpus", Intended: "4", Discovered: "8"}},
		Netboot:  &netboot,
		RootDisk: store.DiskRule{MinSizeBytes: 1 << 30},
		Claim:    &store.Claim{Image: "img-1", SSHKeys: []string{}, Labels: map[string]string{"a": "b"}},
		Step:     &store.StepStatus{Step: "write", State: "running", Progress: 0.1 + 0.2, At: time.Now().In(zone)},
	}
	check := func(what string, got store.Machine) {
		t.Helper()
		stored, err := s.GetMachine(got.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, stored) {
			t.Fatalf("%s: returned record differs from GetMachine:\n got %#v\nwant %#v", what, got, stored)
		}
	}
	m, err := s.PutMachine(ctx, rich, w)
	if err != nil {
		t.Fatal(err)
	}
	check("create", m)
	if m.Intended.NICs[0].MAC != "02:aa:bb:cc:dd:01" || m.Discovered.NICs[0].MAC != "02:aa:bb:cc:dd:02" {
		t.Fatalf("MACs not normalized: %+v", m)
	}

	upd := m
	upd.State = store.StateInspecting
	upd.Labels = map[string]string{"pool": "x"}
	upd.Step = &store.StepStatus{Step: "inspect", State: "done", At: time.Now(), Deadline: time.Now().Add(time.Hour)}
	m2, err := s.PutMachine(ctx, upd, w)
	if err != nil {
		t.Fatal(err)
	}
	check("update", m2)
	if m2.ResourceVersion <= m.ResourceVersion || !m2.CreatedAt.Equal(m.CreatedAt) {
		t.Fatalf("update meta %+v after %+v", m2.Meta, m.Meta)
	}

	ms, err := s.PutMachines(ctx, []store.Machine{{Name: "a", Labels: map[string]string{}},
		{Name: "b", State: store.StateDiscovered, Intended: store.Hardware{NICs: []store.NIC{{MAC: "02:AA:00:00:00:03"}}}}}, w)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ms {
		check("PutMachines", x)
	}

	site, err := s.PutSite(ctx, store.Site{Name: "hall"}, w)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetSite(site.ID); !reflect.DeepEqual(site, got) {
		t.Fatalf("site %#v, stored %#v", site, got)
	}
	job, err := s.PutJob(ctx, store.Job{Machine: m.ID, Kind: "power_on", State: "pending"}, w)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetJob(job.ID); !reflect.DeepEqual(job, got) {
		t.Fatalf("job %#v, stored %#v", job, got)
	}
	// The returned records are the caller's own: changing them changes
	// neither the store nor a later result.
	m2.Labels["pool"] = "changed"
	m2.Intended.NICs[0].MAC = "zz"
	if got, _ := s.GetMachine(m2.ID); got.Labels["pool"] != "x" || got.Intended.NICs[0].MAC != "02:aa:bb:cc:dd:01" {
		t.Fatalf("store changed through a returned record: %+v", got)
	}
}
