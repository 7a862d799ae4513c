package api_test

import (
	"bytes"
	"encoding/json"
	"testing"

	. "kiln/api"
	"kiln/store"
)

// TestMachineViewByRole: a claim's user-data and join data reach operators
// and admins only; no answer carries a boot-token digest.
func TestMachineViewByRole(t *testing.T) {
	h := newHarness(t)
	m := h.machine("v1", "52:54:00:00:00:71", store.StateAvailable, nil)
	im := h.image([]byte("disk"))
	cl := Claim{Image: im.ID, Role: "worker", UserData: "#cloud-config\npassword: hunter2\n", JoinData: "join-secret",
		SSHKeys: []string{"ssh-ed25519 AAAA test"}}
	h.want(h.do("POST", "/v1/machines/"+m.ID+"/provision", operatorTok, ProvisionRequest{Claim: cl}), 202, "")

	for _, c := range []struct {
		tok  string
		sees bool
	}{{viewerTok, false}, {operatorTok, true}, {adminTok, true}} {
		for _, path := range []string{"/v1/machines/" + m.ID, "/v1/machines"} {
			r := h.do("GET", path, c.tok, nil)
			h.want(r, 200, "")
			var got Machine
			if path == "/v1/machines" {
				var l MachineList
				r.into(t, &l)
				if len(l.Items) != 1 {
					t.Fatalf("%s: %d items", path, len(l.Items))
				}
				got = l.Items[0]
			} else {
				r.into(t, &got)
			}
			if got.Claim == nil || got.Claim.Image != im.ID || len(got.Claim.SSHKeys) != 1 {
				t.Fatalf("%s as %s: claim %+v", path, c.tok, got.Claim)
			}
			if seen := got.Claim.UserData == cl.UserData && got.Claim.JoinData == cl.JoinData; seen != c.sees {
				t.Fatalf("%s as %s: user_data/join_data shown=%v, want %v", path, c.tok, seen, c.sees)
			}
			if !c.sees && (bytes.Contains(r.body, []byte("hunter2")) || bytes.Contains(r.body, []byte("join-secret"))) {
				t.Fatalf("%s as %s: body leaks bootstrap data: %s", path, c.tok, r.body)
			}
			if bytes.Contains(r.body, []byte("boot_token")) {
				t.Fatalf("%s: body names a boot token: %s", path, r.body)
			}
		}
	}
}

// TestOpenAPIMachineHasNoTokenField: the reflected schema of a machine has
// no boot-token property (redaction by construction).
func TestOpenAPIMachineHasNoTokenField(t *testing.T) {
	js, err := json.Marshal(OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]any `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(js, &doc); err != nil {
		t.Fatal(err)
	}
	props := doc.Components.Schemas["Machine"].Properties
	if len(props) == 0 || props["state"] == nil || props["claim"] == nil {
		t.Fatalf("Machine schema properties %v", props)
	}
	for k := range props {
		if bytes.Contains([]byte(k), []byte("token")) {
			t.Fatalf("Machine schema has property %q", k)
		}
	}
}
