package dhcp

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// BenchmarkProcessDORA measures the CPU cost of parse + chain + encode for a
// DISCOVER and a REQUEST (no sockets, no persistence).
func BenchmarkProcessDORA(b *testing.B) {
	s, _ := newTestServer(b, func(c *Config) {
		c.Subnets[0].PoolEnd = c.Subnets[0].PoolStart.Next().Next().Next().Next()
	})
	d := msg(b, "52:54:00:00:00:01", dhcpv4.MessageTypeDiscover, arch(7), vendor("PXEClient:Arch:00007:UNDI:003016"))
	raw := d.ToBytes()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		binary.BigEndian.PutUint32(raw[30:], uint32(i%4)) // 4 MACs: pool never runs dry
		req, err := dhcpv4.FromBytes(raw)
		if err != nil {
			b.Fatal(err)
		}
		x := s.process(req, anySrc, bcastDst, time.Now())
		if x.resp == nil {
			b.Fatal("no reply", x.drop, x.err)
		}
		if _, err := encode(x.resp, MaxFileLen, MaxSnameLen); err != nil {
			b.Fatal(err)
		}
	}
}
