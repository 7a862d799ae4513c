package dhcp

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// roundTrip encodes a reply with the package's encoder and parses it back.
func roundTrip(t testing.TB, s *Server, r *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, []byte) {
	t.Helper()
	b, err := encode(r, s.cfg.MaxFileLen, s.cfg.MaxSnameLen)
	if err != nil {
		t.Fatal(err)
	}
	p, err := dhcpv4.FromBytes(b)
	if err != nil {
		t.Fatalf("reply does not parse: %v", err)
	}
	return p, b
}

func TestBootFilePerArch(t *testing.T) {
	s, b := newTestServer(t, nil)
	b.machines["52:54:00:00:00:05"] = MachineInfo{ID: "m5", Netboot: true, BootOverride: "snp.efi"}
	b.machines["52:54:00:00:00:06"] = MachineInfo{ID: "m6", Netboot: false}
	b.machines["52:54:00:00:00:07"] = MachineInfo{ID: "m7", Netboot: true, ScriptURL: "http://10.71.0.1:8080/ipxe/custom"}
	cases := []struct {
		name, mac string
		opts      []dhcpv4.Option
		file, vc  string
		pxe43     bool
	}{
		{"bios", "52:54:00:00:00:01", []dhcpv4.Option{arch(0), vendor("PXEClient:Arch:00000:UNDI:002001")}, "undionly.kpxe", "PXEClient", true},
		{"efi7", "52:54:00:00:00:01", []dhcpv4.Option{arch(7), vendor("PXEClient:Arch:00007:UNDI:003016")}, "ipxe.efi", "PXEClient", true},
		{"efi9", "52:54:00:00:00:01", []dhcpv4.Option{arch(9), vendor("PXEClient:Arch:00009:UNDI:003016")}, "ipxe.efi", "PXEClient", true},
		{"arm64", "52:54:00:00:00:01", []dhcpv4.Option{arch(11), vendor("PXEClient:Arch:00011:UNDI:003000")}, "snp.efi", "PXEClient", true},
		{"http16", "52:54:00:00:00:01", []dhcpv4.Option{arch(16), vendor("HTTPClient:Arch:00016:UNDI:003000")}, "http://10.71.0.1:8080/ipxe.efi", "HTTPClient", false},
		{"http19", "52:54:00:00:00:01", []dhcpv4.Option{arch(19), vendor("HTTPClient:Arch:00019:UNDI:003000")}, "http://10.71.0.1:8080/snp.efi", "HTTPClient", false},
		{"http-vendor-only", "52:54:00:00:00:01", []dhcpv4.Option{arch(7), vendor("HTTPClient")}, "http://10.71.0.1:8080/ipxe.efi", "HTTPClient", false},
		{"ipxe-raw77", "52:54:00:00:00:0a", []dhcpv4.Option{arch(0), vendor("PXEClient:Arch:00000:UNDI:002001"), generic(77, []byte("iPXE"))}, "http://10.71.0.1:8080/ipxe/52:54:00:00:00:0a", "PXEClient", true},
		{"ipxe-rfc3004", "52:54:00:00:00:0a", []dhcpv4.Option{arch(7), generic(77, append([]byte{4}, "iPXE"...))}, "http://10.71.0.1:8080/ipxe/52:54:00:00:00:0a", "", false},
		{"ipxe-175", "52:54:00:00:00:0a", []dhcpv4.Option{arch(7), generic(175, []byte{1, 1, 1})}, "http://10.71.0.1:8080/ipxe/52:54:00:00:00:0a", "", false},
		{"ipxe-script", "52:54:00:00:00:07", []dhcpv4.Option{generic(77, []byte("iPXE"))}, "http://10.71.0.1:8080/ipxe/custom", "", false},
		{"override", "52:54:00:00:00:05", []dhcpv4.Option{arch(7), vendor("PXEClient")}, "snp.efi", "PXEClient", true},
		{"override-http", "52:54:00:00:00:05", []dhcpv4.Option{arch(16), vendor("HTTPClient")}, "http://10.71.0.1:8080/snp.efi", "HTTPClient", false},
		{"netboot-false", "52:54:00:00:00:06", []dhcpv4.Option{arch(7), vendor("PXEClient")}, "", "", false},
		{"plain-client", "52:54:00:00:00:01", nil, "", "", false},
		{"unknown-arch", "52:54:00:00:00:01", []dhcpv4.Option{arch(42), vendor("PXEClient")}, "", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := msg(t, tc.mac, dhcpv4.MessageTypeDiscover, tc.opts...)
			uuid := append([]byte{0}, bytes.Repeat([]byte{0xab}, 16)...)
			req.UpdateOption(generic(97, uuid))
			resp, dst, err := s.Handle(req, anySrc, bcastDst)
			if err != nil || resp == nil {
				t.Fatalf("resp %v err %v", resp, err)
			}
			if dst.String() != "255.255.255.255:68" {
				t.Errorf("dst %v", dst)
			}
			p, raw := roundTrip(t, s, resp)
			if p.MessageType() != dhcpv4.MessageTypeOffer || !p.YourIPAddr.Equal(net.IPv4(10, 71, 0, 100)) && !strings.HasPrefix(p.YourIPAddr.String(), "10.71.0.1") {
				t.Errorf("type %v yiaddr %v", p.MessageType(), p.YourIPAddr)
			}
			if p.BootFileName != tc.file || p.BootFileNameOption() != tc.file {
				t.Errorf("file %q opt67 %q, want %q", p.BootFileName, p.BootFileNameOption(), tc.file)
			}
			if got := p.ClassIdentifier(); got != tc.vc {
				t.Errorf("option 60 %q, want %q", got, tc.vc)
			}
			if got := p.Options.Get(dhcpv4.GenericOptionCode(43)); tc.pxe43 != bytes.Equal(got, []byte{6, 1, 8, 255}) {
				t.Errorf("option 43 %x (want PXE discovery control %v)", got, tc.pxe43)
			}
			if tc.file != "" {
				if !p.ServerIPAddr.Equal(net.IPv4(10, 71, 0, 1)) || p.ServerHostName != "10.71.0.1" || p.TFTPServerName() != "10.71.0.1" {
					t.Errorf("siaddr %v sname %q opt66 %q", p.ServerIPAddr, p.ServerHostName, p.TFTPServerName())
				}
				if !bytes.Equal(p.Options.Get(dhcpv4.GenericOptionCode(97)), uuid) {
					t.Errorf("option 97 not echoed")
				}
				// file field NUL-padded
				if f := raw[108+len(tc.file) : 236]; !bytes.Equal(f, make([]byte, len(f))) {
					t.Errorf("file field not NUL padded")
				}
				assertNo67BeforeEnd(t, raw)
			}
			if !bytes.Equal(p.Options.Get(dhcpv4.OptionServerIdentifier), testServerIP.AsSlice()) {
				t.Errorf("option 54 %v", p.ServerIdentifier())
			}
		})
	}
}

// assertNo67BeforeEnd walks the options and fails when End follows option 67.
func assertNo67BeforeEnd(t testing.TB, raw []byte) {
	t.Helper()
	prev := -1
	for o := raw[240:]; len(o) > 0; {
		c := o[0]
		if c == 255 {
			if prev == 67 {
				t.Errorf("option 67 directly followed by End")
			}
			return
		}
		if c == 0 {
			prev = 0
			o = o[1:]
			continue
		}
		if len(o) < 2 || len(o) < 2+int(o[1]) {
			t.Fatalf("truncated options")
		}
		prev = int(c)
		o = o[2+int(o[1]):]
	}
	t.Errorf("no End option")
}

func TestDORAAndRFC2131(t *testing.T) {
	s, b := newTestServer(t, nil)
	mac := "52:54:00:00:01:01"
	offer, _, err := s.Handle(msg(t, mac, dhcpv4.MessageTypeDiscover), anySrc, bcastDst)
	if err != nil || offer == nil {
		t.Fatal(offer, err)
	}
	yi := offer.YourIPAddr
	// REQUEST naming another server: silence, and no lease saved.
	other := msg(t, mac, dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(yi), dhcpv4.OptServerIdentifier(net.IPv4(10, 71, 0, 99)))
	if r, _, err := s.Handle(other, anySrc, bcastDst); r != nil || err != nil {
		t.Fatalf("option 54 of another server answered: %v %v", r, err)
	}
	if len(b.saved) != 0 {
		t.Fatalf("lease saved for another server's request")
	}
	req := msg(t, mac, dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(yi), dhcpv4.OptServerIdentifier(testServerIP.AsSlice()))
	ack, _, err := s.Handle(req, anySrc, bcastDst)
	if err != nil || ack.MessageType() != dhcpv4.MessageTypeAck || !ack.YourIPAddr.Equal(yi) {
		t.Fatalf("ack %v %v", ack, err)
	}
	if len(b.saved) != 1 || b.saved[0].State != LeaseBound || b.saved[0].IP.String() != yi.String() {
		t.Fatalf("saved %+v", b.saved)
	}
	if lt := ack.IPAddressLeaseTime(0); lt != DefaultLeaseTime {
		t.Errorf("lease time %v", lt)
	}
	// Renew: unicast to our address with ciaddr, answered to ciaddr:68.
	renew := msg(t, mac, dhcpv4.MessageTypeRequest)
	renew.ClientIPAddr = yi
	renew.SetUnicast()
	ack2, dst, err := s.Handle(renew, netip.AddrPortFrom(netip.MustParseAddr(yi.String()), 68), netip.AddrPortFrom(testServerIP, 67))
	if err != nil || ack2.MessageType() != dhcpv4.MessageTypeAck || dst.String() != yi.String()+":68" {
		t.Fatalf("renew %v %v %v", ack2, dst, err)
	}
	// Another MAC cannot take the bound address: INIT-REBOOT NAK.
	steal := msg(t, "52:54:00:00:01:02", dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(yi))
	nak, dst, err := s.Handle(steal, anySrc, bcastDst)
	if err != nil || nak.MessageType() != dhcpv4.MessageTypeNak || dst.Addr().String() != "255.255.255.255" {
		t.Fatalf("steal: %v %v %v", nak, dst, err)
	}
	// INIT-REBOOT for an address of another subnet: NAK.
	wrong := msg(t, mac, dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(net.IPv4(192, 168, 1, 5)))
	if nak, _, _ := s.Handle(wrong, anySrc, bcastDst); nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("wrong subnet not NAKed: %v", nak)
	}
	// INIT-REBOOT for its own address: ACK.
	own := msg(t, mac, dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(yi))
	if ack, _, _ := s.Handle(own, anySrc, bcastDst); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("init-reboot own: %v", ack)
	}
	// RELEASE frees it: another MAC can now get it.
	rel := msg(t, mac, dhcpv4.MessageTypeRelease, dhcpv4.OptServerIdentifier(testServerIP.AsSlice()))
	rel.ClientIPAddr = yi
	if r, _, err := s.Handle(rel, anySrc, netip.AddrPortFrom(testServerIP, 67)); r != nil || err != nil {
		t.Fatalf("release answered: %v %v", r, err)
	}
	bound := b.saved[len(b.saved)-2] // the INIT-REBOOT's binding
	if last := b.saved[len(b.saved)-1]; last.State != LeaseReleased || !last.Expiry.Equal(bound.Expiry) || bound.State != LeaseBound {
		t.Fatalf("release not persisted naming the binding it ends (%+v): %+v", bound, last)
	}
	if ack, _, _ := s.Handle(steal, anySrc, bcastDst); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("released address not reusable: %v", ack)
	}
	// DECLINE marks it bad: the next DISCOVER gets another address.
	dec := msg(t, "52:54:00:00:01:02", dhcpv4.MessageTypeDecline, dhcpv4.OptRequestedIPAddress(yi), dhcpv4.OptServerIdentifier(testServerIP.AsSlice()))
	if r, _, err := s.Handle(dec, anySrc, bcastDst); r != nil || err != nil {
		t.Fatalf("decline answered: %v %v", r, err)
	}
	if last := b.saved[len(b.saved)-1]; last.State != LeaseDeclined || last.IP.String() != yi.String() {
		t.Fatalf("decline not persisted: %+v", last)
	}
	o2, _, _ := s.Handle(msg(t, "52:54:00:00:01:02", dhcpv4.MessageTypeDiscover, dhcpv4.OptRequestedIPAddress(yi)), anySrc, bcastDst)
	if o2 == nil || o2.YourIPAddr.Equal(yi) {
		t.Fatalf("declined address offered again: %v", o2)
	}
	if len(b.discovered) != 2 {
		t.Errorf("discovered %v, want 2 MACs once each", b.discovered)
	}
}

func TestReservationAndHostname(t *testing.T) {
	s, b := newTestServer(t, nil)
	b.machines["52:54:00:00:02:01"] = MachineInfo{ID: "m", IP: netip.MustParseAddr("10.71.0.20"), Hostname: "node-1", Netboot: true}
	o, _, err := s.Handle(msg(t, "52:54:00:00:02:01", dhcpv4.MessageTypeDiscover, arch(16), vendor("HTTPClient")), anySrc, bcastDst)
	if err != nil || !o.YourIPAddr.Equal(net.IPv4(10, 71, 0, 20)) || o.HostName() != "node-1" || o.ClassIdentifier() != "HTTPClient" {
		t.Fatalf("%v %v", o, err)
	}
	nak, _, _ := s.Handle(msg(t, "52:54:00:00:02:01", dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(net.IPv4(10, 71, 0, 150))), anySrc, bcastDst)
	if nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("request off reservation not NAKed: %v", nak)
	}
}

func TestRelayedRequest(t *testing.T) {
	s, _ := newTestServer(t, nil)
	o82 := []byte{1, 4, 'p', 'o', 'r', 't', 2, 3, 'r', 'a', 'k'}
	req := msg(t, "52:54:00:00:03:01", dhcpv4.MessageTypeDiscover, arch(7), vendor("PXEClient"), generic(82, o82), generic(97, make([]byte, 17)))
	req.GatewayIPAddr = net.IPv4(10, 71, 9, 1)
	req.HopCount = 1
	resp, dst, err := s.Handle(req, netip.MustParseAddrPort("10.71.9.1:67"), netip.AddrPortFrom(testServerIP, 67))
	if err != nil || resp == nil {
		t.Fatal(err)
	}
	if dst.String() != "10.71.9.1:67" {
		t.Errorf("dst %v, want giaddr:67", dst)
	}
	p, raw := roundTrip(t, s, resp)
	if !p.GatewayIPAddr.Equal(net.IPv4(10, 71, 9, 1)) || !strings.HasPrefix(p.YourIPAddr.String(), "10.71.9.") {
		t.Errorf("giaddr %v yiaddr %v", p.GatewayIPAddr, p.YourIPAddr)
	}
	if r := p.Options.Get(dhcpv4.GenericOptionCode(82)); !bytes.Equal(r, o82) {
		t.Errorf("option 82 %x", r)
	}
	// option 82 is the last option before End (and padding)
	var lastCode byte
	for o := raw[240:]; len(o) > 0 && o[0] != 255; {
		if o[0] == 0 {
			o = o[1:]
			continue
		}
		lastCode = o[0]
		o = o[2+int(o[1]):]
	}
	if lastCode != 82 {
		t.Errorf("last option %d, want 82", lastCode)
	}
}

func TestFieldTooLongRejected(t *testing.T) {
	s, b := newTestServer(t, nil)
	b.machines["52:54:00:00:04:01"] = MachineInfo{Netboot: true, ScriptURL: "http://x/" + strings.Repeat("a", 130)}
	_, _, err := s.Handle(msg(t, "52:54:00:00:04:01", dhcpv4.MessageTypeDiscover, generic(77, []byte("iPXE"))), anySrc, bcastDst)
	if !errors.Is(err, ErrFieldTooLong) {
		t.Fatalf("err %v, want ErrFieldTooLong", err)
	}
	long := &dhcpv4.DHCPv4{ClientHWAddr: make(net.HardwareAddr, 6), ServerHostName: strings.Repeat("s", 64), Options: dhcpv4.Options{}}
	if _, err := encode(long, MaxFileLen, MaxSnameLen); !errors.Is(err, ErrFieldTooLong) {
		t.Fatalf("sname: %v", err)
	}
	c := testConfig()
	c.HTTPBootURL = "http://" + strings.Repeat("h", 110)
	if err := c.Validate(); !errors.Is(err, ErrFieldTooLong) {
		t.Fatalf("validate long url: %v", err)
	}
}

func TestProxyMode(t *testing.T) {
	s, _ := newTestServer(t, func(c *Config) { c.Mode = ModeProxy; c.Subnets = nil })
	// Non-PXE client: silence.
	if r, _, _ := s.Handle(msg(t, "52:54:00:00:05:01", dhcpv4.MessageTypeDiscover), anySrc, bcastDst); r != nil {
		t.Fatalf("proxy answered plain client")
	}
	r, _, err := s.Handle(msg(t, "52:54:00:00:05:01", dhcpv4.MessageTypeDiscover, arch(7), vendor("PXEClient:Arch:00007")), anySrc, bcastDst)
	if err != nil || r == nil || r.MessageType() != dhcpv4.MessageTypeOffer || !r.YourIPAddr.IsUnspecified() || r.BootFileName != "ipxe.efi" || r.ClassIdentifier() != "PXEClient" {
		t.Fatalf("proxy offer %v %v", r, err)
	}
	// REQUEST on port 4011, answered to the sender.
	req := msg(t, "52:54:00:00:05:01", dhcpv4.MessageTypeRequest, arch(7), vendor("PXEClient:Arch:00007"))
	req.ClientIPAddr = net.IPv4(10, 71, 0, 50)
	r, dst, err := s.Handle(req, netip.MustParseAddrPort("10.71.0.50:4011"), netip.AddrPortFrom(testServerIP, 4011))
	if err != nil || r == nil || r.MessageType() != dhcpv4.MessageTypeAck || dst.String() != "10.71.0.50:4011" {
		t.Fatalf("proxy ack %v %v %v", r, dst, err)
	}
	// REQUEST on 67 goes to the real server: silence.
	if r, _, _ := s.Handle(req, anySrc, bcastDst); r != nil {
		t.Fatalf("proxy answered REQUEST on 67")
	}
}

// TestFirmwareCaptures replays the client packets of real firmware captures
// through the handler and checks the boot answer of each.
func TestFirmwareCaptures(t *testing.T) {
	dir := "testdata"
	want := map[string][]string{
		"seabios-ipxe-rom.pcap":    {"http://10.71.0.1:8080/ipxe/"},
		"ovmf-ipxe-efi-rom.pcap":   {"http://10.71.0.1:8080/ipxe/"},
		"ovmf-uefi-http-boot.pcap": {"http://10.71.0.1:8080/ipxe.efi", "http://10.71.0.1:8080/ipxe/"},
	}
	for name, prefixes := range want {
		t.Run(name, func(t *testing.T) {
			pkts := pcapPayloads(t, filepath.Join(dir, name))
			if len(pkts) == 0 {
				t.Fatalf("capture %s holds no DHCP frames (UDP port 67/68)", name)
			}
			s, _ := newTestServer(t, nil)
			seen := map[string]bool{}
			for _, raw := range pkts {
				req, err := dhcpv4.FromBytes(raw)
				if err != nil {
					t.Fatalf("capture packet does not parse: %v", err)
				}
				if req.MessageType() != dhcpv4.MessageTypeDiscover {
					continue
				}
				resp, _, err := s.Handle(req, anySrc, bcastDst)
				if err != nil || resp == nil {
					t.Fatalf("no answer to %s: %v", req.Summary(), err)
				}
				p, raw := roundTrip(t, s, resp)
				assertNo67BeforeEnd(t, raw)
				for _, pre := range prefixes {
					if strings.HasPrefix(p.BootFileName, pre) {
						seen[pre] = true
					}
				}
				if c := classify(req); c.http && p.ClassIdentifier() != "HTTPClient" {
					t.Errorf("HTTP boot client without option 60 HTTPClient")
				}
			}
			for _, pre := range prefixes {
				if !seen[pre] {
					t.Errorf("no reply with file %s…", pre)
				}
			}
		})
	}
}

func TestPerMACRateLimit(t *testing.T) {
	m := newMACBucket(2, 4) // 2/s, burst 4
	k := [6]byte{1, 2, 3, 4, 5, 6}
	now := time.Unix(1000, 0)
	n := 0
	for range 10 {
		if m.allow(k, now) {
			n++
		}
	}
	if n != 4 {
		t.Fatalf("burst allowed %d, want 4", n)
	}
	if m.allow([6]byte{9}, now) != true {
		t.Fatal("other MAC limited")
	}
	if !m.allow(k, now.Add(600*time.Millisecond)) || m.allow(k, now.Add(600*time.Millisecond)) {
		t.Fatal("refill: want exactly one token after 0.6 s at 2/s")
	}
	g := newMACGate(time.Minute)
	mac := net.HardwareAddr(k[:])
	if !g.allow(mac, now) || g.allow(mac, now.Add(time.Second)) || !g.allow(mac, now.Add(2*time.Minute)) {
		t.Fatal("discovery gate: want once per interval")
	}
}

func TestValidate(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"mode":      func(c *Config) { c.Mode = "x" },
		"server_ip": func(c *Config) { c.ServerIP = netip.Addr{} },
		"pool":      func(c *Config) { c.Subnets[0].PoolEnd = netip.MustParseAddr("10.72.0.1") },
		"workers":   func(c *Config) { c.Workers = 0 },
		"url":       func(c *Config) { c.HTTPBootURL = "ftp://x/" },
		"subnets":   func(c *Config) { c.Subnets = nil },
	} {
		c := testConfig()
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	c := testConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

// A DISCOVER whose chaddr is a group (broadcast, multicast) or all-zero
// address names no NIC: silence, a malformed drop, no lease and no
// discovered machine (any host on the segment could otherwise fill the
// inventory and the pool with impossible machines).
func TestGroupOrZeroChaddrDropped(t *testing.T) {
	s, b := newTestServer(t, nil)
	for _, mac := range []string{"ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01", "33:33:00:00:00:01", "00:00:00:00:00:00", "53:54:00:00:00:01"} {
		r, _, err := s.Handle(msg(t, mac, dhcpv4.MessageTypeDiscover, arch(0), vendor("PXEClient")), anySrc, bcastDst)
		if r != nil {
			t.Errorf("%s: answered %v", mac, r.MessageType())
		}
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", mac, err)
		}
	}
	b.mu.Lock()
	disc, saved := len(b.discovered), len(b.saved)
	b.mu.Unlock()
	if disc != 0 || saved != 0 {
		t.Fatalf("recorded %d discovered machines, %d leases", disc, saved)
	}
	// A unicast MAC with the locally-administered bit (qemu's 52:54:00) is fine.
	if r, _, err := s.Handle(msg(t, "52:54:00:00:00:01", dhcpv4.MessageTypeDiscover), anySrc, bcastDst); err != nil || r == nil {
		t.Fatalf("unicast MAC: %v %v", r, err)
	}
}
