package lifecycle

import (
	"math/rand"
	"testing"
	"time"

	"kiln/store"
)

// A mass failure that surfaces over one health-poll sweep (a site's BMCs are
// read a few at a time, so 20 % of the machines turn Critical over several
// ticks, each tick seeing a share below the site threshold) must still
// engage the brake before any of those machines is touched, when
// remediation.hold covers the sweep: a failure is counted in the brake at
// once, its run starts only once its Critical condition is hold old. Without
// the hold the first ticks start ladders and power-cycle machines the brake
// then halts half-way (found by the fleet simulator's day 2, deploy/lab/fleetsim).
func TestMassFailureOverASweepTripsBrakeFirst(t *testing.T) {
	for _, tc := range []struct {
		name      string
		hold      time.Duration
		sweep     time.Duration // the last BMC health sweep's duration (sweepHold)
		wantCalls bool
	}{{"no hold", 0, 0, true}, {"hold one sweep", 10 * time.Second, 0, false},
		{"no hold, the last health sweep took 10 s", 0, 10 * time.Second, false}} {
		t.Run(tc.name, func(t *testing.T) {
			n := 200
			f := newSimFleet(t, n, 8)
			f.c.cfg.Remediation.StartHold = tc.hold
			f.c.health.mu.Lock()
			f.c.health.sweep = tc.sweep
			f.c.health.mu.Unlock()
			rng := rand.New(rand.NewSource(21))
			ids := append([]string(nil), f.claimed...)
			rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
			down := ids[:n/5]
			// The sweep: a quarter of the failed machines read Critical per 2 s tick.
			for b := 0; b < len(down); b += len(down) / 4 {
				for _, id := range down[b : b+len(down)/4] {
					_, err := f.c.ReportHealth(bg, id, "Ready", store.HealthCritical, "NodeNotReady", "power feed lost", store.W{Actor: "owner"})
					must(t, err)
				}
				f.step(2 * time.Second)
			}
			for i := 0; i < 10; i++ {
				f.step(10 * time.Second)
			}
			b, err := f.st.GetRepairBrake()
			must(t, err)
			if !b.Engaged {
				t.Fatalf("brake not engaged with %d of %d down", len(down), n)
			}
			calls := f.bmc.Calls()
			if tc.wantCalls {
				if len(calls) == 0 {
					t.Fatalf("no BMC call without the hold: the test does not reproduce the sweep")
				}
				t.Logf("without hold: %d BMC calls before/behind the brake (%s %s)", len(calls), b.Scope, b.Key)
				return
			}
			if len(calls) != 0 {
				t.Fatalf("%d BMC calls with hold %s: %v", len(calls), tc.hold, calls[:min(5, len(calls))])
			}
			for _, id := range down {
				if s := f.get(id).State; s != store.StateProvisioned {
					t.Fatalf("%s %s behind the brake", id, s)
				}
			}
		})
	}
}
