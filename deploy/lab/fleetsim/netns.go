package fleetsim

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The simulator's network, in two namespaces it creates and removes
// (PREFIX-srv for Kiln, PREFIX-lan for the machines and their BMCs):
//
//	PREFIX-srv  fs0 10.98.0.1/20 ──veth── fs0-p 10.98.0.2/20  PREFIX-lan (DHCP on fs0-p, AF_PACKET)
//	            fb0 10.97.0.1/16 ──veth── fb0-p 10.97.0.2/16  PREFIX-lan (the BMCs)
//
// In PREFIX-lan two local routes make every address of the DHCP pool
// (10.98.8.0/21) and of the BMC range (10.97.8.0/21) local (the "AnyIP"
// routes of ip-route(8), type local): a machine binds its leased address for
// TFTP and HTTP without one `ip addr add` per machine, and a BMC is a
// distinct address one listener accepts. In PREFIX-srv both ranges are
// routed via the LAN end of their veth, so Kiln's side holds one neighbour
// entry per veth instead of one per machine: the kernel's neighbour table is
// shared by all namespaces and its default gc_thresh3 (1024, a host-wide
// sysctl the simulator leaves alone) would otherwise overflow past ~1000
// machines. On a real flat provisioning network Kiln's host holds an ARP
// entry per machine and is tuned for it; DHCP is unaffected (replies to
// clients without an address are broadcast).
const (
	ServerIP   = "10.98.0.1"
	serverCIDR = "10.98.0.1/20"
	lanCIDR    = "10.98.0.2/20"
	subnetCIDR = "10.98.0.0/20"
	poolStart  = "10.98.8.1"
	poolEnd    = "10.98.15.254"
	poolRoute  = "10.98.8.0/21"
	bmcSrvCIDR = "10.97.0.1/16"
	bmcLanCIDR = "10.97.0.2/16"
	bmcRoute   = "10.97.8.0/21"
	srvIf      = "fs0"
	lanIf      = "fs0-p"

	// MaxMachines is how many machines the pool and the BMC range hold.
	MaxMachines = 2044
)

// bmcAddr is machine i's BMC address (i from 0): 10.97.8.1, 10.97.8.2, …,
// 10.97.8.255, 10.97.9.0, … — consecutive hosts of bmcRoute (a /21: only
// its first and last address are not hosts). Skipping .0 and .255 of each
// /24, as this once did, put machines past 2032 outside the route.
func bmcAddr(i int) netip.Addr {
	n := 1 + i // host n of 10.97.8.0/21 (bmcRoute): MaxMachines of them end at 10.97.15.252
	return netip.AddrFrom4([4]byte{10, 97, byte(8 + n/256), byte(n % 256)})
}

// lab is the namespaces of one run: PREFIX-srv (one node) or PREFIX-n1..nK
// (Options.Nodes > 1), and PREFIX-lan.
type lab struct {
	srv, lan string
	nodes    []string // the nodes' namespaces; nodes[0] == srv
}

// The cluster's network (Options.Nodes > 1), in the manner of the HA lab
// (deploy/lab/e2e/halab.go): each node in its own namespace PREFIX-nK with
// fs0 10.98.0.K/20, its veth peer fKp on the bridge br0 of PREFIX-lan, which
// holds 10.98.0.10/20 and the machines' DHCP socket. Raft, the forward RPC,
// DHCP, TFTP and HTTP all cross br0; the BMC range is routed via the LAN's
// address on the same bridge (no second link per node).
const (
	haLanIP   = "10.98.0.10"
	haLanCIDR = haLanIP + "/20"
	haBridge  = "br0"
)

// nodeIP is node i's (0-based) provisioning address: 10.98.0.1, .2, .3 (node 0 is ServerIP).
func nodeIP(i int) string { return fmt.Sprintf("10.98.0.%d", i+1) }

// dhcpIf is the LAN namespace's interface the machines' DHCP socket uses.
func dhcpIf(nodes int) string {
	if nodes > 1 {
		return haBridge
	}
	return lanIf
}

// setupHALab creates the cluster network of the comment above for n nodes.
func setupHALab(prefix string, n int) (*lab, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("fleetsim: iproute2 missing (apt-get install iproute2): %w", err)
	}
	l := &lab{lan: prefix + "-lan"}
	for i := 0; i < n; i++ {
		l.nodes = append(l.nodes, fmt.Sprintf("%s-n%d", prefix, i+1))
	}
	l.srv = l.nodes[0]
	l.teardown()
	steps := [][]string{
		{"netns", "add", l.lan},
		{"-n", l.lan, "link", "set", "lo", "up"},
		{"-n", l.lan, "link", "add", haBridge, "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"-n", l.lan, "addr", "add", haLanCIDR, "dev", haBridge},
		{"-n", l.lan, "link", "set", haBridge, "up"},
		{"-n", l.lan, "route", "add", "local", poolRoute, "dev", "lo"},
		{"-n", l.lan, "route", "add", "local", bmcRoute, "dev", "lo"},
	}
	for i, ns := range l.nodes {
		peer := fmt.Sprintf("f%dp", i+1)
		steps = append(steps,
			[]string{"netns", "add", ns},
			[]string{"-n", ns, "link", "set", "lo", "up"},
			[]string{"link", "add", srvIf, "netns", ns, "type", "veth", "peer", "name", peer, "netns", l.lan},
			[]string{"-n", ns, "addr", "add", nodeIP(i) + "/20", "dev", srvIf},
			[]string{"-n", ns, "link", "set", srvIf, "up"},
			[]string{"-n", l.lan, "link", "set", peer, "master", haBridge, "up"},
			[]string{"-n", ns, "route", "add", poolRoute, "via", haLanIP, "dev", srvIf},
			[]string{"-n", ns, "route", "add", bmcRoute, "via", haLanIP, "dev", srvIf})
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			l.teardown()
			return nil, fmt.Errorf("fleetsim: ip %s: %v: %s", strings.Join(s, " "), err, bytes.TrimSpace(out))
		}
	}
	for _, ns := range append([]string{l.lan}, l.nodes...) {
		for _, kv := range []string{"net.core.somaxconn=8192", "net.ipv4.tcp_max_syn_backlog=8192"} {
			if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", kv).CombinedOutput(); err != nil {
				l.teardown()
				return nil, fmt.Errorf("fleetsim: sysctl %s in %s: %v: %s", kv, ns, err, bytes.TrimSpace(out))
			}
		}
	}
	return l, nil
}

// setupLab creates the namespaces and links of the package comment,
// removing leftovers of an earlier run with the same prefix first.
func setupLab(prefix string) (*lab, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("fleetsim: iproute2 missing (apt-get install iproute2): %w", err)
	}
	l := &lab{srv: prefix + "-srv", lan: prefix + "-lan"}
	l.nodes = []string{l.srv}
	l.teardown()
	steps := [][]string{
		{"netns", "add", l.srv},
		{"netns", "add", l.lan},
		{"-n", l.srv, "link", "set", "lo", "up"},
		{"-n", l.lan, "link", "set", "lo", "up"},
		{"link", "add", srvIf, "netns", l.srv, "type", "veth", "peer", "name", lanIf, "netns", l.lan},
		{"-n", l.srv, "addr", "add", serverCIDR, "dev", srvIf},
		{"-n", l.lan, "addr", "add", lanCIDR, "dev", lanIf},
		{"-n", l.srv, "link", "set", srvIf, "up"},
		{"-n", l.lan, "link", "set", lanIf, "up"},
		{"link", "add", "fb0", "netns", l.srv, "type", "veth", "peer", "name", "fb0-p", "netns", l.lan},
		{"-n", l.srv, "addr", "add", bmcSrvCIDR, "dev", "fb0"},
		{"-n", l.lan, "addr", "add", bmcLanCIDR, "dev", "fb0-p"},
		{"-n", l.srv, "link", "set", "fb0", "up"},
		{"-n", l.lan, "link", "set", "fb0-p", "up"},
		{"-n", l.lan, "route", "add", "local", poolRoute, "dev", "lo"},
		{"-n", l.lan, "route", "add", "local", bmcRoute, "dev", "lo"},
		{"-n", l.srv, "route", "add", poolRoute, "via", "10.98.0.2", "dev", srvIf},
		{"-n", l.srv, "route", "add", bmcRoute, "via", "10.97.0.2", "dev", "fb0"},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			l.teardown()
			return nil, fmt.Errorf("fleetsim: ip %s: %v: %s", strings.Join(s, " "), err, bytes.TrimSpace(out))
		}
	}
	// Thousands of clients at once: listen backlogs (per namespace).
	for _, ns := range []string{l.srv, l.lan} {
		for _, kv := range []string{"net.core.somaxconn=8192", "net.ipv4.tcp_max_syn_backlog=8192"} {
			if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", kv).CombinedOutput(); err != nil {
				l.teardown()
				return nil, fmt.Errorf("fleetsim: sysctl %s in %s: %v: %s", kv, ns, err, bytes.TrimSpace(out))
			}
		}
	}
	return l, nil
}

// teardown ends every process in the namespaces (SIGTERM, SIGKILL after 3 s)
// and deletes them with their links. Safe to call more than once.
func (l *lab) teardown() {
	for _, ns := range append([]string{l.lan}, l.nodes...) {
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
			if p, err := strconv.Atoi(f); err == nil && p != os.Getpid() {
				ps = append(ps, p)
			}
		}
		return ps
	}
	ps := pids()
	for _, p := range ps {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	deadline := time.Now().Add(3 * time.Second)
	for len(ps) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		ps = pids()
	}
	for _, p := range ps {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}
