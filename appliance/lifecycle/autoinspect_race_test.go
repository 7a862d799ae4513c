package lifecycle

import (
	"context"
	"strings"
	"sync"
	"testing"

	"kiln/api/agentapi"
	"kiln/store"
)

// staleList is a Store whose next ListMachines answers with the list as it
// was and, before returning it, lets a machine's earlier power sequence end:
// the agent of machine id registers (registered → inspecting → available), as happens
// while auto-inspection walks a large registered hall.
type staleList struct {
	Store
	once sync.Once
	h    *harness
	id   string
}

func (s *staleList) ListMachines(opt store.ListOptions) ([]store.Machine, string, error) {
	items, next, err := s.Store.ListMachines(opt)
	s.once.Do(func() {
		m := s.h.get(s.id)
		_, err := s.h.c.AgentRegister(context.Background(), m.ID, agentapi.Registration{Inventory: inventory(m)})
		must(s.h.t, err)
	})
	return items, next, err
}

// Auto-inspection never power-cycles a machine that left registered after
// the list it walks was read.
func TestAutoInspectSkipsMachinesThatMovedOn(t *testing.T) {
	f := newStore(t)
	sl := &staleList{Store: f}
	h := newHarness(t, sl, nil)
	sl.h = h
	res, err := h.c.Import(bg, strings.NewReader("name,macs\nr1,02:00:00:00:02:01\nr2,02:00:00:00:02:02\n"), "csv", store.W{})
	must(t, err)
	for _, id := range res.IDs {
		_, err := h.c.EnrollBMC(bg, id, store.BMC{Address: "10.99.1.1", Username: "u"}, "p", store.W{})
		must(t, err)
	}
	sl.id = res.IDs[0]
	must(t, h.c.autoInspect(bg))
	h.mustState(res.IDs[0], store.StateAvailable) // its agent registered and was inspected
	for _, j := range allJobs(t, f) {
		if j.Machine == res.IDs[0] {
			t.Fatalf("auto-inspection queued %s for r1, whose agent had registered: %+v", j.Kind, j)
		}
	}
	n := 0
	for _, j := range allJobs(t, f) {
		if j.Machine == res.IDs[1] {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("r2 (still registered): %d jobs, want boot_pxe and power_cycle", n)
	}
}
