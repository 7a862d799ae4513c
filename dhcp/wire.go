package dhcp

import (
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

var magicCookie = [4]byte{99, 130, 83, 99}

// encode serialises a reply (RFC 2131 §2, RFC 2132). Unlike dhcpv4.ToBytes it
// rejects (ErrFieldTooLong) a sname longer than maxSname or a file longer
// than maxFile instead of truncating; both fields are NUL-padded. Options are
// written in code order with option 82 last (RFC 3046 §2.1), values over 255
// bytes split (RFC 3396), and a Pad byte between option 67 and End so no
// option 67 is directly followed by End (a known PXE ROM parsing bug). The
// packet is padded to the 300-byte BOOTP minimum.
func encode(d *dhcpv4.DHCPv4, maxFile, maxSname int) ([]byte, error) {
	if len(d.BootFileName) > maxFile {
		return nil, fmt.Errorf("%w: file %d bytes > %d", ErrFieldTooLong, len(d.BootFileName), maxFile)
	}
	if len(d.ServerHostName) > maxSname {
		return nil, fmt.Errorf("%w: sname %d bytes > %d", ErrFieldTooLong, len(d.ServerHostName), maxSname)
	}
	if len(d.ClientHWAddr) > 16 {
		return nil, fmt.Errorf("%w: chaddr %d bytes", ErrMalformed, len(d.ClientHWAddr))
	}
	b := make([]byte, 240, 576)
	b[0] = byte(d.OpCode)
	b[1] = byte(d.HWType)
	b[2] = byte(len(d.ClientHWAddr))
	b[3] = d.HopCount
	copy(b[4:8], d.TransactionID[:])
	binary.BigEndian.PutUint16(b[8:], d.NumSeconds)
	binary.BigEndian.PutUint16(b[10:], d.Flags)
	copy(b[12:16], d.ClientIPAddr.To4())
	copy(b[16:20], d.YourIPAddr.To4())
	copy(b[20:24], d.ServerIPAddr.To4())
	copy(b[24:28], d.GatewayIPAddr.To4())
	copy(b[28:44], d.ClientHWAddr)
	copy(b[44:108], d.ServerHostName)
	copy(b[108:236], d.BootFileName)
	copy(b[236:240], magicCookie[:])

	codes := make([]int, 0, len(d.Options))
	for c := range d.Options {
		if c != 0 && c != 255 && c != optRelayAgentInfo {
			codes = append(codes, int(c))
		}
	}
	sort.Ints(codes)
	if _, ok := d.Options[optRelayAgentInfo]; ok {
		codes = append(codes, optRelayAgentInfo)
	}
	last := -1
	for _, c := range codes {
		v := d.Options[uint8(c)]
		if len(v) == 0 {
			b = append(b, byte(c), 0)
		}
		for len(v) > 0 {
			n := min(len(v), 255)
			b = append(b, byte(c), byte(n))
			b = append(b, v[:n]...)
			v = v[n:]
		}
		last = c
	}
	if last == 67 {
		b = append(b, 0) // Pad: never End right after option 67
	}
	b = append(b, 255)
	for len(b) < 300 {
		b = append(b, 0)
	}
	return b, nil
}
