package lifecycle

import (
	"errors"
	"testing"

	"kiln/store"
)

// availableOn creates a machine and walks it to available through legal
// store transitions (what a passed inspection leaves).
func availableOn(t *testing.T, st Store, name, mac string) store.Machine {
	t.Helper()
	w := store.W{Actor: "test"}
	m, err := st.PutMachine(bg, store.Machine{Name: name, Intended: store.Hardware{NICs: []store.NIC{{MAC: mac}}}}, w)
	must(t, err)
	for _, s := range []store.MachineState{store.StateInspecting, store.StateAvailable} {
		m.State = s
		m, err = st.PutMachine(bg, m, w)
		must(t, err)
	}
	return m
}

// TestClaimedMachineErrorText: provisioning (or inspecting) an available
// machine that is already claimed is refused as ErrWrongState, and the
// message names what conflicted — the existing claim — instead of the
// self-contradictory "state is available, want available" (issue 20).
func TestClaimedMachineErrorText(t *testing.T) {
	if testing.Short() {
		t.Skip("short: real store")
	}
	s := openRealStore(t)
	h := newHarness(t, s, nil)
	img := h.image("img.raw")
	m := availableOn(t, s, "claimed", "02:00:00:00:d0:01")
	_, err := h.c.Provision(bg, m.ID, store.Claim{Image: img.ID}, store.W{})
	must(t, err)

	_, err = h.c.Provision(bg, m.ID, store.Claim{Image: img.ID}, store.W{})
	var se *StateError
	if !errors.Is(err, ErrWrongState) || !errors.As(err, &se) {
		t.Fatalf("second provision: %v, want *StateError", err)
	}
	want := "lifecycle: provision machine " + m.ID + ": it is available but already claimed (image " + img.ID + "); release it first"
	if err.Error() != want {
		t.Fatalf("second provision:\n got %q\nwant %q", err.Error(), want)
	}
	_, err = h.c.Inspect(bg, m.ID, store.W{})
	want = "lifecycle: inspect machine " + m.ID + ": it is available but already claimed (image " + img.ID + "); release it first"
	if !errors.Is(err, ErrWrongState) || err.Error() != want {
		t.Fatalf("inspect of a claimed machine:\n got %v\nwant %q", err, want)
	}
	// A real state mismatch still names both sides.
	if _, err := h.c.Release(bg, m.ID, store.W{}); err != nil {
		t.Fatal(err)
	}
	m2 := availableOn(t, s, "registered-only", "02:00:00:00:d0:02")
	m2.State = store.StateRetired
	_, err = s.PutMachine(bg, m2, store.W{Actor: "test"})
	must(t, err)
	_, err = h.c.Provision(bg, m2.ID, store.Claim{Image: img.ID}, store.W{})
	want = "lifecycle: provision machine " + m2.ID + ": state is retired, want available"
	if !errors.Is(err, ErrWrongState) || err.Error() != want {
		t.Fatalf("provision of a retired machine:\n got %v\nwant %q", err, want)
	}
}
