package appliance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"kiln/deploy/lab/testkit"
	"kiln/deploy/lab/testreq"
	"kiln/dhcp"
	"kiln/store"
	"kiln/store/storetest"
)

// Real store nodes on 127.0.0.1 (storetest) and, per node, the real DHCP
// server over the real adapter (dhcpBackend), listening in a network
// namespace of its own; clients are udhcpc and a small Go client, each in
// a namespace of its own. All in 10.96.0.0/24, pool .100-.139.

var (
	leaseSubnet = netip.MustParsePrefix("10.96.0.0/24")
	leasePool   = [2]netip.Addr{netip.MustParseAddr("10.96.0.100"), netip.MustParseAddr("10.96.0.139")}
)

// dhcpNode is node i's DHCP server: its address, registry, and stop.
type dhcpNode struct {
	ip   netip.Addr
	reg  *prometheus.Registry
	stop func()
}

// startNodeDHCP runs a DHCP server over st on interface ifname of
// namespace ns with address ip, until stop or the test's end.
func startNodeDHCP(t *testing.T, st *store.Store, ns, ifname string, ip netip.Addr, mod func(*dhcp.Config)) *dhcpNode {
	t.Helper()
	b := &dhcpBackend{st: st, scriptURL: func(mac string) string { return "http://" + ip.String() + ":8080/ipxe/" + mac },
		log: slog.New(slog.NewTextHandler(io.Discard, nil)), discoveries: make(chan discovery, 64)}
	cfg := dhcp.DefaultConfig()
	cfg.Interface, cfg.ServerIP, cfg.HTTPBootURL = ifname, ip, "http://"+ip.String()+":8080"
	cfg.PerMACRate = 0
	cfg.Subnets = []dhcp.Subnet{{CIDR: leaseSubnet, Router: netip.MustParseAddr("10.96.0.1"),
		PoolStart: leasePool[0], PoolEnd: leasePool[1], LeaseTime: 10 * time.Minute}}
	if mod != nil {
		mod(&cfg)
	}
	reg := prometheus.NewRegistry()
	s, err := dhcp.New(cfg, b, reg)
	if err != nil {
		t.Fatal(err)
	}
	testkit.InNetns(t, ns, func() { err = s.Listen() })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			t.Errorf("dhcp Run on %s: %v", ip, err)
		}
	}()
	var once sync.Once
	n := &dhcpNode{ip: ip, reg: reg, stop: func() { once.Do(func() { cancel(); <-done }) }}
	t.Cleanup(n.stop)
	return n
}

// client is a DHCP client in a namespace: one UDP socket on port 68 of its
// interface, many chaddrs. Replies are demultiplexed by xid.
type client struct {
	t    *testing.T
	conn net.PacketConn
	mu   sync.Mutex
	subs map[dhcpv4.TransactionID]chan *dhcpv4.DHCPv4
}

func newClient(t *testing.T, ns, ifname string) *client {
	t.Helper()
	var conn net.PacketConn
	var err error
	testkit.InNetns(t, ns, func() {
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_BROADCAST, 1); serr == nil {
					serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, ifname)
				}
			})
			return errors.Join(err, serr)
		}}
		conn, err = lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:68")
	})
	if err != nil {
		t.Fatal(err)
	}
	c := &client{t: t, conn: conn, subs: map[dhcpv4.TransactionID]chan *dhcpv4.DHCPv4{}}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			p, err := dhcpv4.FromBytes(buf[:n])
			if err != nil || p.OpCode != dhcpv4.OpcodeBootReply {
				continue
			}
			c.mu.Lock()
			ch := c.subs[p.TransactionID]
			c.mu.Unlock()
			if ch != nil {
				select {
				case ch <- p:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() { conn.Close() })
	return c
}

// send broadcasts m (or unicasts it to `to` when valid) and returns the
// replies to its xid that arrive within wait, or the first enough of them
// (enough ≤ 0: all within wait).
func (c *client) send(m *dhcpv4.DHCPv4, to netip.Addr, wait time.Duration, enough ...int) []*dhcpv4.DHCPv4 {
	c.t.Helper()
	ch := make(chan *dhcpv4.DHCPv4, 8)
	c.mu.Lock()
	c.subs[m.TransactionID] = ch
	c.mu.Unlock()
	defer func() { c.mu.Lock(); delete(c.subs, m.TransactionID); c.mu.Unlock() }()
	dst := &net.UDPAddr{IP: net.IPv4bcast, Port: 67}
	if to.IsValid() {
		dst.IP = to.AsSlice()
	}
	if _, err := c.conn.WriteTo(m.ToBytes(), dst); err != nil {
		c.t.Errorf("send: %v", err)
		return nil
	}
	var out []*dhcpv4.DHCPv4
	deadline := time.After(wait)
	for {
		select {
		case p := <-ch:
			out = append(out, p)
			if len(enough) > 0 && enough[0] > 0 && len(out) >= enough[0] {
				return out
			}
		case <-deadline:
			return out
		}
	}
}

func dmsg(t *testing.T, mac string, mt dhcpv4.MessageType, secs uint16, opts ...dhcpv4.Option) *dhcpv4.DHCPv4 {
	t.Helper()
	hw, err := net.ParseMAC(mac)
	if err != nil {
		t.Fatal(err)
	}
	m, err := dhcpv4.New(dhcpv4.WithHwAddr(hw), dhcpv4.WithMessageType(mt), dhcpv4.WithBroadcast(true))
	if err != nil {
		t.Fatal(err)
	}
	m.NumSeconds = secs
	for _, o := range opts {
		m.UpdateOption(o)
	}
	return m
}

// dora runs DISCOVER → OFFER → REQUEST → ACK (up to tries times, starting
// over after a NAK or silence) and returns the ACKed address, or the zero
// Addr. naks counts the NAKs seen.
func (c *client) dora(mac string, secs uint16, tries int) (ip netip.Addr, naks int) {
	for range tries {
		offers := c.send(dmsg(c.t, mac, dhcpv4.MessageTypeDiscover, secs), netip.Addr{}, 500*time.Millisecond, 1)
		if len(offers) == 0 {
			continue
		}
		o := offers[0]
		req := dmsg(c.t, mac, dhcpv4.MessageTypeRequest, secs, dhcpv4.OptRequestedIPAddress(o.YourIPAddr), dhcpv4.OptServerIdentifier(o.ServerIdentifier()))
		req.TransactionID = o.TransactionID
		for _, r := range c.send(req, netip.Addr{}, 4*time.Second, 1) {
			switch r.MessageType() {
			case dhcpv4.MessageTypeAck:
				a, _ := netip.AddrFromSlice(r.YourIPAddr.To4())
				return a, naks
			case dhcpv4.MessageTypeNak:
				naks++
			}
		}
	}
	return netip.Addr{}, naks
}

// segment is a server namespace and a client namespace joined by a veth
// pair; the client end gets clientMAC and 10.96.0.250.
func segment(t *testing.T, tag string, serverIP netip.Addr, clientMAC string) (srvNS, srvIf, cliNS, cliIf string) {
	t.Helper()
	id := testkit.ID()
	srvNS, cliNS = testkit.Netns(t, "kl"+tag+id+"s"), testkit.Netns(t, "kl"+tag+id+"c")
	srvIf, cliIf = "kl"+tag+id+"s", "kl"+tag+id+"c"
	testkit.Veth(t, testkit.VethEnd{NS: srvNS, Name: srvIf, Addr: serverIP.String() + "/24"}, testkit.VethEnd{NS: cliNS, Name: cliIf}, 0)
	testkit.IP(t, "-n", cliNS, "link", "set", "dev", cliIf, "address", clientMAC)
	testkit.IP(t, "-n", cliNS, "addr", "add", "10.96.0.250/24", "dev", cliIf)
	return
}

// udhcpc gets one lease in namespace ns, asking for address want (option
// 50), and returns the address and the server.
func udhcpc(t *testing.T, ns, ifname, want string) (ip, server string) {
	t.Helper()
	dir := t.TempDir()
	out, script := filepath.Join(dir, "out"), filepath.Join(dir, "hook.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n[ \"$1\" = bound ] && echo \"$ip $serverid\" >> "+out+"\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("timeout", "20", "ip", "netns", "exec", ns, "udhcpc", "-f", "-q", "-n", "-t", "6", "-T", "1", "-r", want, "-i", ifname, "-s", script)
	if o, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("udhcpc in %s: %v\n%s", ns, err, o)
	}
	data, _ := os.ReadFile(out)
	f := strings.Fields(string(data))
	if len(f) < 2 {
		t.Fatalf("udhcpc reported no lease: %q", data)
	}
	return f[0], f[1]
}

func holder(t *testing.T, st *store.Store, ip string) store.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := st.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := st.AddressLease(ip)
	if err != nil {
		t.Fatalf("no record of %s: %v", ip, err)
	}
	return l
}

// Issue 12's double allocation, on its own terms: two nodes of one cluster
// serve DHCP for the same subnet on two segments. Before leases went
// through the log, a client got 10.96.0.100 from node 0, then a client of
// node 1 got 10.96.0.100 too. Now the second gets another address, a
// machine's reservation is offered by either node, and when clients of
// both nodes ask for the same free address at the same moment exactly one
// is ACKed — the other is NAKed, whichever node's view was behind — and
// every ACK is the address's one record on both nodes.
func TestClusterDHCPOneHolderPerAddress(t *testing.T) {
	testreq.Root(t, "network namespaces", "ip", "udhcpc", "timeout")
	c := storetest.NewCluster(t, 2)
	const mac0, mac1 = "52:54:00:96:00:01", "52:54:00:96:01:01"
	var nodes []*dhcpNode
	var clients []*client
	for i, nd := range c.Nodes {
		ip := netip.AddrFrom4([4]byte{10, 96, 0, byte(1 + i)})
		srvNS, srvIf, cliNS, cliIf := segment(t, fmt.Sprint(i), ip, []string{mac0, mac1}[i])
		// One node alone on each segment: each answers every client at once.
		nodes = append(nodes, startNodeDHCP(t, nd.Store, srvNS, srvIf, ip, func(c *dhcp.Config) { c.BalanceWait = 0 }))
		if i == 0 {
			a, srv := udhcpc(t, cliNS, cliIf, "10.96.0.100")
			t.Logf("segment 0: udhcpc got %s from %s", a, srv)
			if a != "10.96.0.100" || srv != "10.96.0.1" || holder(t, nd.Store, a).MAC != mac0 {
				t.Fatalf("segment 0: %s from %s, record %+v", a, srv, holder(t, nd.Store, a))
			}
			clients = append(clients, newClient(t, cliNS, cliIf))
			continue
		}
		// The client of node 1 asks for the very address (option 50), as
		// the second client got it.
		b, srv := udhcpc(t, cliNS, cliIf, "10.96.0.100")
		t.Logf("segment 1: udhcpc asked for 10.96.0.100, got %s from %s", b, srv)
		if b == "10.96.0.100" || srv != "10.96.0.2" {
			t.Fatalf("segment 1 got %s from %s while %s holds 10.96.0.100: the same address twice", b, srv, mac0)
		}
		for _, n := range c.Nodes {
			if l := holder(t, n.Store, b); l.MAC != mac1 || l.State != store.LeaseBound {
				t.Fatalf("record of %s on a node: %+v", b, l)
			}
		}
		clients = append(clients, newClient(t, cliNS, cliIf))
	}

	// A known machine gets its reserved address from either node.
	if _, err := c.Nodes[0].Store.PutMachine(context.Background(), store.Machine{Name: "r1-u01", IPv4: "10.96.0.50",
		Intended: store.Hardware{NICs: []store.NIC{{MAC: "52:54:00:96:0a:01"}}}}, store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	holder(t, c.Nodes[1].Store, "10.96.0.100") // barrier: node 1 has the machine
	for i, cl := range clients {
		if ip, _ := cl.dora("52:54:00:96:0a:01", 0, 3); ip.String() != "10.96.0.50" {
			t.Fatalf("node %d gave the known machine %v, want its reservation 10.96.0.50", i, ip)
		}
	}

	// Same free address, both nodes, same moment (INIT-REBOOT REQUESTs).
	acked := map[string]string{}
	for k := range 20 {
		ip := netip.AddrFrom4([4]byte{10, 96, 0, byte(110 + k)})
		var wg sync.WaitGroup
		got := make([][]*dhcpv4.DHCPv4, 2)
		for i, cl := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i] = cl.send(dmsg(t, fmt.Sprintf("52:54:00:96:%02x:%02x", 0x10+i, k), dhcpv4.MessageTypeRequest, 0, dhcpv4.OptRequestedIPAddress(ip.AsSlice())), netip.Addr{}, 5*time.Second, 1)
			}()
		}
		wg.Wait()
		acks, naks := 0, 0
		for _, rs := range got {
			for _, r := range rs {
				switch r.MessageType() {
				case dhcpv4.MessageTypeAck:
					acks++
					acked[ip.String()] = r.ClientHWAddr.String()
				case dhcpv4.MessageTypeNak:
					naks++
				}
			}
		}
		if acks != 1 || naks != 1 {
			t.Fatalf("%v asked by a client of each node: %d ACKs, %d NAKs, want one of each", ip, acks, naks)
		}
	}
	refused := 0.0
	for _, n := range nodes {
		refused += testkit.Sample(t, n.reg, "kiln_dhcp_drops_total", "reason", "address_taken")
	}
	t.Logf("20 addresses raced: 20 ACKs, 20 NAKs, of which %.0f by the FSM's refusal (the others by a view already up to date)", refused)

	// Full DORA, 15 clients per node at once, for the 18 addresses left
	// (40 in the pool): no address ACKed twice.
	var mu sync.Mutex
	var wg sync.WaitGroup
	dup := 0
	totalNaks := 0
	for i, cl := range clients {
		for k := range 15 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				mac := fmt.Sprintf("52:54:00:96:%02x:%02x", 0x20+i, k)
				ip, naks := cl.dora(mac, 0, 4)
				mu.Lock()
				defer mu.Unlock()
				totalNaks += naks
				if !ip.IsValid() {
					return
				}
				if prev, ok := acked[ip.String()]; ok {
					dup++
					t.Errorf("%v ACKed to %s and %s", ip, prev, mac)
				}
				acked[ip.String()] = mac
			}()
		}
	}
	wg.Wait()
	t.Logf("DORA storm: %d addresses ACKed in all, %d NAKs, duplicates %d", len(acked), totalNaks, dup)
	for _, n := range c.Nodes {
		for ip, mac := range acked {
			if l := holder(t, n.Store, ip); l.MAC != mac || l.State != store.LeaseBound {
				t.Fatalf("%s ACKed to %s, store holds %+v", ip, mac, l)
			}
		}
	}
}

// Three nodes on one segment share the answering by RFC 3074: a client
// that has not waited gets one OFFER, from the owner of its hash bucket;
// one that waited gets all three. When the owner of a client's bucket
// goes, the survivors answer it once it has waited; with only one node
// left (no quorum) that node gives no new address and renews a committed
// binding only for the time left on it.
func TestClusterDHCPSharedSegment(t *testing.T) {
	testreq.Root(t, "network namespaces", "ip")
	c := storetest.NewCluster(t, 3)
	id := testkit.ID()
	lan := testkit.Netns(t, "kllan"+id)
	testkit.IP(t, "-n", lan, "link", "add", "br0", "type", "bridge")
	testkit.IP(t, "-n", lan, "link", "set", "br0", "up")
	nodes := make([]*dhcpNode, 3)
	byIP := map[string]int{}
	for i, nd := range c.Nodes {
		ip := netip.AddrFrom4([4]byte{10, 96, 0, byte(1 + i)})
		ns := testkit.Netns(t, fmt.Sprintf("kl%ss%d", id, i))
		ifn := fmt.Sprintf("kl%ss%d", id, i)
		testkit.Veth(t, testkit.VethEnd{NS: ns, Name: ifn, Addr: ip.String() + "/24"}, testkit.VethEnd{NS: lan, Name: ifn + "b"}, 0)
		testkit.IP(t, "-n", lan, "link", "set", ifn+"b", "master", "br0")
		nodes[i] = startNodeDHCP(t, nd.Store, ns, ifn, ip, nil)
		byIP[ip.String()] = i
	}
	cns := testkit.Netns(t, "kl"+id+"c")
	cif := "kl" + id + "c"
	testkit.Veth(t, testkit.VethEnd{NS: cns, Name: cif, Addr: "10.96.0.250/24"}, testkit.VethEnd{NS: lan, Name: cif + "b"}, 0)
	testkit.IP(t, "-n", lan, "link", "set", cif+"b", "master", "br0")
	cl := newClient(t, cns, cif)
	owner := func(mac string) int {
		hw, _ := net.ParseMAC(mac)
		return dhcp.Owner(hw, 3)
	}

	per := make([]int, 3)
	got := make([][]*dhcpv4.DHCPv4, 30)
	var wg sync.WaitGroup
	for k := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[k] = cl.send(dmsg(t, fmt.Sprintf("52:54:00:97:00:%02x", k), dhcpv4.MessageTypeDiscover, 0), netip.Addr{}, 700*time.Millisecond)
		}()
	}
	wg.Wait()
	for k, offers := range got {
		mac := fmt.Sprintf("52:54:00:97:00:%02x", k)
		if len(offers) != 1 {
			t.Fatalf("%s: %d OFFERs, want 1", mac, len(offers))
		}
		from := byIP[offers[0].ServerIdentifier().String()]
		if from != owner(mac) {
			t.Fatalf("%s answered by n%d, its bucket's owner is n%d", mac, from, owner(mac))
		}
		per[from]++
	}
	if offers := cl.send(dmsg(t, "52:54:00:97:01:01", dhcpv4.MessageTypeDiscover, 5), netip.Addr{}, 2*time.Second, 3); len(offers) != 3 {
		t.Fatalf("a client that waited 5 s got %d OFFERs, want 3", len(offers))
	}
	t.Logf("30 DISCOVERs, one OFFER each; per node %v", per)

	// A client bound through its owner; the owner goes.
	mac := "52:54:00:97:02:01"
	ip, _ := cl.dora(mac, 0, 3)
	if !ip.IsValid() {
		t.Fatal("no lease")
	}
	o := owner(mac)
	nodes[o].stop()
	c.Stop(o)
	c.Leader()
	testkit.IP(t, "-n", cns, "addr", "add", ip.String()+"/24", "dev", cif) // so the unicast replies to ciaddr arrive
	rebind := func(secs uint16, to netip.Addr, wait time.Duration, enough int) []*dhcpv4.DHCPv4 {
		m := dmsg(t, mac, dhcpv4.MessageTypeRequest, secs)
		m.ClientIPAddr = ip.AsSlice()
		return cl.send(m, to, wait, enough)
	}
	if rs := rebind(0, netip.Addr{}, 700*time.Millisecond, 0); len(rs) != 0 {
		t.Fatalf("survivors answered the dead owner's client before it waited: %d replies", len(rs))
	}
	rs := rebind(4, netip.Addr{}, 5*time.Second, 2)
	if len(rs) != 2 || rs[0].MessageType() != dhcpv4.MessageTypeAck || rs[0].IPAddressLeaseTime(0) != 10*time.Minute {
		t.Fatalf("rebinding after the owner went: %d replies (%v)", len(rs), rs)
	}

	// Only one node left: no quorum.
	var last int
	for i := range c.Nodes {
		if i != o && c.Nodes[i].Store != nil {
			last = i
		}
	}
	for i := range c.Nodes {
		if i != o && i != last {
			nodes[i].stop()
			c.Stop(i)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.Nodes[last].Store.CanCommit() {
		if time.Now().After(deadline) {
			t.Fatal("the last node still believes it can commit")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rs := cl.send(dmsg(t, "52:54:00:97:03:01", dhcpv4.MessageTypeDiscover, 10), netip.Addr{}, 700*time.Millisecond); len(rs) != 0 {
		t.Fatalf("minority node offered a new address: %v", rs[0].YourIPAddr)
	}
	before := holder0(t, c.Nodes[last].Store, ip.String())
	left := time.Until(before.Expiry)                // measured before the REQUEST is sent, as the client counts
	rs = rebind(0, nodes[last].ip, 3*time.Second, 1) // RENEWING: unicast to the node
	if len(rs) != 1 || rs[0].MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("minority renewal: %v", rs)
	}
	if lt := rs[0].IPAddressLeaseTime(0); lt > left || lt < left-5*time.Second {
		t.Fatalf("minority granted %v with %v left on the committed binding", lt, left)
	}
	if after := holder0(t, c.Nodes[last].Store, ip.String()); !after.Expiry.Equal(before.Expiry) {
		t.Fatalf("the minority moved the committed expiry: %v → %v", before.Expiry, after.Expiry)
	}
	t.Logf("minority renewal: %v granted, %v left on the binding", rs[0].IPAddressLeaseTime(0), left.Truncate(time.Second))
}

// holder0 reads the local replica without a barrier (for a node without a
// quorum).
func holder0(t *testing.T, st *store.Store, ip string) store.Lease {
	t.Helper()
	l, err := st.AddressLease(ip)
	if err != nil {
		t.Fatalf("no record of %s: %v", ip, err)
	}
	return l
}

// Issue 11: reloading leases must never let a stale record for an address
// replace a live binding. Records of the older per-MAC lease command come
// back in MAC order; here the stale one (a client that released 10.96.0.120
// long ago) sorts after the live holder, so a loader that let the later
// record win (the table of main before this branch did) lost the binding. A DHCP server started on that
// store still knows the live binding: it offers the address to nobody
// else, NAKs the stale client asking for it back, and renews the holder.
func TestDHCPReloadKeepsLiveBinding(t *testing.T) {
	st := storetest.NewLocal(t)
	ctx := context.Background()
	const x = "10.96.0.120"
	if err := st.PutLeases(ctx, []store.Lease{
		{MAC: "52:54:00:96:0b:02", IP: x, State: store.LeaseBound, Expiry: time.Now().Add(time.Hour)},
		{MAC: "52:54:00:96:0b:09", IP: x, State: store.LeaseReleased, Expiry: time.Now().Add(-time.Hour)},
	}); err != nil {
		t.Fatal(err)
	}
	b := &dhcpBackend{st: st, scriptURL: func(string) string { return "" }, log: slog.New(slog.NewTextHandler(io.Discard, nil)), discoveries: make(chan discovery, 4)}
	cfg := dhcp.DefaultConfig()
	cfg.Interface, cfg.ServerIP = "unused0", netip.MustParseAddr("10.96.0.1")
	cfg.Subnets = []dhcp.Subnet{{CIDR: leaseSubnet, PoolStart: netip.MustParseAddr(x), PoolEnd: netip.MustParseAddr("10.96.0.121")}}
	s, err := dhcp.New(cfg, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	bcast := netip.MustParseAddrPort("255.255.255.255:67")
	from := netip.MustParseAddrPort("0.0.0.0:68")
	o, _, err := s.Handle(dmsg(t, "52:54:00:96:0b:03", dhcpv4.MessageTypeDiscover, 0, dhcpv4.OptRequestedIPAddress(net.ParseIP(x))), from, bcast)
	if err != nil || o == nil || o.YourIPAddr.String() == x {
		t.Fatalf("a third client was offered %v (%v): the live binding was lost on reload", o, err)
	}
	if r, _, _ := s.Handle(dmsg(t, "52:54:00:96:0b:09", dhcpv4.MessageTypeRequest, 0, dhcpv4.OptRequestedIPAddress(net.ParseIP(x))), from, bcast); r == nil || r.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("the stale client asking for its old address: %v, want NAK", r)
	}
	if r, _, _ := s.Handle(dmsg(t, "52:54:00:96:0b:02", dhcpv4.MessageTypeRequest, 0, dhcpv4.OptRequestedIPAddress(net.ParseIP(x))), from, bcast); r == nil || r.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("the holder's renewal: %v, want ACK", r)
	}
}

// boot.dhcp.balance_wait: unset leaves the dhcp default, 0s makes every
// node answer every client at once, a negative wait is refused by Validate.
func TestConfigBalanceWait(t *testing.T) {
	base := "boot:\n  interface: eth1\n  server_ip: 10.96.0.1\n  dhcp:\n    enabled: true\n    subnets:\n      - cidr: 10.96.0.0/24\n        pool_start: 10.96.0.100\n        pool_end: 10.96.0.139\n"
	cfg, err := LoadConfig(writeConfig(t, base))
	if err != nil || cfg.Boot.DHCP.BalanceWait != nil {
		t.Fatalf("unset: %v %v", cfg.Boot.DHCP.BalanceWait, err)
	}
	cfg, err = LoadConfig(writeConfig(t, base+"    balance_wait: 0s\n"))
	if err != nil || cfg.Boot.DHCP.BalanceWait == nil || *cfg.Boot.DHCP.BalanceWait != 0 {
		t.Fatalf("0s: %v %v", cfg.Boot.DHCP.BalanceWait, err)
	}
	cfg, err = LoadConfig(writeConfig(t, base+"    balance_wait: -1s\n"))
	if err == nil {
		err = cfg.Validate()
	}
	if err == nil || !strings.Contains(err.Error(), "balance_wait") {
		t.Fatalf("negative balance_wait: %v", err)
	}
}
