package appliance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kiln.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadConfigUnknownKeyNamesItself(t *testing.T) {
	cases := map[string]struct{ body, key string }{
		"top level": {"node_id: a\nflavour: x\n", `"flavour"`},
		"nested":    {"boot:\n  interface: eth1\n  dhcpp: {}\n", `"dhcpp"`},
		"deep":      {"boot:\n  dhcp:\n    subnets:\n      - cidr: 10.0.0.0/24\n        gateway: 10.0.0.1\n", `"gateway"`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := LoadConfig(writeConfig(t, c.body))
			if err == nil {
				t.Fatal("unknown key accepted")
			}
			if !strings.Contains(err.Error(), c.key) || !strings.Contains(err.Error(), "unknown key") {
				t.Fatalf("error does not name the key %s: %v", c.key, err)
			}
		})
	}
}

func TestLoadConfigEmptyFileGivesDefaults(t *testing.T) {
	cfg, err := LoadConfig(writeConfig(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.API.Addr != DefaultAPIAddr || !cfg.Raft.Bootstrap || cfg.NodeID != DefaultNodeID {
		t.Fatalf("defaults not applied: %+v", cfg)
	}
}

func TestExampleConfigLoadsAndValidates(t *testing.T) {
	cfg, err := LoadConfig("../deploy/examples/kiln.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Boot.TFTPAddr != "10.99.0.1:69" || cfg.Boot.DHCP.Subnets[0].LeaseTime.Hours() != 1 {
		t.Fatalf("derived values wrong: %+v", cfg.Boot)
	}
}

func TestValidateNamesTheKey(t *testing.T) {
	cases := []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) { c.NodeID = "" }, "node_id"},
		{func(c *Config) { c.Boot.UnknownMachines = "maybe" }, "boot.unknown_machines"},
		{func(c *Config) { c.Log.Level = "loud" }, "log.level"},
		{func(c *Config) { c.Boot.Interface = "eth1" }, "boot.server_ip"},
		{func(c *Config) { c.Boot.ServerIP = "10.0.0.300" }, "boot.server_ip"},
		{func(c *Config) { c.Boot.DHCP.Enabled = true }, "boot.dhcp.enabled"},
		{func(c *Config) {
			c.Boot.Interface, c.Boot.ServerIP, c.Boot.DHCP.Enabled = "eth1", "10.0.0.1", true
		}, "boot.dhcp.subnets"},
	}
	for _, c := range cases {
		cfg := DefaultConfig()
		c.mut(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error naming %s, got %v", c.want, err)
		}
	}
}
