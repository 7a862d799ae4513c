package api_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "kiln/api"
	"kiln/store"
)

// TestOverRealStore runs the machine and site routes end to end over the
// real domain: create, paginate, filter, CAS updates (the API's and the
// store's) and the events long-poll.
func TestOverRealStore(t *testing.T) {
	if testing.Short() {
		t.Skip("short: starts a raft store")
	}
	h := newHarness(t)
	st := h.st

	var first store.Machine
	for i := 0; i < 12; i++ {
		r := h.do("POST", "/v1/machines", adminTok, MachineSpec{Name: fmt.Sprintf("n%02d", i), Rack: "r1",
			Labels:   map[string]string{"zone": map[bool]string{true: "a", false: "b"}[i%3 == 0]},
			Intended: store.Hardware{Serial: fmt.Sprintf("S%02d", i), NICs: []store.NIC{{MAC: fmt.Sprintf("52:54:00:AA:00:%02X", i)}}}})
		h.want(r, 201, "")
		if i == 0 {
			r.into(t, &first)
		}
	}
	if first.ID == "" || first.State != store.StateRegistered || first.Intended.NICs[0].MAC != "52:54:00:aa:00:00" {
		t.Fatalf("created %+v", first)
	}
	// Same MAC again: the store refuses (409 conflict or 400), never 500.
	r := h.do("POST", "/v1/machines", adminTok, MachineSpec{Intended: store.Hardware{NICs: []store.NIC{{MAC: "52:54:00:aa:00:00"}}}})
	if r.code != 409 && r.code != 400 {
		t.Fatalf("duplicate MAC: %d %s", r.code, r.body)
	}

	seen, after := 0, ""
	for pages := 0; ; pages++ {
		var ml MachineList
		h.do("GET", "/v1/machines?limit=5&after="+after, viewerTok, nil).into(t, &ml)
		seen += len(ml.Items)
		if ml.Next == "" {
			if pages != 2 {
				t.Fatalf("pages %d", pages+1)
			}
			break
		}
		after = ml.Next
	}
	if seen != 12 {
		t.Fatalf("paginated %d of 12", seen)
	}
	var ml MachineList
	h.do("GET", "/v1/machines?state=registered&label=zone%3Da", viewerTok, nil).into(t, &ml)
	if len(ml.Items) != 4 {
		t.Fatalf("filter: %d", len(ml.Items))
	}

	// Long-poll for the next event, then cause it with a PATCH.
	var el EventList
	h.do("GET", "/v1/events?after=0&limit=1000", viewerTok, nil).into(t, &el)
	if len(el.Events) < 12 {
		t.Fatalf("events %d", len(el.Events))
	}
	cursor := el.Next
	done := make(chan resp, 1)
	go func() { done <- h.do("GET", fmt.Sprintf("/v1/events?after=%d&wait=20s", cursor), viewerTok, nil) }()
	time.Sleep(200 * time.Millisecond)
	r = h.do("PATCH", "/v1/machines/"+first.ID, adminTok, map[string]any{"resource_version": first.ResourceVersion, "name": "renamed"})
	h.want(r, 200, "")
	var upd store.Machine
	r.into(t, &upd)
	select {
	case lp := <-done:
		h.want(lp, 200, "")
		lp.into(t, &el)
		if len(el.Events) == 0 || el.Events[0].Index <= cursor {
			t.Fatalf("long-poll %+v", el)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("long-poll did not return after the write")
	}
	// Stale version: 409 from the API's check and from the store's CAS.
	h.want(h.do("PATCH", "/v1/machines/"+first.ID, adminTok, map[string]any{"resource_version": first.ResourceVersion, "name": "late"}), 409, CodeConflict)
	if _, err := st.PutMachine(context.Background(), upd, store.W{Actor: "other"}); err != nil {
		t.Fatal(err)
	}
	h.want(h.do("PATCH", "/v1/machines/"+first.ID, adminTok, map[string]any{"resource_version": upd.ResourceVersion, "name": "late"}), 409, CodeConflict)

	r = h.do("POST", "/v1/sites", adminTok, SiteSpec{ID: "fra1", Name: "Frankfurt"})
	h.want(r, 201, "")
	var site store.Site
	r.into(t, &site)
	h.want(h.do("PUT", "/v1/sites/fra1", adminTok, SiteSpec{ResourceVersion: site.ResourceVersion, Name: "F2"}), 200, "")
	h.want(h.do("PUT", "/v1/sites/fra1", adminTok, SiteSpec{ResourceVersion: site.ResourceVersion, Name: "F3"}), 409, CodeConflict)

	var ss SiteStatus
	h.do("GET", "/v1/site/status", viewerTok, nil).into(t, &ss)
	if ss.Total != 12 || ss.Counts[store.StateRegistered] != 12 || !ss.Raft.IsLeader {
		t.Fatalf("status %+v", ss)
	}
	h.want(h.do("GET", "/readyz", "", nil), 200, "")
}

// noBarrier is a follower that cannot reach the leader for a barrier.
type noBarrier struct{ Backend }

func (noBarrier) Barrier(context.Context) error {
	return fmt.Errorf("barrier: %w", &store.NotLeaderError{LeaderID: "kiln-2"})
}

// ?consistent=true reads after the backend's Barrier: over the real domain
// it answers as a plain read; a barrier that cannot reach the leader is
// 503 not_leader, never a stale answer.
func TestConsistentRead(t *testing.T) {
	h := newHarness(t)
	m := h.machine("c1", "52:54:00:00:00:c1", store.StateRegistered, nil)
	var got Machine
	r := h.do("GET", "/v1/machines/"+m.ID+"?consistent=true", viewerTok, nil)
	h.want(r, 200, "")
	r.into(t, &got)
	if got.ID != m.ID || got.ResourceVersion != m.ResourceVersion {
		t.Fatalf("consistent read %+v", got)
	}
	h.want(h.do("GET", "/v1/machines?consistent=true", viewerTok, nil), 200, "")
	h.want(h.do("GET", "/v1/machines?consistent=perhaps", viewerTok, nil), 400, CodeInvalid)
	f := newHarness(t, func(b Backend) Backend { return noBarrier{b} })
	f.machine("c1", "52:54:00:00:00:c1", store.StateRegistered, nil)
	f.want(f.do("GET", "/v1/machines?consistent=true", viewerTok, nil), 503, CodeNotLeader)
	f.want(f.do("GET", "/v1/machines", viewerTok, nil), 200, "")
}
