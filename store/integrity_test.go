package store_test

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/deploy/lab/testkit"
	"kiln/store"
	"kiln/store/storetest"
)

// TestDeleteImageRacesClaim: on a real single-node store, a DeleteImage and
// a claim of the same image (a CAS PutMachine, as the lifecycle's Provision
// writes it) race 50 times at once. Never may both succeed, and no machine
// may end with a claim naming a missing image.
func TestDeleteImageRacesClaim(t *testing.T) {
	eachStore(t, func(t *testing.T, s *store.Store, _ *prometheus.Registry) { testDeleteImageRacesClaim(t, s) })
}

func testDeleteImageRacesClaim(t *testing.T, s *store.Store) {
	ctx := ctxT(t)
	w := store.W{Actor: "test"}
	const runs = 50
	imgs := make([]store.Image, runs)
	ms := make([]store.Machine, runs)
	for i := range imgs {
		var err error
		if imgs[i], err = s.PutImage(ctx, store.Image{Name: fmt.Sprintf("os-%d", i), Format: "raw"}, w); err != nil {
			t.Fatal(err)
		}
		if ms[i], err = s.PutMachine(ctx, store.Machine{Name: fmt.Sprintf("r-%d", i)}, w); err != nil {
			t.Fatal(err)
		}
	}
	delErr := make([]error, runs)
	claimErr := make([]error, runs)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < runs; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			delErr[i] = s.DeleteImage(ctx, imgs[i].ID, w)
		}()
		go func() {
			defer wg.Done()
			<-start
			m := ms[i]
			m.Claim = &store.Claim{Image: imgs[i].ID}
			_, claimErr[i] = s.PutMachine(ctx, m, w)
		}()
	}
	close(start)
	wg.Wait()
	won := [2]int{}
	for i := 0; i < runs; i++ {
		d, c := delErr[i], claimErr[i]
		switch {
		case d == nil && c == nil:
			t.Errorf("run %d: delete and claim both succeeded", i)
		case d == nil:
			won[0]++
			if !errors.Is(c, store.ErrInvalid) {
				t.Errorf("run %d: losing claim: %v, want ErrInvalid", i, c)
			}
		case c == nil:
			won[1]++
			if !errors.Is(d, store.ErrImageInUse) {
				t.Errorf("run %d: losing delete: %v, want ErrImageInUse", i, d)
			}
		default:
			t.Errorf("run %d: both refused: delete %v, claim %v", i, d, c)
		}
		m, err := s.GetMachine(ms[i].ID)
		if err != nil {
			t.Fatal(err)
		}
		if m.Claim != nil {
			if _, err := s.GetImage(m.Claim.Image); err != nil {
				t.Errorf("run %d: machine %s claims missing image %s", i, m.ID, m.Claim.Image)
			}
		}
	}
	t.Logf("%d runs: delete won %d, claim won %d", runs, won[0], won[1])
}

// TestConcurrentImportsOneWins: imports that share a name race; the check
// runs inside the raft apply, so exactly one of each pair is stored.
func TestConcurrentImportsOneWins(t *testing.T) {
	eachStore(t, func(t *testing.T, s *store.Store, _ *prometheus.Registry) { testConcurrentImportsOneWins(t, s) })
}

func testConcurrentImportsOneWins(t *testing.T, s *store.Store) {
	ctx := ctxT(t)
	const runs = 20
	errs := make([]error, 2*runs)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 2*runs; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			// Pair i/2 shares its name; each side has its own MAC.
			_, errs[i] = s.ImportMachines(ctx, []store.Machine{{Name: fmt.Sprintf("dup-%d", i/2),
				Intended: store.Hardware{NICs: []store.NIC{{MAC: mac(0x10000 + i)}}}}}, store.W{Actor: "test"})
		}()
	}
	close(start)
	wg.Wait()
	for p := 0; p < runs; p++ {
		a, b := errs[2*p], errs[2*p+1]
		var ice *store.ImportConflictError
		loser := a
		if a == nil {
			loser = b
		}
		if (a == nil) == (b == nil) || !errors.As(loser, &ice) || ice.Conflicts[0].Field != "name" {
			t.Errorf("pair %d: %v / %v, want exactly one name conflict", p, a, b)
		}
	}
	items, _, err := s.ListMachines(store.ListOptions{})
	if err != nil || len(items) != runs {
		t.Fatalf("%d machines stored (want %d): %v", len(items), runs, err)
	}
}

// TestRefusalsSurviveForwarding: a follower forwards the write; the leader's
// *ImportConflictError (with every conflict) and ErrImageInUse come back
// to the follower's caller as the same errors.
func TestRefusalsSurviveForwarding(t *testing.T) {
	c := storetest.NewCluster(t, 3)
	f := c.Nodes[c.Follower()].Store
	ctx := ctxT(t)
	w := store.W{Actor: "test"}
	img, err := f.PutImage(ctx, store.Image{Name: "os"}, w)
	if err != nil {
		t.Fatal(err)
	}
	held, err := f.ImportMachines(ctx, []store.Machine{{Name: "a", Intended: store.Hardware{Serial: "S1",
		NICs: []store.NIC{{MAC: "02:00:00:00:0f:01"}}}}}, w)
	if err != nil {
		t.Fatal(err)
	}
	m := held[0]
	m.Claim = &store.Claim{Image: img.ID}
	if _, err := f.PutMachine(ctx, m, w); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteImage(ctx, img.ID, w); !errors.Is(err, store.ErrImageInUse) {
		t.Fatalf("forwarded delete of a claimed image: %v, want ErrImageInUse", err)
	}
	m.Claim = &store.Claim{Image: "img-missing"}
	m.ResourceVersion = 0
	if _, err := f.PutMachine(ctx, m, w); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("forwarded claim of a missing image: %v, want ErrInvalid", err)
	}
	_, err = f.ImportMachines(ctx, []store.Machine{
		{Name: "a", Intended: store.Hardware{NICs: []store.NIC{{MAC: "02:00:00:00:0f:02"}}}},
		{Name: "b", Intended: store.Hardware{Serial: "s1", NICs: []store.NIC{{MAC: "02:00:00:00:0f:01"}}}}}, w)
	var ice *store.ImportConflictError
	if !errors.As(err, &ice) || !errors.Is(err, store.ErrConflict) {
		t.Fatalf("forwarded conflicting import: %v, want *ImportConflictError", err)
	}
	want := []store.Conflict{
		{Index: 0, Field: "name", Value: "a", Holder: held[0].ID, HolderName: "a", HolderIndex: -1},
		{Index: 1, Field: "serial", Value: "s1", Holder: held[0].ID, HolderName: "a", HolderIndex: -1},
		{Index: 1, Field: "macs", Value: "02:00:00:00:0f:01", Holder: held[0].ID, HolderName: "a", HolderIndex: -1},
	}
	if !reflect.DeepEqual(ice.Conflicts, want) {
		t.Fatalf("conflicts\n got %+v\nwant %+v", ice.Conflicts, want)
	}
}

// TestParseMachineMAC: the one machine-MAC rule over the shared table
// (testkit.MACCases, also run against dhcp and httpboot) and the input
// forms net.ParseMAC reads.
func TestParseMachineMAC(t *testing.T) {
	for _, c := range testkit.MACCases {
		got, err := store.ParseMachineMAC(c.MAC)
		if (err == nil) != c.Unicast {
			t.Errorf("%s (%s): err %v, want unicast %v", c.MAC, c.Why, err, c.Unicast)
		}
		if err != nil && !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: error %v does not wrap ErrInvalid", c.MAC, err)
		}
		if err == nil && got != c.MAC {
			t.Errorf("%s: normalised to %s", c.MAC, got)
		}
	}
	for in, want := range map[string]string{"52-54-00-AB-CD-EF": "52:54:00:ab:cd:ef", " 5254.00ab.cdef ": "52:54:00:ab:cd:ef"} {
		if got, err := store.ParseMachineMAC(in); err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
	for in, reason := range map[string]string{
		"02:00:00:00:00:01:02:03": "not an EUI-48 MAC address",
		"zz:00:00:00:00:01":       "not an EUI-48 MAC address",
		"01-00-5E-00-00-FB":       "a group (multicast or broadcast) address, which no NIC has",
		"00:00:00:00:00:00":       "the all-zero address, which no NIC has",
	} {
		_, err := store.ParseMachineMAC(in)
		if want := fmt.Sprintf("%q: %s", in, reason); err == nil || err.Error() != want {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}
