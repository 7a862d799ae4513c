package lifecycle

import (
	"fmt"
	"os"
	"testing"
	"time"

	"kiln/store"
)

// TestRemediationTickCost (KILN_BENCH=1): the loop's added work on a site
// of 2,000 claimed, provisioned machines: one Tick (deadlines, remediate:
// brake read, spare pools, every machine judged) and one health poll pass.
func TestRemediationTickCost(t *testing.T) {
	if os.Getenv("KILN_BENCH") == "" {
		t.Skip("KILN_BENCH=1 runs the 2,000-machine tick measurement")
	}
	st := newStore(t)
	h := newHarness(t, st, func(c *Config) { c.Inspection = InspectManual })
	img := h.image("b.raw")
	const n = 2000
	for b := 0; b < n; b += 500 {
		var ms []store.Machine
		for i := b; i < b+500; i++ {
			ms = append(ms, store.Machine{Meta: store.Meta{ID: fmt.Sprintf("m-%04d", i)}, Rack: fmt.Sprintf("r%02d", i/40),
				Labels:   map[string]string{LabelClass: "gp"},
				Intended: store.Hardware{NICs: []store.NIC{{MAC: fmt.Sprintf("52:54:01:00:%02x:%02x", i/256, i%256)}}}})
		}
		out, err := st.PutMachines(bg, ms, store.W{Actor: "test"})
		must(t, err)
		for _, s := range []store.MachineState{store.StateInspecting, store.StateAvailable, store.StateProvisioning, store.StateProvisioned} {
			for i := range out {
				out[i].State = s
				if s == store.StateProvisioning {
					out[i].Claim = &store.Claim{Image: img.ID, Role: "web"}
				}
			}
			out, err = st.PutMachines(bg, out, store.W{Actor: "test"})
			must(t, err)
		}
	}
	must(t, h.c.Tick(bg))
	const rounds = 10
	start := time.Now()
	for i := 0; i < rounds; i++ {
		must(t, h.c.Tick(bg))
	}
	per := time.Since(start) / rounds
	t.Logf("remediation tick: %d claimed machines, one Tick %s (loop interval %s)", n, per.Round(time.Millisecond), DefaultInterval)
}
