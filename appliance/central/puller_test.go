package central_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/api"
	"kiln/api/client"
	"kiln/appliance/central"
	"kiln/appliance/lifecycle"
	"kiln/appliance/lifecycle/lifecycletest"
	"kiln/store"
)

const viewerTok = "central-test-viewer"

// TestPullerFollowsAndResumes: a real API over a real store; the puller
// follows the feed, is stopped, the site writes more, the puller is
// started again on the same state file, and its copy equals the site's
// feed event for event (no gap, no duplicate).
func TestPullerFollowsAndResumes(t *testing.T) {
	d := lifecycletest.New(t, func(c *lifecycle.Config) { c.Inspection = lifecycle.InspectManual })
	srv, err := api.New(api.Config{Tokens: []api.TokenSpec{
		{Name: "admin", Role: api.RoleAdmin, SHA256: api.HashToken("central-test-admin")},
		{Name: "viewer", Role: api.RoleViewer, SHA256: api.HashToken(viewerTok)},
	}, ErrorClasses: lifecycletest.ErrorClasses()}, d.Backend(), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	admin, _ := client.New(client.Config{Server: hs.URL, Token: "central-test-admin"})
	viewer, _ := client.New(client.Config{Server: hs.URL, Token: viewerTok})
	ctx := context.Background()
	write := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := admin.CreateSite(ctx, api.SiteSpec{ID: fmt.Sprintf("s-%d", i), Name: fmt.Sprintf("site %d", i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	head := func() uint64 {
		var after uint64
		for {
			el, err := viewer.Events(ctx, client.EventQuery{After: after, Limit: 1000})
			if oldest, ok := client.CursorExpired(err); ok {
				after = oldest
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(el.Events) == 0 {
				return after
			}
			after = el.Next
		}
	}
	cfg := central.Config{Sites: []central.Site{{Name: "a", Server: hs.URL, Token: viewerTok}},
		StatePath: filepath.Join(t.TempDir(), "c.db"), Wait: time.Second, Limit: 7, StatusEvery: 200 * time.Millisecond,
		Log: slog.New(slog.DiscardHandler)}
	follow := func() {
		p, err := central.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = p.Run(rctx); close(done) }()
		want := head()
		deadline := time.Now().Add(20 * time.Second)
		for p.Lag()[0].Cursor < want {
			if time.Now().After(deadline) {
				t.Fatalf("puller at %+v, site head %d", p.Lag()[0], want)
			}
			time.Sleep(20 * time.Millisecond)
		}
		l := p.Lag()[0]
		if !l.Reachable || l.Errors != 0 {
			t.Errorf("lag %+v: want reachable, no errors", l)
		}
		cancel()
		<-done
		p.Close()
	}
	write(0, 20)
	follow()
	write(20, 45)
	follow()

	cp, err := central.ReadCopy(cfg.StatePath, "a")
	if err != nil {
		t.Fatal(err)
	}
	var site []api.Event
	var after uint64
	for {
		el, err := viewer.Events(ctx, client.EventQuery{After: after, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(el.Events) == 0 {
			break
		}
		site = append(site, el.Events...)
		after = el.Next
	}
	if len(site) < 45 || len(cp.Events) != len(site) {
		t.Fatalf("central %d events, site %d (want ≥ 45, equal)", len(cp.Events), len(site))
	}
	for i := range site {
		a, _ := json.Marshal(site[i])
		b, _ := json.Marshal(cp.Events[i])
		if string(a) != string(b) {
			t.Fatalf("event %d: site %s, central %s", i, a, b)
		}
	}
	if cp.Status == nil || len(cp.Resyncs) != 0 {
		t.Errorf("status %v, resyncs %v: want a status, no resync", cp.Status, cp.Resyncs)
	}

	// The site trims past the central's cursor while it is away: the
	// puller gets 410 cursor_expired, stores the site status and the gap,
	// and follows from oldest_cursor.
	held := head()
	write(45, 60)
	trimTo := held + 5
	if err := d.Store.TrimEvents(ctx, trimTo, store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	write(60, 65)
	follow()
	cp, err = central.ReadCopy(cfg.StatePath, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(cp.Resyncs) != 1 || cp.Resyncs[0].From != held || cp.Resyncs[0].To != trimTo-1 {
		t.Fatalf("resyncs %+v: want one, from %d to %d", cp.Resyncs, held, trimTo-1)
	}
	var later []api.Event
	after = trimTo - 1
	for {
		el, err := viewer.Events(ctx, client.EventQuery{After: after, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(el.Events) == 0 {
			break
		}
		later = append(later, el.Events...)
		after = el.Next
	}
	want := append(append([]api.Event{}, site...), later...)
	if len(later) == 0 || len(cp.Events) != len(want) {
		t.Fatalf("after the resync: central %d events, want %d (%d before the gap, %d after)", len(cp.Events), len(want), len(site), len(later))
	}
	for i := range want {
		a, _ := json.Marshal(want[i])
		b, _ := json.Marshal(cp.Events[i])
		if string(a) != string(b) {
			t.Fatalf("event %d after the resync: site %s, central %s", i, a, b)
		}
	}
}
