package appliance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/appliance/lifecycle"
)

// The burn_in section: the example loads (mode off, the default policy's
// documented values), a models entry inherits what it leaves out, and bad
// values are refused by the one check (lifecycle.CheckBurnIn) naming the key.
func TestBurnInConfig(t *testing.T) {
	cfg, err := LoadConfig("../deploy/examples/kiln.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.BurnIn.lifecycle()
	if b.Mode != lifecycle.BurnInOff || b.Default.CPUTime != lifecycle.DefaultBurnInCPUTime ||
		b.Default.MemoryFraction != lifecycle.DefaultBurnInMemoryFraction || b.Default.DiskBytes != lifecycle.DefaultBurnInDiskBytes ||
		b.Default.NICs != lifecycle.DefaultBurnInNICs || len(b.Default.Tests) != 4 {
		t.Fatalf("example burn_in %+v", b)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	write := func(yaml string) Config {
		p := filepath.Join(t.TempDir(), "k.yaml")
		if err := os.WriteFile(p, []byte(yaml+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := LoadConfig(p)
		if err != nil {
			t.Fatalf("%s: %v", yaml, err)
		}
		return c
	}
	c := write("burn_in: {mode: required, deadline: 2m, default: {cpu_time: 5s, memory_time: 5s, disk_time: 5s, nic_wait: 5s}, " +
		"models: [{vendor: QEMU, product: Standard PC, tests: [cpu, nic], cpu_time: 20s}]}")
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if m := c.BurnIn.lifecycle().Models[0]; m.Vendor != "QEMU" || m.CPUTime != 20*time.Second || strings.Join(m.Tests, ",") != "cpu,nic" {
		t.Fatalf("model %+v", m)
	}
	if d := c.BurnIn.stepDeadlines()["burn_in"]; d != 2*time.Minute {
		t.Fatalf("deadline %v", d)
	}
	for yaml, key := range map[string]string{
		"burn_in: {mode: maybe}":                                      "burn_in.mode",
		"burn_in: {deadline: -1s}":                                    "burn_in.deadline",
		"burn_in: {default: {tests: [gpu]}}":                          "burn_in.default.tests",
		"burn_in: {default: {memory_fraction: 1.5}}":                  "burn_in.default.memory_fraction",
		"burn_in: {default: {nics: most}}":                            "burn_in.default.nics",
		"burn_in: {deadline: 1m}":                                     "step burn_in's deadline is 1m0s",
		"burn_in: {models: [{vendor: QEMU}]}":                         "burn_in.models[0]",
		"burn_in: {models: [{vendor: a, product: b, nic_wait: -1s}]}": "burn_in.models[0].nic_wait",
	} {
		c := write(yaml)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v, want an error naming %s", yaml, err, key)
		}
	}
}
