package appliance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
		// Values the services used to reject only after the store was
		// created on disk, and without the key's name (or with the wrong
		// token index: the admin token is prepended).
		{func(c *Config) { c.API.Addr = "notanaddr" }, "api.addr"},
		{func(c *Config) { c.API.Addr = "127.0.0.1:99999" }, "api.addr"},
		{func(c *Config) { c.Raft.Addr = "127.0.0.1" }, "raft.addr"},
		{func(c *Config) { c.Boot.HTTPAddr = "10.0.0.1:http" }, "boot.http_addr"},
		{func(c *Config) { c.API.Tokens = []TokenSpec{{Name: "x", Role: "god", SHA256: strings.Repeat("a", 64)}} }, "api.tokens[0].role"},
		{func(c *Config) { c.API.Tokens = []TokenSpec{{Name: "x", Role: "viewer", SHA256: "abc"}} }, "api.tokens[0].sha256"},
		{func(c *Config) { c.API.TLSCert = "/nonexistent.crt" }, "api.tls_cert and api.tls_key"},
		{func(c *Config) { c.API.TLSCert, c.API.TLSKey = "/nonexistent.crt", "/nonexistent.key" }, "api.tls_cert"},
		{func(c *Config) { c.BMC.Timeout = -time.Second }, "bmc.timeout"},
		{func(c *Config) { c.BMC.Concurrency = -1 }, "bmc.concurrency"},
		{func(c *Config) { c.Lifecycle.StepTimeout = -time.Second }, "lifecycle.step_timeout"},
		{func(c *Config) {
			c.Boot.DHCP.Subnets = []SubnetConfig{{CIDR: "10.0.0.0/24", PoolStart: "10.0.0.200", PoolEnd: "10.0.0.100"}}
		}, "pool_start 10.0.0.200 is after"},
		{func(c *Config) {
			c.Boot.DHCP.Subnets = []SubnetConfig{{CIDR: "10.0.0.0/24", PoolStart: "10.0.1.1", PoolEnd: "10.0.1.9"}}
		}, "must lie inside"},
		{func(c *Config) { c.Boot.DHCP.Subnets = []SubnetConfig{{CIDR: "10.0.0.0/24", Router: "10.0.0.256"}} }, "boot.dhcp.subnets[0].router"},
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
