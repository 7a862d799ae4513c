package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"kiln/api/client"
)

// The HA lab (`make e2e-ha`): three Kiln nodes, each in its own network
// namespace, on one provisioning bridge, with the VMs and their BMCs in a
// fourth namespace:
//
//	netns P-n1  srv0 10.99.0.1/24 ─veth─ n1p ─┐ br0 (provisioning: DHCP, TFTP, HTTP, raft, forward RPC)
//	            bmc0 10.99.1.1/24 ─veth─ n1b ─┼─ br1 10.99.1.10-13 (the BMCs)
//	netns P-n2  … 10.99.0.2, 10.99.1.2        │
//	netns P-n3  … 10.99.0.3, 10.99.1.3        │
//	netns P-lan br0 ├── tap0..tap3 (qemu)      br1 (vbmc, ipmi_sim listen on its addresses)
//
// Raft and the forward RPC run between the nodes' 10.99.0.N addresses on
// the provisioning bridge itself. A partition of node N poisons the
// neighbour tables (ip-neighbour(8)): in N's namespace every other node's
// address is pinned (nud permanent) to an Ethernet address nobody has, and
// in theirs N's address is. Every IP packet between N and the others then
// goes to nobody and is lost silently, in both directions, as on a cut
// cable (a blackhole or prohibit route would refuse at once instead, which
// no real partition does), while every node still shares the wire with the
// VMs and answers them.

// haNet is the lab's namespaces.
type haNet struct {
	lan   string
	nodes []string // namespace of node i (0-based)
}

// haNodeIP is node i's (0-based) provisioning address; haBMCIP is VM i's BMC.
func haNodeIP(i int) string { return fmt.Sprintf("10.99.0.%d", i+1) }
func haBMCIP(i int) string  { return fmt.Sprintf("10.99.1.%d", 10+i) }

func ipCmd(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

func setupHANet(prefix string, nodes, vms int) (*haNet, error) {
	n := &haNet{lan: prefix + "-lan"}
	for i := 0; i < nodes; i++ {
		n.nodes = append(n.nodes, fmt.Sprintf("%s-n%d", prefix, i+1))
	}
	n.teardown()
	steps := [][]string{
		{"netns", "add", n.lan},
		{"-n", n.lan, "link", "set", "lo", "up"},
		{"-n", n.lan, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"-n", n.lan, "link", "set", "br0", "up"},
		{"-n", n.lan, "link", "add", "br1", "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"-n", n.lan, "link", "set", "br1", "up"},
	}
	for i := 0; i < vms; i++ {
		steps = append(steps, []string{"-n", n.lan, "addr", "add", haBMCIP(i) + "/24", "dev", "br1"},
			[]string{"-n", n.lan, "tuntap", "add", "dev", fmt.Sprintf("tap%d", i), "mode", "tap"},
			[]string{"-n", n.lan, "link", "set", fmt.Sprintf("tap%d", i), "master", "br0", "up"})
	}
	for i, ns := range n.nodes {
		p, b := fmt.Sprintf("n%dp", i+1), fmt.Sprintf("n%db", i+1)
		steps = append(steps,
			[]string{"netns", "add", ns},
			[]string{"-n", ns, "link", "set", "lo", "up"},
			[]string{"link", "add", "srv0", "netns", ns, "type", "veth", "peer", "name", p, "netns", n.lan},
			[]string{"-n", ns, "addr", "add", haNodeIP(i) + "/24", "dev", "srv0"},
			[]string{"-n", ns, "link", "set", "srv0", "up"},
			[]string{"-n", n.lan, "link", "set", p, "master", "br0", "up"},
			[]string{"link", "add", "bmc0", "netns", ns, "type", "veth", "peer", "name", b, "netns", n.lan},
			[]string{"-n", ns, "addr", "add", fmt.Sprintf("10.99.1.%d/24", i+1), "dev", "bmc0"},
			[]string{"-n", ns, "link", "set", "bmc0", "up"},
			[]string{"-n", n.lan, "link", "set", b, "master", "br1", "up"})
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			n.teardown()
			return nil, fmt.Errorf("ha lab: %w", err)
		}
	}
	return n, nil
}

// nowhereMAC is the Ethernet address a partition pins the cut-off peers
// to: locally administered, on no interface of the lab.
const nowhereMAC = "02:00:00:de:ad:01"

// partition cuts node i off from every other node (both ways); heal
// restores it (the entries are deleted and ARP resolves them again).
func (n *haNet) partition(i int) error {
	return n.neigh(i, func(ns, ip string) []string {
		return []string{"-n", ns, "neigh", "replace", ip, "lladdr", nowhereMAC, "nud", "permanent", "dev", "srv0"}
	})
}

func (n *haNet) heal(i int) error {
	return n.neigh(i, func(ns, ip string) []string { return []string{"-n", ns, "neigh", "del", ip, "dev", "srv0"} })
}

func (n *haNet) neigh(i int, args func(ns, ip string) []string) error {
	var first error
	for j := range n.nodes {
		if j == i {
			continue
		}
		for _, r := range [][2]string{{n.nodes[i], haNodeIP(j)}, {n.nodes[j], haNodeIP(i)}} {
			if err := ipCmd(args(r[0], r[1])...); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

func (n *haNet) teardown() {
	for _, ns := range append([]string{n.lan}, n.nodes...) {
		killNS(ns)
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
}

// killNS ends every process in namespace ns (SIGTERM, SIGKILL after 2 s).
func killNS(ns string) {
	pids := func() []int {
		out, _ := exec.Command("ip", "netns", "pids", ns).Output()
		var ps []int
		for _, f := range strings.Fields(string(out)) {
			var p int
			if _, err := fmt.Sscan(f, &p); err == nil {
				ps = append(ps, p)
			}
		}
		return ps
	}
	ps := pids()
	for _, p := range ps {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	for deadline := time.Now().Add(2 * time.Second); len(ps) > 0 && time.Now().Before(deadline); ps = pids() {
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range ps {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}

// haNode is one `kiln serve` of the lab, run from bin/kiln in its namespace.
type haNode struct {
	i        int
	id, ns   string
	ip       string
	bin, cfg string
	data     string
	logPath  string
	cmd      *exec.Cmd
	done     chan struct{} // closed when the current process has exited
	api      *client.Client
	starts   int
}

func (n *haNode) raftAddr() string { return n.ip + ":7481" }
func (n *haNode) fwdAddr() string  { return n.ip + ":7482" }

// haNodeConfig is node i's kiln.yaml. Every node serves DHCP for the one
// subnet on the shared bridge (RFC 3074 balancing decides who answers,
// dhcp/DESIGN.md) and lists the other nodes' boot listeners for agents.
func haNodeConfig(o HAOptions, n *haNode, all []*haNode, join []string, token string) string {
	var peers []string
	for _, p := range all {
		if p != n {
			peers = append(peers, `"`+p.ip+`:8080"`)
		}
	}
	raft := "  bootstrap: true\n"
	if len(join) > 0 {
		raft = fmt.Sprintf("  bootstrap: false\n  join: [\"%s\"]\n  join_token: %s\n", strings.Join(join, `", "`), token)
	}
	return fmt.Sprintf(`node_id: %s
data_dir: %s
api:
  addr: 127.0.0.1:7480
raft:
  addr: %s
  forward_addr: %s
%sboot:
  interface: srv0
  server_ip: %s
  http_addr: %s:8080
  peer_http_addrs: [%s]
  env_dir: %s
  image_dir: %s
  kernel_args: ["console=ttyS0,115200"]
  dhcp:
    enabled: true
    mode: authoritative
    subnets:
      - cidr: 10.99.0.0/24
        pool_start: 10.99.0.100
        pool_end: 10.99.0.199
        lease_time: 1h
bmc:
  timeout: 20s
  retries: 2
  ipmi_cipher_suite: "3"
  ipmi_ignore_valid_bit: true
lifecycle:
  step_timeout: 4m
  boot_timeout: 4m
  agent_poll_after: 1s
`, n.id, n.data, n.raftAddr(), n.fwdAddr(), raft, n.ip, n.ip, strings.Join(peers, ", "),
		filepath.Join(o.Root, "build/env"), filepath.Join(filepath.Dir(n.data), "images"))
}

// start runs the node's process (its log appended to across restarts).
func (n *haNode) start() error {
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	n.starts++
	fmt.Fprintf(logf, "==== start %d at %s\n", n.starts, time.Now().UTC().Format(time.RFC3339Nano))
	// ip netns exec execs kiln in the namespace: the PID is kiln's own.
	cmd := exec.Command("ip", "netns", "exec", n.ns, n.bin, "serve", "--config", n.cfg)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	n.cmd, n.done = cmd, make(chan struct{})
	done := n.done
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	return nil
}

func (n *haNode) running() bool {
	if n.done == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// stop sends sig and waits up to d for the process to end (then SIGKILL).
func (n *haNode) stop(sig syscall.Signal, d time.Duration) {
	if !n.running() {
		return
	}
	_ = n.cmd.Process.Signal(sig)
	select {
	case <-n.done:
	case <-time.After(d):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
}

// waitReady waits until /readyz answers 200, then (re)makes the admin client.
func (n *haNode) waitReady(ctx context.Context, d time.Duration) error {
	hc := nsHTTPClient(n.ns)
	anon, err := client.New(client.Config{Server: apiURL, HTTPClient: hc})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(d)
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := anon.Ready(rctx)
		cancel()
		if err == nil {
			break
		}
		if !n.running() {
			return fmt.Errorf("%s exited before it was ready (see %s)", n.id, n.logPath)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not ready in %s (see %s): %w", n.id, d, n.logPath, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n.api == nil {
		tok, err := os.ReadFile(filepath.Join(n.data, "admin.token"))
		if err != nil {
			return fmt.Errorf("%s admin token: %w", n.id, err)
		}
		n.api, err = client.New(client.Config{Server: apiURL, Token: strings.TrimSpace(string(tok)), HTTPClient: hc})
		if err != nil {
			return err
		}
	}
	return nil
}

// cliJSON runs bin/kiln's CLI in the node's namespace against its API.
func (n *haNode) cliJSON(ctx context.Context, v any, args ...string) error {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.ns, n.bin}, append(args, "-o", "json")...)...)
	cmd.Env = append(os.Environ(), "KILN_SERVER="+apiURL, "KILN_TOKEN_FILE="+filepath.Join(n.data, "admin.token"), "KILN_TOKEN=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s: kiln %s: %v: %s", n.id, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("%s: kiln %s: decoding output: %v", n.id, strings.Join(args, " "), err)
	}
	return nil
}
