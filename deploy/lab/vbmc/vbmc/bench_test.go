package vbmc_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/bmc"
	"kiln/deploy/lab/vbmc/vbmc"
)

// TestBenchRedfishPowerState compares Controller.PowerState over Redfish (bmclib gofish
// provider, Basic auth, verified TLS) with one curl GET of the ComputerSystem against the
// same vbmc.
func TestBenchRedfishPowerState(t *testing.T) {
	if os.Getenv("KILN_BENCH") != "1" {
		t.Skip("benchmark: set KILN_BENCH=1")
	}
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("needs curl")
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
	fmt.Printf("bench: redfish_power_state_seconds kiln=%.4f peer=%.4f unit=s ratio=%.2f\n", kiln, peer, kiln/peer)
}
