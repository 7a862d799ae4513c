package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"kiln/api"
	"kiln/store"
)

// `kiln campaign plan|create|start|status|halt|resume` against the real
// domain (the controller's loop is not running: nothing is touched), and
// the offline plan of a synthetic fleet.
func TestCLICampaign(t *testing.T) {
	e := newCLIEnv(t)
	ctx := context.Background()
	img, err := e.st.PutImage(ctx, store.Image{Name: "os-2.raw", Version: "2", Format: "raw", SHA256: hex.EncodeToString(make([]byte, 32)), Size: 1 << 20},
		store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 8; i++ {
		m := e.machine(fmt.Sprintf("web-%d", i), 20+i, store.StateProvisioned)
		m.Rack = fmt.Sprintf("r%d", i/4+1)
		m.Claim = &store.Claim{Image: img.ID, Role: []string{"x", "y"}[i%2]}
		if _, err := e.st.PutMachine(ctx, m, store.W{}); err != nil {
			t.Fatal(err)
		}
	}
	// The server's plan of the selected machines: 4 per claim, 1 at once (5 % rounds to 0) → 4 waves.
	out, _, err := e.run("--token", tViewer, "campaign", "plan", "--image", img.ID, "--claim", "x", "--claim", "y")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"MACHINES:       8", "WAVES:          4", "cluster x: 4 machines, 5% = 1 out at once → 4 waves", "TOTAL:          2h8m"} {
		if !strings.Contains(out, want) {
			t.Fatalf("plan lacks %q:\n%s", want, out)
		}
	}
	if _, _, err := e.run("--token", tViewer, "campaign", "create", "os-2", "--image", img.ID); err == nil {
		t.Fatal("a viewer created a campaign")
	}
	out = e.admin("campaign", "create", "os-2", "--image", img.ID, "--claim", "x", "--claim", "y", "--max-failures", "1")
	if !strings.Contains(out, "STATE:     planned") || !strings.Contains(out, "WAVE:      0 of 4") {
		t.Fatalf("create:\n%s", out)
	}
	if _, _, err := e.run("--token", tAdmin, "campaign", "resume", "os-2"); err == nil {
		t.Fatal("resume of a planned campaign")
	}
	e.admin("campaign", "start", "os-2", "--reason", "CHG-1")
	e.admin("campaign", "halt", "os-2", "--reason", "hold for the weekend")
	js := e.admin("-o", "json", "campaign", "status", "os-2")
	var c api.Campaign
	if err := json.Unmarshal([]byte(js), &c); err != nil {
		t.Fatal(err, js)
	}
	if c.State != "halted" || c.Limits.MaxFailures != 1 || len(c.Machines) != 8 || c.Counts["pending"] != 8 || !strings.Contains(c.Message, "token:admin") {
		t.Fatalf("status %+v", c)
	}
	e.admin("campaign", "resume", "os-2")
	if out := e.admin("campaign", "status"); !strings.Contains(out, "os-2") || !strings.Contains(out, "running") {
		t.Fatalf("list:\n%s", out)
	}
	var evs []string
	for _, ev := range allStoreEvents(t, e.st) {
		if strings.HasPrefix(ev.Subject, "campaign/") {
			evs = append(evs, ev.Kind+":"+ev.Actor)
		}
	}
	if got := strings.Join(evs, " "); got != "campaign_created:token:admin campaign_running:token:admin campaign_halted:token:admin campaign_running:token:admin" {
		t.Fatalf("events %s", got)
	}
	// Offline: 12,000 servers in 6 sites.
	out = e.admin("campaign", "plan", "--fleet", "sites=6,racks=50,per-rack=40,clusters=4")
	for _, want := range []string{"MACHINES:       12000", "WAVES:          20", "TOTAL:          10h40m", "CRITICAL PATH:  site s1: 20 waves × 32m"} {
		if !strings.Contains(out, want) {
			t.Fatalf("fleet plan lacks %q:\n%s", want, out)
		}
	}
}

func allStoreEvents(t *testing.T, st *store.Store) []store.Event {
	t.Helper()
	var out []store.Event
	var after uint64
	for {
		page, err := st.Events(after, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			return out
		}
		out = append(out, page...)
		after = page[len(page)-1].Index
	}
}
