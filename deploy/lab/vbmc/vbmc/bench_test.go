package vbmc_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/bmc"
	"kiln/deploy/lab/benchline"
	"kiln/deploy/lab/vbmc/vbmc"
)

// TestBenchRedfishPowerState compares Controller.PowerState over Redfish (bmclib gofish
// provider, Basic auth, verified TLS; every call opens its client, TLS handshake and
// service root included) with one curl GET of the ComputerSystem against the same vbmc.
// Each curl is a new process (a new TLS handshake too): that start-up is part of the
// peer's figure (note=curl-process-per-call).
func TestBenchRedfishPowerState(t *testing.T) {
	benchline.Need(t, false, "curl")
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatal(err)
	}
	srv, tg := startVBMC(t, vbmc.Config{}, nil)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, srv.CACertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newController(t, bmc.Config{RedfishBasicAuth: true, NoRetries: true}, nil)
	ctx := context.Background()
	const n = 30
	t0 := time.Now()
	for i := 0; i < n; i++ {
		if _, err := c.PowerState(ctx, tg); err != nil {
			t.Fatal(err)
		}
	}
	kiln := time.Since(t0).Seconds() / n
	t0 = time.Now()
	for i := 0; i < n; i++ {
		out, err := exec.Command(curl, "-s", "--cacert", ca, "-u", testUser+":"+testPass,
			"https://"+srv.Addr()+"/redfish/v1/Systems/1").Output()
		if err != nil || !strings.Contains(string(out), `"PowerState"`) {
			t.Fatalf("curl: %v %s", err, out)
		}
	}
	peer := time.Since(t0).Seconds() / n
	benchline.Print(t, benchline.Line{Name: "redfish_power_state_seconds", Unit: "s", Kiln: kiln, Peer: &benchline.Peer{What: "curl", Value: peer},
		Fields: []benchline.Field{{Key: "note", Value: "curl-process-per-call"}}})
}
