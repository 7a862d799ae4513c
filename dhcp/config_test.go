package dhcp

import (
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// TestConfigYAML decodes a site config with unknown keys rejected.
func TestConfigYAML(t *testing.T) {
	src := `
interface: eth1
server_ip: 10.99.0.1
mode: authoritative
http_boot_url: http://10.99.0.1:8080
subnets:
  - cidr: 10.99.0.0/24
    router: 10.99.0.1
    dns: [10.99.0.1]
    pool_start: 10.99.0.100
    pool_end: 10.99.0.200
    lease_time: 30m
tftp_boot_files: {0: undionly.kpxe, 7: ipxe.efi}
per_mac_rate: 5
`
	c := DefaultConfig()
	dec := yaml.NewDecoder(strings.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Subnets[0].LeaseTime != 30*time.Minute || c.Subnets[0].PoolEnd.String() != "10.99.0.200" || c.TFTPBootFiles[7] != "ipxe.efi" || c.Workers != DefaultWorkers {
		t.Fatalf("%+v", c)
	}
	bad := yaml.NewDecoder(strings.NewReader("interfac: eth1\n"))
	bad.KnownFields(true)
	if err := bad.Decode(&c); err == nil {
		t.Fatal("unknown key accepted")
	}
}
