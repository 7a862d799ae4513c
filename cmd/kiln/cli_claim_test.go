package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln/api"
	"kiln/store"
)

func TestCLISitesRacksClaim(t *testing.T) {
	e := newCLIEnv(t)
	out := e.admin("sites", "create", "hall-1", "--description", "Hall 1", "-o", "json")
	var s store.Site
	if err := json.Unmarshal([]byte(out), &s); err != nil || s.ID == "" || s.Name != "hall-1" {
		t.Fatalf("site: %v %q", err, out)
	}
	if out := e.admin("sites", "list"); !strings.Contains(out, "Hall 1") {
		t.Fatalf("sites list:\n%s", out)
	}
	e.admin("racks", "create", "r01", "--site", s.ID, "--units", "42")
	if out := e.admin("racks", "list", "--site", s.ID); !strings.Contains(out, "r01") || !strings.Contains(out, "42") {
		t.Fatalf("racks list:\n%s", out)
	}
	if _, _, err := e.run("--token", tAdmin, "racks", "create", "r02"); err == nil || !strings.Contains(err.Error(), "site") {
		t.Fatalf("rack without --site: %v", err)
	}

	// claim: two available machines of three; all or nothing.
	img := filepath.Join(t.TempDir(), "node.img")
	if err := os.WriteFile(img, []byte("raw image bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	var im store.Image
	if err := json.Unmarshal([]byte(e.admin("images", "upload", img, "--version", "1", "-q", "-o", "json")), &im); err != nil {
		t.Fatal(err)
	}
	for i, n := range []string{"a", "b", "c"} {
		e.machine(n, 40+i, store.StateAvailable)
	}
	if _, _, err := e.run("--token", tAdmin, "machines", "claim", "--role", "worker", "--count", "2"); err == nil || !strings.Contains(err.Error(), "image") {
		t.Fatalf("claim without --image: %v", err)
	}
	_, _, err := e.run("--token", tAdmin, "machines", "claim", "--role", "worker", "--image", im.ID, "--count", "5")
	if err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("claiming more than available: %v", err)
	}
	var res api.ClaimResponse
	out = e.admin("machines", "claim", "--role", "worker", "--image", im.ID, "--count", "2", "-o", "json")
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Items) != 2 {
		t.Fatalf("claim: %v %q", err, out)
	}
	for _, m := range res.Items {
		if m.Claim == nil || m.Claim.Image != im.ID || m.Claim.Role != "worker" {
			t.Fatalf("claimed machine %s: claim %+v", m.ID, m.Claim)
		}
	}
}
