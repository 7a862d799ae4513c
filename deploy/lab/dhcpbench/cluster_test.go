package dhcpbench_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"kiln/deploy/lab/benchline"
	"kiln/deploy/lab/testkit"
)

// TestBenchDHCPCluster (KILN_BENCH=1, root) is TestBenchDHCP for a site
// cluster: three `kiln serve` nodes (one bootstrapped, two joined with
// one-time join tokens from `kiln cluster token create`; raft and the
// forward RPC over mutual TLS) in their own namespaces on one bridge, the
// 2,000 machines imported once, every lease through the replicated log (a
// follower's group commit is forwarded to the leader; an ACK waits for
// the commit on a quorum, two of three fsyncs). The clients broadcast on
// the bridge (255.255.255.255, relayed: giaddr set) so every node sees
// every packet and the RFC 3074 hash over the three voters picks the one
// that answers (dhcp/DESIGN.md). Kea (one kea-dhcp4, memfile, as in
// TestBenchDHCP) is measured in the same run, by the same generator, over
// its own link (unicast). Kiln's CPU is the sum of the three processes.
//
//	kbd-N-1 10.76.0.11 ┐
//	kbd-N-2 10.76.0.12 ┼ br0 in kbd-N-b ── 10.76.0.2… kbd-N-c (clients) ── 10.77.0.1 kbd-N-e (Kea)
//	kbd-N-3 10.76.0.13 ┘
func TestBenchDHCPCluster(t *testing.T) {
	benchline.Need(t, true, "ip", "ss", "curl", "kea-dhcp4")
	if usePerfdhcp() {
		t.Skip("the cluster bench runs with the generator only (perfdhcp cannot broadcast as a relay from several addresses)")
	}
	bin := kilnBin(t)
	nc := clientCount(t)
	id := strconv.Itoa(os.Getpid() % 10000)
	brNS, cliNS, keaNS := "kbd-"+id+"-b", "kbd-"+id+"-c", "kbd-"+id+"-e"
	for _, ns := range []string{brNS, cliNS, keaNS} {
		netns(t, ns)
	}
	testkit.IP(t, "-n", brNS, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0")
	testkit.IP(t, "-n", brNS, "link", "set", "br0", "up")
	port := func(ns, ifname, addr string) {
		testkit.Veth(t, testkit.VethEnd{NS: ns, Name: ifname, Addr: addr}, testkit.VethEnd{NS: brNS, Name: ifname + "b"}, 0)
		testkit.IP(t, "-n", brNS, "link", "set", ifname+"b", "master", "br0")
	}
	n := &nets{clients: nc}
	cliIf := "kbd" + id + "c"
	port(cliNS, cliIf, kilnCli+"/16")
	for _, a := range n.clientAddrs(kilnCli)[1:] {
		testkit.IP(t, "-n", cliNS, "addr", "add", a+"/16", "dev", cliIf)
	}
	keaIf := "kbd" + id + "e"
	testkit.Veth(t, testkit.VethEnd{NS: keaNS, Name: keaIf, Addr: keaIP + "/16"},
		testkit.VethEnd{NS: cliNS, Name: keaIf + "c", Addr: keaCli + "/16"}, 0)
	for _, a := range n.clientAddrs(keaCli)[1:] {
		testkit.IP(t, "-n", cliNS, "addr", "add", a+"/16", "dev", keaIf+"c")
	}

	dir := t.TempDir()
	macs, _ := benchMACs(t, dir, nc)
	var nodes []*kilnNode
	for i := 1; i <= 3; i++ {
		ns, ifname := fmt.Sprintf("kbd-%s-%d", id, i), fmt.Sprintf("kbd%s%d", id, i)
		netns(t, ns)
		ip := fmt.Sprintf("10.76.0.%d", 10+i)
		port(ns, ifname, ip+"/16")
		nodes = append(nodes, &kilnNode{id: fmt.Sprintf("node-%d", i), ns: ns, ifname: ifname, ip: ip, dir: filepath.Join(dir, fmt.Sprintf("kiln-%d", i))})
	}
	t0 := time.Now()
	nodes[0].start(t, bin)
	for _, nd := range nodes[1:] {
		out, err := nodes[0].cli(bin, "cluster", "token", "create", "--ttl", "15m", "-o", "json")
		var tok struct {
			Token string `json:"token"`
		}
		if err != nil || json.Unmarshal([]byte(out), &tok) != nil || tok.Token == "" {
			t.Fatalf("kiln cluster token create: %v\n%s", err, out)
		}
		nd.join, nd.token = []string{nodes[0].ip + ":7482"}, tok.Token
		nd.start(t, bin)
	}
	waitFor(t, "three voters", 60*time.Second, nodes[0].tail, func() bool {
		out, err := nodes[0].cli(bin, "cluster", "members", "-o", "json")
		return err == nil && strings.Count(out, `"suffrage": "Voter"`)+strings.Count(out, `"suffrage":"Voter"`) == 3
	})
	t.Logf("cluster of 3 up in %s", time.Since(t0).Round(100*time.Millisecond))
	importMachines(t, bin, nodes[0], macs)
	for _, nd := range nodes {
		waitFor(t, nd.id+" holds the machines", 60*time.Second, nd.tail, func() bool {
			out, err := nd.cli(bin, "machines", "list", "-o", "json")
			return err == nil && strings.Contains(out, `"bench-1999"`)
		})
	}
	out, _ := nodes[0].cli(bin, "version")
	k := &server{name: "kiln-3", target: "255.255.255.255", clients: n.clientAddrs(kilnCli),
		version: strings.TrimPrefix(strings.TrimSpace(out), "kiln ")}
	for _, nd := range nodes {
		k.ns = append(k.ns, nd.ns)
		k.procs = append(k.procs, nd.cmd)
	}
	k.counters = func(t *testing.T) map[string]float64 {
		sum := map[string]float64{}
		for _, nd := range nodes {
			for key, v := range nd.counters(t) {
				sum[key] += v
			}
		}
		return sum
	}
	kea := startKea(t, keaNS, keaIf, keaIP, n.clientAddrs(keaCli), filepath.Join(dir, "kea"), macs)
	k.gen = openGen(t, cliNS, cliIf, k.clients, macs)
	kea.gen = openGen(t, cliNS, keaIf+"c", kea.clients, macs)
	servers := []*server{k, kea}

	warm(t, cliNS, nil, servers)
	res := ladder(t, cliNS, nil, servers)
	for _, nd := range nodes {
		if c := nd.cmd; c.ProcessState != nil {
			t.Fatalf("%s exited during the bench:\n%s", nd.id, nd.tail())
		}
	}
	report(t, "_3_nodes", res, k, kea, nil, "kea-dhcp4-"+kea.version+"-memfile", []benchline.Field{
		{Key: "note", Value: "kea-one-server-memfile-no-fsync"},
		{Key: "workers", Value: strconv.Itoa(benchWorkers)},
		{Key: "machines", Value: strconv.Itoa(benchMachines)},
		{Key: "clients", Value: strconv.Itoa(nc)},
	})
}
