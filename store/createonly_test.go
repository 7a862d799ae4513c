package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"kiln/store"
	"kiln/store/storetest"
)

// TestCreateOfTakenIDRefused: a create (ResourceVersion 0) of a site or
// rack whose chosen ID the store holds is ErrConflict and leaves the stored
// record as it was; of 8 concurrent creates of one ID exactly one succeeds
// (the check is inside the apply). An update with the current
// ResourceVersion still works.
func TestCreateOfTakenIDRefused(t *testing.T) {
	ctx := context.Background()
	s := storetest.NewLocal(t)
	w := store.W{Actor: "test"}

	site, err := s.PutSite(ctx, store.Site{Meta: store.Meta{ID: "hall1"}, Name: "Hall 1"}, w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutSite(ctx, store.Site{Meta: store.Meta{ID: "hall1"}, Name: "other"}, w); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second create of site hall1: %v, want ErrConflict", err)
	}
	if got, _ := s.GetSite("hall1"); got.Name != "Hall 1" || got.ResourceVersion != site.ResourceVersion {
		t.Fatalf("site after the refused create: %+v, want %+v", got, site)
	}
	site.Name = "Hall one"
	if _, err := s.PutSite(ctx, site, w); err != nil {
		t.Fatalf("update with the current resource_version: %v", err)
	}

	rack, err := s.PutRack(ctx, store.Rack{Meta: store.Meta{ID: "r01"}, Site: "hall1", Name: "R01", Units: 42}, w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutRack(ctx, store.Rack{Meta: store.Meta{ID: "r01"}, Site: "hall1", Name: "R01b"}, w); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second create of rack r01: %v, want ErrConflict", err)
	}
	if got, _ := s.GetRack("r01"); got.Name != "R01" || got.ResourceVersion != rack.ResourceVersion {
		t.Fatalf("rack after the refused create: %+v, want %+v", got, rack)
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	won, refused := 0, 0
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.PutSite(ctx, store.Site{Meta: store.Meta{ID: "race"}, Name: "racer"}, w)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case errors.Is(err, store.ErrConflict):
				refused++
			default:
				t.Errorf("concurrent create: %v", err)
			}
		}()
	}
	wg.Wait()
	if won != 1 || refused != 7 {
		t.Fatalf("8 concurrent creates of one ID: %d succeeded, %d refused; want 1 and 7", won, refused)
	}
}
