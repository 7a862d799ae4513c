package lifecycle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/store"
	"kiln/store/storetest"
)

// A week of heartbeats from 2,000 agents keeps the store flat: heartbeats
// are coalesced (HeartbeatRecordEvery) and carry no audit event, and the
// retention trim (what appliance's eventTrimmer writes: EventTrimPoint,
// then TrimEvents, here with the count bound of a 48 h window) drops the
// rest, so fsm.db stops growing once the retained window is full (bbolt
// reuses the freed pages). Intervals are compressed so the week runs in
// seconds: the fake clock moves AgentHeartbeat (30 s) at a time inside
// one HeartbeatRecordEvery window only for a sample of agents, and whole
// windows (6 h here, scaled from the default 5 min) otherwise.
func TestHeartbeatWeekStoreFlat(t *testing.T) {
	const (
		agents   = 2000
		every    = 6 * time.Hour      // HeartbeatRecordEvery, compressed
		week     = 7 * 24 * time.Hour // simulated
		keep     = 48 * time.Hour     // the retention window, compressed with the same factor
		trimTick = 24 * time.Hour     // store.events.trim_every, compressed
		workers  = 16
	)
	if testing.Short() {
		t.Skip("a simulated week of 2,000 agents (-short)")
	}
	dir := t.TempDir()
	st := storetest.OpenLocal(t, dir)
	h := newHarness(t, st, func(c *Config) { c.HeartbeatRecordEvery = every })
	ctx := context.Background()

	// 2,000 machines erasing, the erase step running (the state the
	// agent's heartbeats report from), written as fixtures straight to the
	// store through the legal states.
	t0 := h.clk.Now()
	ids := make([]string, agents)
	for i := range agents {
		ids[i] = fmt.Sprintf("hb-%04d", i)
	}
	for lo := 0; lo < agents; lo += 200 {
		var batch []store.Machine
		for _, id := range ids[lo : lo+200] {
			batch = append(batch, store.Machine{Meta: store.Meta{ID: id}, State: store.StateRegistered})
		}
		for _, s := range []store.MachineState{"", store.StateInspecting, store.StateAvailable, store.StateErasing} {
			if s != "" {
				for i := range batch {
					batch[i].State = s
					if s == store.StateErasing {
						batch[i].Step = &store.StepStatus{Step: agentapi.StepErase, State: string(agentapi.StateRunning), At: t0,
							Deadline: t0.Add(30 * 24 * time.Hour)}
					}
				}
			}
			out, err := st.PutMachines(ctx, batch, store.W{Actor: "test"})
			if err != nil {
				t.Fatal(err)
			}
			batch = out
		}
	}
	fsmSize := func() int64 {
		fi, err := os.Stat(filepath.Join(dir, store.FSMDBFile))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	events := func() int {
		oldest, err := st.OldestEventCursor()
		if err != nil {
			t.Fatal(err)
		}
		n, after := 0, oldest
		for {
			evs, err := st.Events(after, 10000)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) == 0 {
				return n
			}
			n += len(evs)
			after = evs[len(evs)-1].Index
		}
	}
	var reports, skipped atomic.Int64
	beat := func(ids []string, p float64) {
		var wg sync.WaitGroup
		ch := make(chan string)
		for range workers {
			wg.Go(func() {
				for id := range ch {
					before, _ := st.GetMachine(id)
					err := h.c.AgentReport(ctx, id, agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateRunning,
						Progress: p, Message: fmt.Sprintf("%d%%", int(p*100))})
					if err != nil {
						t.Error(err)
					}
					reports.Add(1)
					if after, _ := st.GetMachine(id); after.ResourceVersion == before.ResourceVersion {
						skipped.Add(1)
					}
				}
			})
		}
		for _, id := range ids {
			ch <- id
		}
		close(ch)
		wg.Wait()
	}
	trim := func() {
		// The store stamps events with its own (wall) clock, not the
		// test's fake one, so the window is given as its count bound:
		// one event per agent per recorded heartbeat over keep.
		before, err := st.EventTrimPoint(time.Now(), 0, int(keep/every)*agents)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.TrimEvents(ctx, before, store.W{Actor: "controller:retention"}); err != nil {
			t.Fatal(err)
		}
	}

	start := fsmSize()
	t.Logf("start: %d agents, fsm.db %d bytes, %d events", agents, start, events())
	var atMaxAge int64
	sample := ids[:20]
	lastTrim := t0
	for el := time.Duration(0); el < week; el += every {
		h.clk.Advance(every)
		p := float64(el) / float64(week)
		beat(ids, p) // one recorded heartbeat per agent per window
		for range 5 {
			h.clk.Advance(30 * time.Second) // AgentHeartbeat: coalesced, nothing written
			beat(sample, p)
		}
		if h.clk.Now().Sub(lastTrim) >= trimTick {
			trim()
			lastTrim = h.clk.Now()
		}
		if atMaxAge == 0 && el+every >= keep+trimTick {
			atMaxAge = fsmSize()
			t.Logf("after %s (retention window full): fsm.db %d bytes, %d events", el+every, atMaxAge, events())
		}
		if t.Failed() {
			return
		}
	}
	trim()
	end, n := fsmSize(), events()
	m, err := st.GetMachine(ids[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after a week: fsm.db %d bytes, %d events retained; %d reports sent, %d coalesced (no store write); "+
		"machine %s last heard %s, progress %.2f", end, n, reports.Load(), skipped.Load(), m.ID, m.Step.At.Format(time.RFC3339), m.Step.Progress)
	fmt.Printf("heartbeat week: %d agents, fsm.db start %d B, at retention window %d B, after a week %d B; %d events retained\n",
		agents, start, atMaxAge, end, n)
	if wantMax := int64(keep/every+1) * agents; int64(n) > wantMax || n == 0 {
		t.Errorf("%d events retained; want 1..%d (one per agent per %s over %s)", n, wantMax, every, keep)
	}
	if end > atMaxAge+atMaxAge/10 {
		t.Errorf("fsm.db grew from %d to %d bytes after the retention window filled; want flat (within 10%%)", atMaxAge, end)
	}
	if skipped.Load() == 0 || m.Step.At.Before(h.clk.Now().Add(-2*every)) || m.Step.Progress == 0 {
		t.Errorf("coalesced %d; stored last heard %s (now %s), progress %.2f", skipped.Load(), m.Step.At, h.clk.Now(), m.Step.Progress)
	}
}
