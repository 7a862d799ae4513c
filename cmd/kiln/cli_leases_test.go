package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestCLILeases: `kiln leases` (table and -o json, --consistent) reads a
// served node's lease view through GET /v1/leases and names the node.
// (The route's content over committed bindings: api TestLeasesRoute; with
// real DHCP clients on three nodes: deploy/lab/e2e TestE2EHA.)
func TestCLILeases(t *testing.T) {
	n := newServeNode(t, "leases-a", nil)
	s := n.start(t)
	out, _ := kilnCLI(t, n.bin, s, false, "leases")
	if !strings.HasPrefix(out, "IP") || !strings.Contains(out, "MAC") || !strings.Contains(out, "EXPIRES") {
		t.Fatalf("leases table:\n%s", out)
	}
	out, _ = kilnCLI(t, n.bin, s, false, "leases", "--consistent", "-o", "json")
	var ll struct {
		Node  string            `json:"node"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &ll); err != nil || ll.Node != "leases-a" || ll.Items == nil || len(ll.Items) != 0 {
		t.Fatalf("leases -o json: %q (%v)", out, err)
	}
}
