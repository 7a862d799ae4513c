package lifecycle

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"kiln/deploy/lab/benchline"
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

// TestBenchLifecycle measures, on a real single-node store (raft + bbolt in
// a temp dir): importing a 2,000-row rack plan (Controller.Import: parse,
// MAC checks against the store, one all-or-nothing raft command), median of
// 3; and listing the machines of one state out of 12,000
// (store.ListMachines through the state index), median of 5. No other
// product does these two jobs on this machine, so both lines are figures
// without a peer (a scan written in this test would not be one).
func TestBenchLifecycle(t *testing.T) {
	benchline.Need(t, false)
	s := openRealStore(t)
	h := newHarness(t, s, nil)

	// Import.
	var kiln []time.Duration
	for run := 0; run < 3; run++ {
		csv := benchPlan(2000, run)
		t0 := time.Now()
		res, err := h.c.Import(bg, strings.NewReader(csv), "csv", store.W{Actor: "bench"})
		kiln = append(kiln, time.Since(t0))
		must(t, err)
		if res.Created != 2000 {
			t.Fatalf("created %d", res.Created)
		}
	}
	benchline.Print(t, benchline.Line{Name: "import_2000_rows_seconds", Unit: "s", Kiln: median(kiln).Seconds()})

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
	kiln = nil
	for run := 0; run < 5; run++ {
		t0 := time.Now()
		items, next, err := s.ListMachines(store.ListOptions{State: store.StateAvailable})
		kiln = append(kiln, time.Since(t0))
		must(t, err)
		if len(items) != 3000 || next != "" {
			t.Fatalf("kiln listed %d", len(items))
		}
		for _, m := range items {
			if m.State != store.StateAvailable {
				t.Fatalf("listed %s in state %s", m.ID, m.State)
			}
		}
	}
	benchline.Print(t, benchline.Line{Name: "list_12000_by_state_seconds", Unit: "s", Kiln: median(kiln).Seconds()})
}
