package dhcp

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// cluster makes n servers (members n0..n{n-1}) over one lease record, as
// the nodes of one Kiln site over the raft log.
func cluster(t *testing.T, n int) ([]*Server, []*memBackend) {
	t.Helper()
	var ids []string
	for i := range n {
		ids = append(ids, fmt.Sprintf("n%d", i))
	}
	shared := &leaseLog{}
	var ss []*Server
	var bs []*memBackend
	for i := range n {
		b := newMemBackend()
		b.leaseLog = shared
		b.set(ids[i], ids, false)
		s, err := New(testConfig(), b, nil)
		if err != nil {
			t.Fatal(err)
		}
		ss, bs = append(ss, s), append(bs, b)
	}
	return ss, bs
}

func hw(i int) string { return fmt.Sprintf("52:54:00:12:%02x:%02x", i>>8, i&0xff) }

// A binding refused by the lease record (another node's client won the
// address first) is answered with a NAK, never an ACK, and nothing is
// stored for it.
func TestRefusedBindingIsNAKed(t *testing.T) {
	s, b := newTestServer(t, nil)
	mac := "52:54:00:12:00:01"
	offer, _, err := s.Handle(msg(t, mac, dhcpv4.MessageTypeDiscover), anySrc, bcastDst)
	if err != nil || offer == nil {
		t.Fatal(offer, err)
	}
	ip := netip.MustParseAddr(offer.YourIPAddr.String())
	b.refuse = map[netip.Addr]bool{ip: true}
	req := msg(t, mac, dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(offer.YourIPAddr), dhcpv4.OptServerIdentifier(testServerIP.AsSlice()))
	nak, dst, err := s.Handle(req, anySrc, bcastDst)
	if err != nil || nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak || dst.Addr().String() != "255.255.255.255" {
		t.Fatalf("refused binding answered %v to %v (%v), want a broadcast NAK", nak, dst, err)
	}
	if len(b.saved) != 0 {
		t.Fatalf("refused binding stored: %+v", b.saved)
	}
	b.refuse = nil
	if ack, _, _ := s.Handle(req, anySrc, bcastDst); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("accepted binding: %v", ack)
	}
}

// Every server follows the one record: a binding made through one server
// is known to the others at once — they offer other addresses to other
// clients, NAK a client asking for it, and answer its holder's renewal.
func TestEveryServerKnowsEveryBinding(t *testing.T) {
	ss, _ := cluster(t, 2)
	for _, s := range ss {
		s.cfg.BalanceWait = 0 // both answer everyone here; sharing is TestLoadBalancing
	}
	a, b := ss[0], ss[1]
	mac := "52:54:00:12:01:01"
	offer, _, _ := a.Handle(msg(t, mac, dhcpv4.MessageTypeDiscover), anySrc, bcastDst)
	req := msg(t, mac, dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(offer.YourIPAddr), dhcpv4.OptServerIdentifier(testServerIP.AsSlice()))
	if ack, _, _ := a.Handle(req, anySrc, bcastDst); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("ack: %v", ack)
	}
	x := offer.YourIPAddr
	// The other server offers another address to a new client...
	o2, _, _ := b.Handle(msg(t, "52:54:00:12:01:02", dhcpv4.MessageTypeDiscover, dhcpv4.OptRequestedIPAddress(x)), anySrc, bcastDst)
	if o2 == nil || o2.YourIPAddr.Equal(x) {
		t.Fatalf("second server offered the bound address %v again: %v", x, o2)
	}
	// ...NAKs one asking for it (INIT-REBOOT)...
	if nak, _, _ := b.Handle(msg(t, "52:54:00:12:01:02", dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(x)), anySrc, bcastDst); nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("second server: %v, want NAK", nak)
	}
	// ...and renews the holder's binding (REBINDING: broadcast, ciaddr).
	rebind := msg(t, mac, dhcpv4.MessageTypeRequest)
	rebind.ClientIPAddr = x
	ack, _, err := b.Handle(rebind, netip.AddrPortFrom(netip.MustParseAddr(x.String()), 68), bcastDst)
	if err != nil || ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || !ack.YourIPAddr.Equal(x) {
		t.Fatalf("rebinding through the second server: %v %v", ack, err)
	}
}

// RFC 3074: with three members, a DISCOVER of a client that has not waited
// gets exactly one OFFER (from the owner of its hash bucket), the clients
// spread over the three, and each owner offers from its own share of the
// pool while it lasts; once the client's secs reach BalanceWait every member answers.
func TestLoadBalancing(t *testing.T) {
	ss, _ := cluster(t, 3)
	per := make([]int, 3)
	for i := range 240 {
		d := msg(t, hw(i), dhcpv4.MessageTypeDiscover)
		answered := -1
		for k, s := range ss {
			r, _, err := s.Handle(d, anySrc, bcastDst)
			if err != nil {
				t.Fatal(err)
			}
			if r == nil {
				continue
			}
			if answered >= 0 {
				t.Fatalf("%s: OFFERs from n%d and n%d", hw(i), answered, k)
			}
			answered = k
			ip := netip.MustParseAddr(r.YourIPAddr.String())
			// Each member's share is a third of the 100-address pool: the
			// first 60 clients cannot exhaust one.
			if sn := &s.cfg.Subnets[0]; i < 60 && !(share{k: k, n: 3}).has(sn, ip) {
				t.Errorf("n%d offered %v, outside its share", k, ip)
			}
		}
		mac, _ := net.ParseMAC(hw(i))
		if want := Owner(mac, 3); answered != want {
			t.Fatalf("%s answered by n%d, owner is n%d", hw(i), answered, want)
		}
		per[answered]++
	}
	for k, n := range per {
		if n < 50 {
			t.Errorf("n%d answered %d of 240 clients: %v", k, n, per)
		}
	}
	waited := msg(t, hw(999), dhcpv4.MessageTypeDiscover)
	waited.NumSeconds = uint16(DefaultBalanceWait / time.Second)
	for k, s := range ss {
		if r, _, _ := s.Handle(waited, anySrc, bcastDst); r == nil {
			t.Errorf("n%d silent to a client that waited %ds", k, waited.NumSeconds)
		}
	}
	t.Logf("clients per member: %v", per)
}

// The RFC 3074 §6 hash spreads chaddrs over the 256 buckets.
func TestLoadbHash(t *testing.T) {
	seen := map[byte]int{}
	for i := range 4096 {
		mac, _ := net.ParseMAC(hw(i))
		seen[loadbHash(mac)]++
	}
	if len(seen) < 250 {
		t.Fatalf("4096 MACs hit only %d of 256 buckets", len(seen))
	}
	if h := loadbHash(nil); h != 0 {
		t.Fatalf("empty key hashes to %d, want its length, 0", h)
	}
	// By hand from the RFC's table: len 1 → T[1^0x02] = T[3] = 215.
	if h := loadbHash([]byte{0x02}); h != 215 {
		t.Fatalf("hash of 02 = %d, want 215", h)
	}
}

// A server that cannot commit (minority side) gives no new address and
// answers a renewal only with the time left on the committed binding,
// never more; it commits nothing.
func TestMinorityRenewsOnlyTimeLeft(t *testing.T) {
	s, b := newTestServer(t, func(c *Config) { c.Subnets[0].LeaseTime = 10 * time.Minute })
	mac := "52:54:00:12:02:01"
	offer, _, _ := s.Handle(msg(t, mac, dhcpv4.MessageTypeDiscover), anySrc, bcastDst)
	x := offer.YourIPAddr
	req := msg(t, mac, dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(x), dhcpv4.OptServerIdentifier(testServerIP.AsSlice()))
	if ack, _, _ := s.Handle(req, anySrc, bcastDst); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("ack: %v", ack)
	}
	b.set("", nil, true)
	saves := b.saves
	if r, _, _ := s.Handle(msg(t, "52:54:00:12:02:02", dhcpv4.MessageTypeDiscover), anySrc, bcastDst); r != nil {
		t.Fatalf("minority offered a new address: %v", r)
	}
	if r, _, _ := s.Handle(msg(t, "52:54:00:12:02:02", dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(net.IPv4(10, 71, 0, 150))), anySrc, bcastDst); r != nil {
		t.Fatalf("minority answered a REQUEST for an unbound address: %v", r)
	}
	time.Sleep(1100 * time.Millisecond)
	renew := msg(t, mac, dhcpv4.MessageTypeRequest)
	renew.ClientIPAddr = x
	renew.SetUnicast()
	ack, _, err := s.Handle(renew, netip.AddrPortFrom(netip.MustParseAddr(x.String()), 68), netip.AddrPortFrom(testServerIP, 67))
	if err != nil || ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("minority renewal: %v %v", ack, err)
	}
	lt := ack.IPAddressLeaseTime(0)
	if lt >= 10*time.Minute || lt < 9*time.Minute {
		t.Fatalf("minority granted %v, want the time left (< 10m, > 9m)", lt)
	}
	if t1, t2 := ack.IPAddressRenewalTime(0), ack.IPAddressRebindingTime(0); t1 > lt/2 || t2 > lt*7/8 || t1 == 0 {
		t.Fatalf("T1 %v T2 %v for lease %v", t1, t2, lt)
	}
	if b.saves != saves {
		t.Fatalf("minority committed %d batches", b.saves-saves)
	}
	// Majority again: a full lease, committed.
	b.set("", nil, false)
	ack, _, _ = s.Handle(renew, netip.AddrPortFrom(netip.MustParseAddr(x.String()), 68), netip.AddrPortFrom(testServerIP, 67))
	if ack == nil || ack.IPAddressLeaseTime(0) != 10*time.Minute || b.saves != saves+1 {
		t.Fatalf("majority renewal: %v after %d saves", ack, b.saves-saves)
	}
}

// On the minority side a SELECTING or INIT-REBOOT REQUEST gets no answer,
// even for an address the node's view shows as the client's committed
// binding: neither is a claim that the client still holds it. The client
// may have released it a moment ago on another node, and another client
// been given it there, with neither change in this node's view yet — the
// time left on the stale binding would then be a second holder (found by
// deploy/lab/leasecheck: a client that released its address, was offered
// it again by a node that then lost its quorum, and got a SELECTING ACK
// for "the time left" while the log had given the address to another
// client). A renewal (ciaddr set) still gets the time left.
func TestMinorityAnswersOnlyRenewals(t *testing.T) {
	s, b := newTestServer(t, func(c *Config) { c.Subnets[0].LeaseTime = 10 * time.Minute })
	mac := "52:54:00:12:02:11"
	offer, _, _ := s.Handle(msg(t, mac, dhcpv4.MessageTypeDiscover), anySrc, bcastDst)
	x := offer.YourIPAddr
	selecting := msg(t, mac, dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(x), dhcpv4.OptServerIdentifier(testServerIP.AsSlice()))
	if ack, _, _ := s.Handle(selecting, anySrc, bcastDst); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("ack: %v", ack)
	}
	time.Sleep(1100 * time.Millisecond) // so that the time left is below the lease
	b.set("", nil, true)
	saves := b.saves
	if r, _, err := s.Handle(selecting, anySrc, bcastDst); r != nil {
		t.Fatalf("minority answered a SELECTING REQUEST: %v (%v)", r, err)
	}
	reboot := msg(t, mac, dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(x))
	if r, _, err := s.Handle(reboot, anySrc, bcastDst); r != nil {
		t.Fatalf("minority answered an INIT-REBOOT REQUEST: %v (%v)", r, err)
	}
	rebind := msg(t, mac, dhcpv4.MessageTypeRequest)
	rebind.ClientIPAddr = x
	ack, _, err := s.Handle(rebind, anySrc, bcastDst)
	if err != nil || ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || ack.IPAddressLeaseTime(0) >= 10*time.Minute {
		t.Fatalf("minority rebinding: %v %v, want an ACK for the time left", ack, err)
	}
	if b.saves != saves {
		t.Fatalf("minority committed %d batches", b.saves-saves)
	}
	// With a quorum again, SELECTING and INIT-REBOOT are answered (and committed).
	b.set("", nil, false)
	for _, r := range []*dhcpv4.DHCPv4{selecting, reboot} {
		if ack, _, _ := s.Handle(r, anySrc, bcastDst); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || ack.IPAddressLeaseTime(0) != 10*time.Minute {
			t.Fatalf("majority: %v", ack)
		}
	}
}
