// Package labnet builds the lab's network in Linux network namespaces
// (top-level DESIGN.md "The lab"), without touching the host's own
// interfaces:
//
//	netns SRV   srv0 10.99.0.1/24 ──veth── srv0-p ─┐   (Kiln: DHCP/TFTP/HTTP)
//	            bmc0 10.99.1.1/24 ──veth── bmc0-p 10.99.1.10/24 (BMC network, in LAN)
//	netns LAN   br0 (stp off, forward delay 0) ├── tapN (qemu VMs run in this netns)
//
// It drives iproute2 (`ip`), which every machine of this kind has. Root is required.
package labnet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Addresses of the lab. The provisioning network is 10.99.0.0/24 and the BMC
// network 10.99.1.0/24; both exist only inside the lab's namespaces.
const (
	ServerIP    = "10.99.0.1"
	ServerCIDR  = "10.99.0.1/24"
	BMCNetIP    = "10.99.1.1"
	BMCNetCIDR  = "10.99.1.1/24"
	BMCAddr     = "10.99.1.10"
	BMCAddrCIDR = "10.99.1.10/24"
	ServerIf    = "srv0"
)

// Lab is a set of namespaces created by Setup. Remove them with Teardown.
type Lab struct {
	Srv, LAN string // namespace names
}

// ErrNotRoot is returned by Setup when the process is not root.
var ErrNotRoot = errors.New("labnet: needs root (network namespaces)")

// Setup creates the namespaces PREFIX-srv and PREFIX-lan with the topology in
// the package comment. Any leftovers of an earlier run with the same prefix are
// removed first.
func Setup(prefix string) (*Lab, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("labnet: iproute2 missing: %w", err)
	}
	l := &Lab{Srv: prefix + "-srv", LAN: prefix + "-lan"}
	l.Teardown()
	steps := [][]string{
		{"netns", "add", l.Srv},
		{"netns", "add", l.LAN},
		{"-n", l.Srv, "link", "set", "lo", "up"},
		{"-n", l.LAN, "link", "set", "lo", "up"},
		{"-n", l.LAN, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"-n", l.LAN, "link", "set", "br0", "up"},
		{"link", "add", "srv0", "netns", l.Srv, "type", "veth", "peer", "name", "srv0-p", "netns", l.LAN},
		{"-n", l.Srv, "addr", "add", ServerCIDR, "dev", "srv0"},
		{"-n", l.Srv, "link", "set", "srv0", "up"},
		{"-n", l.LAN, "link", "set", "srv0-p", "master", "br0", "up"},
		{"link", "add", "bmc0", "netns", l.Srv, "type", "veth", "peer", "name", "bmc0-p", "netns", l.LAN},
		{"-n", l.Srv, "addr", "add", BMCNetCIDR, "dev", "bmc0"},
		{"-n", l.Srv, "link", "set", "bmc0", "up"},
		{"-n", l.LAN, "addr", "add", BMCAddrCIDR, "dev", "bmc0-p"},
		{"-n", l.LAN, "link", "set", "bmc0-p", "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			l.Teardown()
			return nil, fmt.Errorf("labnet: ip %s: %v: %s", strings.Join(s, " "), err, bytes.TrimSpace(out))
		}
	}
	// The bridge must forward at once (no STP learning delay) for PXE firmware.
	return l, nil
}

// AddTap creates tap device name in the LAN namespace, enslaved to br0.
func (l *Lab) AddTap(name string) error {
	_ = exec.Command("ip", "-n", l.LAN, "link", "del", name).Run()
	for _, s := range [][]string{
		{"-n", l.LAN, "tuntap", "add", "dev", name, "mode", "tap"},
		{"-n", l.LAN, "link", "set", name, "master", "br0", "up"},
	} {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			return fmt.Errorf("labnet: ip %s: %v: %s", strings.Join(s, " "), err, bytes.TrimSpace(out))
		}
	}
	return nil
}

// Command returns a command that runs in namespace ns.
func (l *Lab) Command(ctx context.Context, ns string, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// Teardown ends every process in the lab's namespaces (SIGTERM, then SIGKILL
// after 2 s) and deletes the namespaces, which removes their links. It is safe
// to call more than once.
func (l *Lab) Teardown() {
	for _, ns := range []string{l.Srv, l.LAN} {
		killNS(ns)
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
}

func killNS(ns string) {
	pids := func() []int {
		out, err := exec.Command("ip", "netns", "pids", ns).Output()
		if err != nil {
			return nil
		}
		var ps []int
		for _, f := range strings.Fields(string(out)) {
			if p, err := strconv.Atoi(f); err == nil {
				ps = append(ps, p)
			}
		}
		return ps
	}
	ps := pids()
	for _, p := range ps {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	deadline := time.Now().Add(2 * time.Second)
	for len(ps) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		ps = pids()
	}
	for _, p := range ps {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}
