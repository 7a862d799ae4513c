package dhcp

import (
	"net/netip"
	"path/filepath"
	"slices"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// FuzzHandle feeds arbitrary bytes through the parser and the handler chains
// of both modes (authoritative also as one member of three and on the
// minority side): no panic, and every reply encodes and parses back with the
// same message type, transaction ID and chaddr.
func FuzzHandle(f *testing.F) {
	for _, name := range []string{"seabios-ipxe-rom.pcap", "ovmf-ipxe-efi-rom.pcap", "ovmf-uefi-http-boot.pcap"} {
		for _, p := range pcapPayloads(f, filepath.Join("testdata", name)) {
			f.Add(p)
		}
	}
	for _, m := range []*dhcpv4.DHCPv4{
		msg(f, "52:54:00:00:09:01", dhcpv4.MessageTypeDiscover, arch(0), vendor("PXEClient"), generic(82, []byte{1, 1, 1})),
		msg(f, "52:54:00:00:09:01", dhcpv4.MessageTypeRequest, dhcpv4.OptRequestedIPAddress(netip.MustParseAddr("10.71.0.100").AsSlice())),
		msg(f, "52:54:00:00:09:01", dhcpv4.MessageTypeDecline, generic(77, []byte{4, 'i', 'P', 'X', 'E', 3})),
		msg(f, "52:54:00:00:09:01", dhcpv4.MessageTypeInform, generic(175, nil)),
	} {
		f.Add(m.ToBytes())
	}
	auth, _ := newTestServer(f, nil)
	proxy, _ := newTestServer(f, func(c *Config) { c.Mode = ModeProxy })
	// A member of three (RFC 3074 balancing), and one on the minority side.
	member, mb := newTestServer(f, nil)
	mb.set("n1", []string{"n0", "n1", "n2"}, false)
	minority, nb := newTestServer(f, nil)
	nb.set("n0", []string{"n0", "n1", "n2"}, true)
	dsts := []netip.AddrPort{bcastDst, netip.AddrPortFrom(testServerIP, 67), netip.AddrPortFrom(testServerIP, 4011)}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := dhcpv4.FromBytes(data)
		if err != nil {
			return
		}
		for _, s := range []*Server{auth, proxy, member, minority} {
			for _, dst := range dsts {
				resp, _, err := s.Handle(req, anySrc, dst)
				if err != nil || resp == nil {
					continue
				}
				b, err := encode(resp, s.cfg.MaxFileLen, s.cfg.MaxSnameLen)
				if err != nil {
					t.Fatalf("Handle returned an unencodable reply: %v", err)
				}
				p, err := dhcpv4.FromBytes(b)
				if err != nil {
					t.Fatalf("reply does not parse: %v\n%s", err, resp.Summary())
				}
				if p.MessageType() != resp.MessageType() || p.TransactionID != req.TransactionID || p.ClientHWAddr.String() != req.ClientHWAddr.String() {
					t.Fatalf("reply changed in round trip: %s", p.Summary())
				}
			}
		}
	})
}

// FuzzUserClass: isIPXEUserClass agrees with a second form of option 77,
// the insomniacslk/dhcp library's RFC 3004 decoding (dhcpv4.Strings): true
// exactly when the option is the raw string "iPXE" (what iPXE sends) or a
// well-formed RFC 3004 list (§2: instances of length ≥ 1 filling the option)
// with an instance "iPXE". And a list the library encodes from the fuzzed
// instances is recognised exactly when one of them is "iPXE".
func FuzzUserClass(f *testing.F) {
	f.Add([]byte("iPXE"))
	f.Add([]byte{4, 'i', 'P', 'X', 'E'})
	f.Add([]byte{2, 'a', 'b', 4, 'i', 'P', 'X', 'E'})
	f.Add([]byte{4, 'i', 'P', 'X', 'E', 0})
	f.Add([]byte{4, 'i', 'P', 'X', 'E', 9, 'x'})
	f.Add([]byte{255})
	f.Fuzz(func(t *testing.T, b []byte) {
		var list dhcpv4.Strings
		want := string(b) == "iPXE" || (list.FromBytes(b) == nil && slices.Contains(list, "iPXE"))
		if got := isIPXEUserClass(b); got != want {
			t.Fatalf("option 77 % x: isIPXEUserClass %v, RFC 3004 decoding says %v (instances %q)", b, got, want, list)
		}
		// Constructive form: the fuzzed bytes cut into instances of 1..255 bytes.
		var inst dhcpv4.Strings
		for rest := b; len(rest) > 0; {
			n := 1 + int(rest[0])%min(len(rest), 255)
			if n > len(rest) {
				n = len(rest)
			}
			inst = append(inst, string(rest[:n]))
			rest = rest[n:]
		}
		if len(inst) == 0 {
			return
		}
		enc := inst.ToBytes()
		want = string(enc) == "iPXE" || slices.Contains(inst, "iPXE")
		if got := isIPXEUserClass(enc); got != want {
			t.Fatalf("RFC 3004 list %q (% x): isIPXEUserClass %v, want %v", inst, enc, got, want)
		}
	})
}
