package appliance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The remediation section: the example's values load and pass, and every
// bad value is refused by the one check (lifecycle.RemediationConfig.Validate)
// naming its key.
func TestRemediationConfig(t *testing.T) {
	cfg, err := LoadConfig("../deploy/examples/kiln.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Remediation.lifecycle()
	if r.PowerCycleTimeout != 10*time.Minute || r.DrainPolicy != "proceed" || r.BrakeRack.MaxPercent != 50 || r.HealthPollWorkers != 4 {
		t.Fatalf("example remediation %+v", r)
	}
	for yaml, key := range map[string]string{
		"remediation: {mode: sometimes}":                        "remediation.mode",
		"remediation: {hold: -1s}":                              "remediation.hold",
		"remediation: {drain: {policy: ask}}":                   "remediation.drain.policy",
		"remediation: {steps: {power_cycle: -1m}}":              "remediation.steps.power_cycle",
		"remediation: {brake: {rack: {max_percent: 150}}}":      "remediation.brake.rack",
		"remediation: {health: {workers: 1000}}":                "remediation.health.workers",
		"remediation: {spares: {low_by_class: {gpu: -1}}}":      "remediation.spares.low_by_class",
		"remediation: {health: {backoff: 5m, max_backoff: 1m}}": "remediation.health.max_backoff",
	} {
		p := filepath.Join(t.TempDir(), "k.yaml")
		if err := os.WriteFile(p, []byte(yaml+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := LoadConfig(p)
		if err != nil {
			t.Fatalf("%s: %v", yaml, err)
		}
		err = c.Validate()
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v, want an error naming %s", yaml, err, key)
		}
	}
}
