package store_test

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/store"
	"kiln/store/storetest"
)

// TestReportAgent: an agent report (command agent_report) stores its events
// and its machine write in one apply, at one index, or neither: every
// refused write (stale version, illegal transition, bad event, no version,
// deleted machine) leaves the machine and the event log as they were. On a
// raft node, a local store, and through a follower (forwarded).
func TestReportAgent(t *testing.T) {
	eachStore(t, func(t *testing.T, s *store.Store, _ *prometheus.Registry) { testReportAgent(t, s) })
	t.Run("follower", func(t *testing.T) {
		c := storetest.NewCluster(t, 3)
		testReportAgent(t, c.Nodes[c.Follower()].Store)
	})
}

func testReportAgent(t *testing.T, s *store.Store) {
	ctx := ctxT(t)
	w := store.W{Actor: "controller:lifecycle", Reason: "agent_registered"}
	m, err := s.PutMachine(ctx, store.Machine{Meta: store.Meta{ID: "m-r"}, Intended: store.Hardware{NICs: []store.NIC{{MAC: "02:00:00:00:0c:01"}}}}, w)
	if err != nil {
		t.Fatal(err)
	}
	stale := m
	m.Name = "r1"
	if m, err = s.PutMachine(ctx, m, w); err != nil {
		t.Fatal(err)
	}
	if err := s.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	mark := s.LastEventIndex()
	step := func(msg string) store.Event {
		return store.Event{Subject: "machine/m-r", Kind: "step", Actor: "agent", To: "succeeded", Message: msg}
	}
	unchanged := func(what string) {
		t.Helper()
		if err := s.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetMachine("m-r")
		if err != nil || got.ResourceVersion != m.ResourceVersion || got.State != m.State {
			t.Fatalf("%s: machine %+v %s, %v; want it unchanged at %d %s", what, got.Meta, got.State, err, m.ResourceVersion, m.State)
		}
		if evs, err := s.Events(mark, 0); err != nil || len(evs) != 0 {
			t.Fatalf("%s: a refused report stored %d events: %+v, %v", what, len(evs), evs, err)
		}
	}

	stale.State = store.StateInspecting
	if _, err := s.ReportAgent(ctx, stale, []store.Event{step("inspect")}, w); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("stale version: %v, want ErrConflict", err)
	}
	unchanged("stale version")
	bad := m
	bad.State = store.StateProvisioned
	var ite *store.IllegalTransitionError
	if _, err := s.ReportAgent(ctx, bad, []store.Event{step("inspect")}, w); !errors.As(err, &ite) ||
		ite.From != store.StateRegistered || ite.To != store.StateProvisioned {
		t.Fatalf("illegal transition: %v, want *IllegalTransitionError registered→provisioned", err)
	}
	unchanged("illegal transition")
	if _, err := s.ReportAgent(ctx, m, []store.Event{step("inspect"), {Subject: "machine/m-r"}}, w); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("event without kind: %v, want ErrInvalid", err)
	}
	unchanged("event without kind")
	noRV := m
	noRV.ResourceVersion = 0
	if _, err := s.ReportAgent(ctx, noRV, nil, w); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("ResourceVersion 0: %v, want ErrInvalid", err)
	}
	noID := m
	noID.ID = ""
	if _, err := s.ReportAgent(ctx, noID, nil, w); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("no ID: %v, want ErrInvalid", err)
	}
	unchanged("no version or ID")

	// A good report: machine and events, one index.
	good := m
	good.State = store.StateInspecting
	good.Step = &store.StepStatus{Step: "inspect", State: "succeeded"}
	got, err := s.ReportAgent(ctx, good, []store.Event{step("inspect started"), step("inspect done")}, w)
	if err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion <= m.ResourceVersion || got.State != store.StateInspecting || got.Step == nil || got.Name != "r1" {
		t.Fatalf("returned %+v %s %+v", got.Meta, got.State, got.Step)
	}
	if err := s.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if stored, err := s.GetMachine("m-r"); err != nil || stored.ResourceVersion != got.ResourceVersion || stored.State != got.State {
		t.Fatalf("stored %+v %s, %v; returned %d %s", stored.Meta, stored.State, err, got.ResourceVersion, got.State)
	}
	evs, err := s.Events(mark, 0)
	if err != nil || len(evs) != 3 {
		t.Fatalf("events of the report: %+v, %v; want 3", evs, err)
	}
	for i, ev := range evs {
		if ev.Index != got.ResourceVersion || ev.Seq != i || !ev.Time.Equal(evs[0].Time) || ev.Time.IsZero() {
			t.Errorf("event %d at %d/%d %v, want index %d seq %d, one time", i, ev.Index, ev.Seq, ev.Time, got.ResourceVersion, i)
		}
	}
	if evs[0].Kind != "step" || evs[0].Actor != "agent" || evs[0].Reason != w.Reason || evs[1].Message != "inspect done" {
		t.Errorf("report events %+v %+v: want the caller's, empty fields from w", evs[0], evs[1])
	}
	if tr := evs[2]; tr.Kind != "transition" || tr.From != "registered" || tr.To != "inspecting" || tr.Actor != w.Actor {
		t.Errorf("machine event %+v, want transition registered→inspecting by %s", tr, w.Actor)
	}

	// A heartbeat: no events, no state change, still one CAS write.
	hb, err := s.ReportAgent(ctx, got, nil, w)
	if err != nil || hb.ResourceVersion <= got.ResourceVersion || hb.State != store.StateInspecting {
		t.Fatalf("report without events: %+v %s, %v", hb.Meta, hb.State, err)
	}
	if err := s.DeleteMachine(ctx, "m-r", w); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReportAgent(ctx, hb, []store.Event{step("late")}, w); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("report on a deleted machine: %v, want ErrNotFound", err)
	}
}
