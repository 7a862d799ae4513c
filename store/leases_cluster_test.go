package store_test

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"

	"kiln/store"
	"kiln/store/storetest"
)

// leaseView is what a watcher built from WatchLeases: address → record.
type leaseView struct {
	mu sync.Mutex
	m  map[string]store.Lease
}

func watch(t *testing.T, s *store.Store) *leaseView {
	t.Helper()
	v := &leaseView{m: map[string]store.Lease{}}
	stop, err := s.WatchLeases(func(all []store.Lease) {
		v.mu.Lock()
		defer v.mu.Unlock()
		clear(v.m)
		for _, l := range all {
			v.m[l.IP] = l
		}
	}, func(ls []store.Lease) {
		v.mu.Lock()
		defer v.mu.Unlock()
		for _, l := range ls {
			v.m[l.IP] = l
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return v
}

func (v *leaseView) list() []store.Lease {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]store.Lease, 0, len(v.m))
	for _, l := range v.m {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].IP < out[j].IP })
	return out
}

// Three nodes, every one trying to bind the same 30 addresses for clients
// of its own at the same time (followers forward): each address is bound
// exactly once, the others are refused with *AddressTakenError naming the
// winner, and every node's watcher view equals its store's address view
// (the same on all nodes) — also after the leader is stopped and the
// clients of the survivors race again for the addresses it held.
func TestClusterBindLeasesOneHolderPerAddress(t *testing.T) {
	c := storetest.NewCluster(t, 3)
	views := make([]*leaseView, 3)
	for i, nd := range c.Nodes {
		views[i] = watch(t, nd.Store)
	}
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	race := func(nodes []int, round int, until time.Time) map[string]string {
		var mu sync.Mutex
		won := map[string]string{}
		var wg sync.WaitGroup
		for _, i := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ls := make([]store.Lease, 30)
				for k := range ls {
					ls[k] = store.Lease{MAC: fmt.Sprintf("02:00:00:%02x:%02x:%02x", round, i, k), IP: fmt.Sprintf("10.96.0.%d", 100+k), State: store.LeaseBound, Expiry: until}
				}
				// Half as one batch, half one change per command.
				var errs []error
				b, err := c.Nodes[i].Store.BindLeases(ctxT(t), ls[:15])
				if err != nil {
					t.Errorf("node %d: %v", i, err)
					return
				}
				errs = append(errs, b...)
				for _, l := range ls[15:] {
					e, err := c.Nodes[i].Store.BindLeases(ctxT(t), []store.Lease{l})
					if err != nil {
						t.Errorf("node %d: %v", i, err)
						return
					}
					errs = append(errs, e...)
				}
				mu.Lock()
				defer mu.Unlock()
				for k, e := range errs {
					var te *store.AddressTakenError
					switch {
					case e == nil:
						if w, dup := won[ls[k].IP]; dup {
							t.Errorf("%s bound twice: to %s and %s", ls[k].IP, w, ls[k].MAC)
						}
						won[ls[k].IP] = ls[k].MAC
					case errors.As(e, &te):
					default:
						t.Errorf("node %d %s: %v", i, ls[k].IP, e)
					}
				}
			}()
		}
		wg.Wait()
		return won
	}
	check := func(nodes []int, won map[string]string) {
		t.Helper()
		var first []store.Lease
		for _, i := range nodes {
			s := c.Nodes[i].Store
			if err := s.Barrier(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			got, err := s.AddressLeases()
			if err != nil {
				t.Fatal(err)
			}
			sort.Slice(got, func(i, j int) bool { return got[i].IP < got[j].IP })
			deadline := time.Now().Add(5 * time.Second)
			for !reflect.DeepEqual(views[i].list(), got) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if v := views[i].list(); !reflect.DeepEqual(v, got) {
				t.Fatalf("node %d: watcher view differs from the store:\n%v\n%v", i, v, got)
			}
			if first == nil {
				first = got
			} else if !reflect.DeepEqual(first, got) {
				t.Fatalf("node %d's address view differs from node %d's", i, nodes[0])
			}
			for _, l := range got {
				if won[l.IP] != "" && won[l.IP] != l.MAC {
					t.Fatalf("%s: store holds %s, the committed winner was %s", l.IP, l.MAC, won[l.IP])
				}
			}
		}
	}
	won := race([]int{0, 1, 2}, 1, exp)
	if len(won) != 30 {
		t.Fatalf("%d of 30 addresses bound", len(won))
	}
	check([]int{0, 1, 2}, won)

	// The leader goes; its clients' addresses are still held (the
	// survivors' new clients are refused), then released and raced for.
	l := c.Leader()
	c.Stop(l)
	var rest []int
	for i := range c.Nodes {
		if i != l {
			rest = append(rest, i)
		}
	}
	c.Leader()
	if again := race(rest, 2, exp); len(again) != 0 {
		t.Fatalf("addresses bound again while held: %v", again)
	}
	var rel []store.Lease
	for ip, mac := range won {
		rel = append(rel, store.Lease{MAC: mac, IP: ip, State: store.LeaseReleased, Expiry: exp}) // names the binding it ends
	}
	if errs, err := c.Nodes[rest[0]].Store.BindLeases(ctxT(t), rel); err != nil {
		t.Fatal(err)
	} else {
		for _, e := range errs {
			if e != nil {
				t.Fatalf("release by the holder: %v", e)
			}
		}
	}
	won = race(rest, 3, exp)
	if len(won) != 30 {
		t.Fatalf("after release: %d of 30 addresses bound", len(won))
	}
	check(rest, won)
}
