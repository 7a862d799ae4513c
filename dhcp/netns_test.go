package dhcp

import (
	"bytes"
	"context"
	"encoding/hex"
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
	"sync/atomic"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"kiln/deploy/lab/testkit"
	"kiln/deploy/lab/testreq"
)

// Tests in this file build network namespaces kdh-<id>-s (server) and
// kdh-<id>-c (client) joined by a veth pair, addresses 10.71.<n>.0/24 (and
// 10.71.<n+100>.0/24 behind a simulated relay), and run real clients in them.

var netSeq atomic.Int32

type lab struct {
	srvNS, cliNS string
	srvIf, cliIf string
	n            int
	serverIP     netip.Addr
	clientIP     netip.Addr // static address for relay-style clients
	relayIP      netip.Addr // on the client's lo, routed from the server
}

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func newLab(t testing.TB) *lab {
	t.Helper()
	n := int(netSeq.Add(1)) + os.Getpid()%40
	id := fmt.Sprintf("%d", n)
	l := &lab{srvNS: "kdh-" + id + "-s", cliNS: "kdh-" + id + "-c", srvIf: "kdh" + id + "s", cliIf: "kdh" + id + "c", n: n,
		serverIP: netip.MustParseAddr(fmt.Sprintf("10.71.%d.1", n)), clientIP: netip.MustParseAddr(fmt.Sprintf("10.71.%d.2", n)),
		relayIP: netip.MustParseAddr(fmt.Sprintf("10.71.%d.1", n+100))}
	testkit.Netns(t, l.srvNS)
	testkit.Netns(t, l.cliNS)
	testkit.Veth(t, testkit.VethEnd{NS: l.srvNS, Name: l.srvIf, Addr: l.serverIP.String() + "/24"}, testkit.VethEnd{NS: l.cliNS, Name: l.cliIf}, 0)
	testkit.IP(t, "-n", l.srvNS, "route", "add", fmt.Sprintf("10.71.%d.0/24", n+100), "via", l.clientIP.String())
	testkit.IP(t, "-n", l.cliNS, "addr", "add", l.relayIP.String()+"/32", "dev", "lo")
	return l
}

func (l *lab) addClientIP(t testing.TB) {
	run(t, "ip", "netns", "exec", l.cliNS, "ip", "addr", "add", l.clientIP.String()+"/24", "dev", l.cliIf)
}

func (l *lab) config() Config {
	c := DefaultConfig()
	c.Interface = l.srvIf
	c.ServerIP = l.serverIP
	c.HTTPBootURL = "http://" + l.serverIP.String() + ":8080"
	c.Subnets = []Subnet{
		{CIDR: netip.PrefixFrom(l.serverIP, 24).Masked(), Router: l.serverIP, DNS: []netip.Addr{l.serverIP},
			PoolStart: netip.MustParseAddr(fmt.Sprintf("10.71.%d.100", l.n)), PoolEnd: netip.MustParseAddr(fmt.Sprintf("10.71.%d.250", l.n)), LeaseTime: 10 * time.Minute},
		{CIDR: netip.PrefixFrom(l.relayIP, 24).Masked(), Router: l.relayIP,
			PoolStart: netip.MustParseAddr(fmt.Sprintf("10.71.%d.100", l.n+100)), PoolEnd: netip.MustParseAddr(fmt.Sprintf("10.71.%d.250", l.n+100))},
	}
	return c
}

// inNetns runs fn inside the named namespace (testkit.InNetns).
func inNetns(t testing.TB, ns string, fn func()) { testkit.InNetns(t, ns, fn) }

// startServer opens the server's sockets in the server namespace and runs it
// until the test ends.
func startServer(t testing.TB, l *lab, cfg Config, b Backend) *Server {
	t.Helper()
	s, err := New(cfg, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	var lerr error
	inNetns(t, l.srvNS, func() { lerr = s.Listen() })
	if lerr != nil {
		t.Fatal(lerr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := s.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return s
}

const hookScript = `#!/bin/sh
# Minimal hook for dhclient (-sf) and udhcpc (-s): configures the address only.
if [ -n "$reason" ]; then
  case "$reason" in BOUND|RENEW|REBIND|REBOOT)
    ip addr replace "$new_ip_address/${new_subnet_mask:-255.255.255.0}" dev "$interface"
    echo "dhclient: $reason ip=$new_ip_address server=$new_dhcp_server_identifier lease=$new_dhcp_lease_time" >> "$KDH_OUT" ;;
  esac
else
  case "$1" in bound|renew)
    ip addr replace "$ip/${mask:-24}" dev "$interface"
    echo "udhcpc: $1 ip=$ip server=$serverid lease=$lease" >> "$KDH_OUT" ;;
  deconfig) ip addr flush dev "$interface" ;;
  esac
fi
`

func writeHook(t testing.TB) (script, out string) {
	dir := t.TempDir()
	script, out = filepath.Join(dir, "hook.sh"), filepath.Join(dir, "out")
	// dhclient clears the environment: the output path is baked in.
	text := strings.ReplaceAll(hookScript, `"$KDH_OUT"`, `"`+out+`"`)
	if err := os.WriteFile(script, []byte(text), 0o755); err != nil {
		t.Fatal(err)
	}
	return script, out
}

func TestNetnsDhclientAndUdhcpc(t *testing.T) {
	testreq.Root(t, "network namespaces", "ip", "dhclient", "udhcpc")
	l := newLab(t)
	b := newBoltBackend(t)
	startServer(t, l, l.config(), b)
	script, out := writeHook(t)
	dir := t.TempDir()

	// dhclient in the foreground, once; ended by PID when it has bound.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", l.cliNS, "dhclient", "-4", "-d", "-1", "-v",
		"-sf", script, "-pf", filepath.Join(dir, "dhclient.pid"), "-lf", filepath.Join(dir, "dhclient.leases"), l.cliIf)
	cmd.Env = append(os.Environ(), "KDH_OUT="+out)
	var stderr syncBuf
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	want := "dhclient: BOUND ip=10.71."
	deadline := time.Now().Add(25 * time.Second)
	for {
		data, _ := os.ReadFile(out)
		if strings.Contains(string(data), want) {
			if !strings.Contains(string(data), "server="+l.serverIP.String()) || !strings.Contains(string(data), "lease=600") {
				t.Errorf("dhclient lease: %s", data)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dhclient got no lease: %s\n%s", data, stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	run(t, "ip", "netns", "exec", l.cliNS, "ip", "addr", "flush", "dev", l.cliIf)

	// udhcpc: quits after the lease (-q), fails after 5 tries (-n).
	u := exec.CommandContext(ctx, "ip", "netns", "exec", l.cliNS, "udhcpc", "-f", "-q", "-n", "-t", "5", "-T", "1", "-i", l.cliIf, "-s", script)
	u.Env = append(os.Environ(), "KDH_OUT="+out)
	if o, err := u.CombinedOutput(); err != nil {
		t.Fatalf("udhcpc: %v\n%s", err, o)
	}
	data, _ := os.ReadFile(out)
	if !strings.Contains(string(data), "udhcpc: bound ip=10.71.") || !strings.Contains(string(data), "server="+l.serverIP.String()) {
		t.Fatalf("udhcpc lease: %s", data)
	}
	ls, err := b.LoadLeases()
	if err != nil || len(ls) < 1 {
		t.Fatalf("leases not durable: %v %v", ls, err)
	}
	for _, le := range ls {
		if le.State != LeaseBound || !netip.PrefixFrom(l.serverIP, 24).Masked().Contains(le.IP) {
			t.Errorf("lease %+v", le)
		}
	}
	t.Logf("%s", data)
}

// relayClient is a DHCP relay simulated in the client namespace: it listens on
// relayIP:67 and sends requests with giaddr=relayIP to the server.
type relayClient struct {
	conn net.PacketConn
	l    *lab
}

func newRelayClient(t testing.TB, l *lab) *relayClient {
	var conn net.PacketConn
	var err error
	inNetns(t, l.cliNS, func() {
		conn, err = net.ListenPacket("udp4", l.relayIP.String()+":67")
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &relayClient{conn: conn, l: l}
}

func (r *relayClient) exchange(t testing.TB, req *dhcpv4.DHCPv4, wait time.Duration) *dhcpv4.DHCPv4 {
	t.Helper()
	req.GatewayIPAddr = r.l.relayIP.AsSlice()
	req.HopCount = 1
	if _, err := r.conn.WriteTo(req.ToBytes(), &net.UDPAddr{IP: r.l.serverIP.AsSlice(), Port: 67}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1500)
	for {
		r.conn.SetReadDeadline(time.Now().Add(wait))
		n, from, err := r.conn.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil
			}
			t.Fatal(err)
		}
		resp, err := dhcpv4.FromBytes(buf[:n])
		if err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}
		if resp.TransactionID != req.TransactionID {
			continue
		}
		if from.(*net.UDPAddr).IP.String() != r.l.serverIP.String() {
			t.Errorf("reply source %v, want %v", from, r.l.serverIP)
		}
		return resp
	}
}

func TestNetnsRelayAndServerID(t *testing.T) {
	testreq.Root(t, "network namespaces", "ip")
	l := newLab(t)
	l.addClientIP(t)
	b := newBoltBackend(t)
	startServer(t, l, l.config(), b)
	rc := newRelayClient(t, l)

	o82 := []byte{1, 6, 's', 'w', '1', '/', '4', '2', 2, 2, 'r', '7'}
	mac := "52:54:00:71:00:01"
	disc := msg(t, mac, dhcpv4.MessageTypeDiscover, arch(0), vendor("PXEClient:Arch:00000:UNDI:002001"), generic(82, o82))
	offer := rc.exchange(t, disc, 3*time.Second)
	if offer == nil {
		t.Fatal("no OFFER to giaddr:67")
	}
	if !offer.GatewayIPAddr.Equal(l.relayIP.AsSlice()) || !netip.PrefixFrom(l.relayIP, 24).Masked().Contains(netip.MustParseAddr(offer.YourIPAddr.String())) {
		t.Errorf("giaddr %v yiaddr %v", offer.GatewayIPAddr, offer.YourIPAddr)
	}
	if !bytes.Equal(offer.Options.Get(dhcpv4.GenericOptionCode(82)), o82) || offer.BootFileName != "undionly.kpxe" {
		t.Errorf("option 82 %x file %q", offer.Options.Get(dhcpv4.GenericOptionCode(82)), offer.BootFileName)
	}
	if sid := offer.ServerIdentifier(); !sid.Equal(l.serverIP.AsSlice()) {
		t.Errorf("option 54 %v", sid)
	}
	// REQUEST naming another server: silence.
	other := msg(t, mac, dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(offer.YourIPAddr), dhcpv4.OptServerIdentifier(net.IPv4(10, 71, byte(l.n), 77)))
	other.TransactionID = disc.TransactionID
	if r := rc.exchange(t, other, 700*time.Millisecond); r != nil {
		t.Fatalf("answered a REQUEST for another server: %s", r.Summary())
	}
	req := msg(t, mac, dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(offer.YourIPAddr), dhcpv4.OptServerIdentifier(l.serverIP.AsSlice()), generic(82, o82))
	ack := rc.exchange(t, req, 3*time.Second)
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || !ack.YourIPAddr.Equal(offer.YourIPAddr) {
		t.Fatalf("ack: %v", ack)
	}
	// INIT-REBOOT of another MAC for that address: NAK (to giaddr).
	nak := rc.exchange(t, msg(t, "52:54:00:71:00:02", dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)), 3*time.Second)
	if nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("nak: %v", nak)
	}
	ls, _ := b.LoadLeases()
	if len(ls) != 1 || ls[0].IP.String() != offer.YourIPAddr.String() {
		t.Fatalf("durable leases %+v", ls)
	}
}

func TestNetnsPortInUse(t *testing.T) {
	testreq.Root(t, "network namespaces", "ip")
	l := newLab(t)
	var holder net.PacketConn
	var err error
	inNetns(t, l.srvNS, func() { holder, err = net.ListenPacket("udp4", "0.0.0.0:67") })
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	s, err := New(l.config(), newMemBackend(), nil)
	if err != nil {
		t.Fatal(err)
	}
	inNetns(t, l.srvNS, func() { err = s.Listen() })
	if !errors.Is(err, ErrPortInUse) {
		t.Fatalf("Listen with port held: %v, want ErrPortInUse", err)
	}
}

// TestNetnsPerfdhcpBootFiles runs perfdhcp (relay-style: it sets giaddr and
// listens on 67) with options 60/93/77 set by -o, captures the exchange with
// tcpdump and checks each reply's boot file against its request's arch.
func TestNetnsPerfdhcpBootFiles(t *testing.T) {
	testreq.Root(t, "network namespaces", "ip", "perfdhcp", "tcpdump")
	l := newLab(t)
	l.addClientIP(t)
	startServer(t, l, l.config(), newBoltBackend(t))
	pcap := filepath.Join(t.TempDir(), "cap.pcap")
	if d := os.Getenv("KDH_KEEP_PCAP"); d != "" {
		pcap = d
	}
	td := exec.Command("ip", "netns", "exec", l.cliNS, "tcpdump", "--immediate-mode", "-i", l.cliIf, "-U", "-n", "-w", pcap, "udp", "port", "67")
	var tdErr syncBuf
	td.Stderr = &tdErr
	if err := td.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { td.Process.Kill(); td.Wait() })
	for i := 0; !strings.Contains(tdErr.String(), "listening on"); i++ {
		if i > 100 {
			t.Fatalf("tcpdump did not start: %s", tdErr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	hx := func(s string) string { return hex.EncodeToString([]byte(s)) }
	base := "http://" + l.serverIP.String() + ":8080"
	cases := []struct {
		opts []string
		file string
	}{
		{[]string{"93,0000", "60," + hx("PXEClient:Arch:00000:UNDI:002001")}, "undionly.kpxe"},
		{[]string{"93,0007", "60," + hx("PXEClient:Arch:00007:UNDI:003016")}, "ipxe.efi"},
		{[]string{"93,0009", "60," + hx("PXEClient:Arch:00009:UNDI:003016")}, "ipxe.efi"},
		{[]string{"93,000b", "60," + hx("PXEClient:Arch:00011:UNDI:003000")}, "snp.efi"},
		{[]string{"93,0010", "60," + hx("HTTPClient:Arch:00016:UNDI:003000")}, base + "/ipxe.efi"},
		{[]string{"93,0013", "60," + hx("HTTPClient:Arch:00019:UNDI:003000")}, base + "/snp.efi"},
		{[]string{"93,0007", "60," + hx("PXEClient:Arch:00007:UNDI:003016"), "77," + hx("iPXE")}, base + "/ipxe/"},
	}
	for _, c := range cases {
		args := []string{"netns", "exec", l.cliNS, "perfdhcp", "-4", "-l", l.clientIP.String(), "-r", "20", "-n", "4", "-R", "4", "-t", "1"}
		for _, o := range c.opts {
			args = append(args, "-o", o)
		}
		args = append(args, l.serverIP.String())
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "sent packets") {
			t.Fatalf("perfdhcp %v: %v\n%s", c.opts, err, out)
		}
		if testing.Verbose() {
			t.Logf("perfdhcp %v:\n%s", c.opts, out)
		}
	}
	time.Sleep(300 * time.Millisecond)
	td.Process.Signal(os.Interrupt)
	td.Wait()
	pk := pcapPayloads(t, pcap)
	// perfdhcp numbers transactions from 0 in every run: match each reply to
	// the last request with its xid before it in the capture.
	wantByXID := map[[4]byte]string{}
	got := map[string]int{}
	for _, p := range pk {
		d, err := dhcpv4.FromBytes(p)
		if err != nil {
			t.Fatalf("captured packet does not parse: %v", err)
		}
		if d.OpCode == dhcpv4.OpcodeBootRequest {
			a := classify(d)
			for _, c := range cases {
				o := strings.Join(c.opts, " ")
				if strings.Contains(o, fmt.Sprintf("93,%04x", a.arch)) && a.ipxe == strings.Contains(o, "77,") && strings.Contains(o, hx(a.vendor)) {
					wantByXID[d.TransactionID] = c.file
				}
			}
			continue
		}
		want, ok := wantByXID[d.TransactionID]
		if !ok {
			t.Errorf("reply to unknown xid %v", d.TransactionID)
			continue
		}
		if !strings.HasPrefix(d.BootFileName, want) || !strings.HasPrefix(d.BootFileNameOption(), want) {
			t.Errorf("xid %v: file %q, want %q", d.TransactionID, d.BootFileName, want)
		}
		if strings.HasPrefix(want, "http") && !strings.HasSuffix(want, "/") && d.ClassIdentifier() != "HTTPClient" {
			t.Errorf("HTTP boot reply without option 60 HTTPClient")
		}
		if !d.GatewayIPAddr.Equal(l.clientIP.AsSlice()) {
			t.Errorf("reply giaddr %v", d.GatewayIPAddr)
		}
		got[want]++
	}
	for _, c := range cases {
		if got[c.file] == 0 {
			t.Errorf("no reply carried %q (replies by file: %v)", c.file, got)
		}
	}
	t.Logf("replies by boot file: %v", got)
}

// syncBuf is a bytes.Buffer safe for a writer goroutine and a reader.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestNetnsProxyDHCP runs proxy mode: a DISCOVER to port 67 gets an OFFER
// without address broadcast out of the ingress interface; a REQUEST to port
// 4011 gets an ACK back to its sender, from the address it was sent to.
func TestNetnsProxyDHCP(t *testing.T) {
	testreq.Root(t, "network namespaces", "ip")
	l := newLab(t)
	l.addClientIP(t)
	cfg := l.config()
	cfg.Mode = ModeProxy
	cfg.Subnets = nil
	startServer(t, l, cfg, newMemBackend())
	var conn net.PacketConn
	var err error
	inNetns(t, l.cliNS, func() { conn, err = net.ListenPacket("udp4", "0.0.0.0:68") })
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	read := func(xid dhcpv4.TransactionID, wait time.Duration) (*dhcpv4.DHCPv4, net.Addr) {
		buf := make([]byte, 1500)
		for {
			conn.SetReadDeadline(time.Now().Add(wait))
			n, from, err := conn.ReadFrom(buf)
			if err != nil {
				return nil, nil
			}
			if d, err := dhcpv4.FromBytes(buf[:n]); err == nil && d.TransactionID == xid {
				return d, from
			}
		}
	}
	mac := "52:54:00:71:04:01"
	// Plain client: silence.
	plain := msg(t, mac, dhcpv4.MessageTypeDiscover)
	if _, err := conn.WriteTo(plain.ToBytes(), &net.UDPAddr{IP: l.serverIP.AsSlice(), Port: 67}); err != nil {
		t.Fatal(err)
	}
	if p, _ := read(plain.TransactionID, 500*time.Millisecond); p != nil {
		t.Fatalf("proxy answered a non-PXE client")
	}
	disc := msg(t, mac, dhcpv4.MessageTypeDiscover, arch(7), vendor("PXEClient:Arch:00007:UNDI:003016"))
	if _, err := conn.WriteTo(disc.ToBytes(), &net.UDPAddr{IP: l.serverIP.AsSlice(), Port: 67}); err != nil {
		t.Fatal(err)
	}
	offer, _ := read(disc.TransactionID, 3*time.Second)
	if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer || !offer.YourIPAddr.IsUnspecified() || offer.BootFileName != "ipxe.efi" || offer.ClassIdentifier() != "PXEClient" {
		t.Fatalf("proxy offer: %v", offer)
	}
	req := msg(t, mac, dhcpv4.MessageTypeRequest, arch(7), vendor("PXEClient:Arch:00007:UNDI:003016"), dhcpv4.OptServerIdentifier(l.serverIP.AsSlice()))
	req.ClientIPAddr = l.clientIP.AsSlice()
	if _, err := conn.WriteTo(req.ToBytes(), &net.UDPAddr{IP: l.serverIP.AsSlice(), Port: 4011}); err != nil {
		t.Fatal(err)
	}
	ack, from := read(req.TransactionID, 3*time.Second)
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || ack.BootFileName != "ipxe.efi" {
		t.Fatalf("proxy ack on 4011: %v", ack)
	}
	if ua := from.(*net.UDPAddr); !ua.IP.Equal(l.serverIP.AsSlice()) || ua.Port != 4011 {
		t.Errorf("ack from %v, want %v:4011", from, l.serverIP)
	}
}
