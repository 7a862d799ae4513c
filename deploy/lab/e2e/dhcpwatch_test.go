package e2e

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// ackFrame is an Ethernet/IPv4/UDP frame from port 67 carrying m.
func ackFrame(t testing.TB, m *dhcpv4.DHCPv4) []byte {
	p := m.ToBytes()
	f := make([]byte, 14+20+8+len(p))
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0], ip[9] = 0x45, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(p)))
	udp := ip[20:]
	binary.BigEndian.PutUint16(udp[0:], 67)
	binary.BigEndian.PutUint16(udp[2:], 68)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(p)))
	copy(udp[8:], p)
	return f
}

func reply(t testing.TB, typ dhcpv4.MessageType, mac, ip string) *dhcpv4.DHCPv4 {
	hw, _ := net.ParseMAC(mac)
	m, err := dhcpv4.New(dhcpv4.WithReply(&dhcpv4.DHCPv4{OpCode: dhcpv4.OpcodeBootRequest, ClientHWAddr: hw}),
		dhcpv4.WithMessageType(typ), dhcpv4.WithYourIP(net.ParseIP(ip)),
		dhcpv4.WithServerIP(net.ParseIP("10.99.0.2")), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.ParseIP("10.99.0.2"))),
		dhcpv4.WithOption(dhcpv4.OptIPAddressLeaseTime(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestDHCPWatchFrame: the capture's parser keeps ACKs (address, client,
// server, lease time), counts NAKs and ignores everything else.
func TestDHCPWatchFrame(t *testing.T) {
	w := &dhcpWatch{}
	now := time.Now()
	w.frame(ackFrame(t, reply(t, dhcpv4.MessageTypeAck, "52:54:00:99:02:01", "10.99.0.150")), now)
	w.frame(ackFrame(t, reply(t, dhcpv4.MessageTypeOffer, "52:54:00:99:02:02", "10.99.0.151")), now)
	w.frame(ackFrame(t, reply(t, dhcpv4.MessageTypeNak, "52:54:00:99:02:03", "0.0.0.0")), now)
	short := ackFrame(t, reply(t, dhcpv4.MessageTypeAck, "52:54:00:99:02:04", "10.99.0.152"))
	w.frame(short[:60], now)
	acks, naks := w.ACKs()
	if len(acks) != 1 || naks != 1 {
		t.Fatalf("acks %+v, naks %d; want 1 and 1", acks, naks)
	}
	if a := acks[0]; a.MAC != "52:54:00:99:02:01" || a.IP != "10.99.0.150" || a.Server != "10.99.0.2" || a.Lease != time.Hour {
		t.Fatalf("ack %+v", a)
	}
}

// TestACKOverlaps: one address ACKed to two clients inside one lease is a
// duplicate; the same client again, or another client after the lease ran
// out, is not.
func TestACKOverlaps(t *testing.T) {
	t0 := time.Now()
	acks := []ACK{
		{At: t0, MAC: "a", IP: "10.0.0.1", Lease: time.Minute},
		{At: t0.Add(10 * time.Second), MAC: "a", IP: "10.0.0.1", Lease: time.Minute},
		{At: t0.Add(2 * time.Minute), MAC: "b", IP: "10.0.0.1", Lease: time.Minute}, // after both ran out
		{At: t0, MAC: "c", IP: "10.0.0.2", Lease: time.Minute},
		{At: t0.Add(30 * time.Second), MAC: "d", IP: "10.0.0.2", Lease: time.Minute}, // inside c's lease
	}
	if d := ackOverlaps(acks); len(d) != 1 || d[0] != "10.0.0.2" {
		t.Fatalf("overlaps %v, want [10.0.0.2]", d)
	}
}

// FuzzDHCPWatchFrame: no frame makes the capture's parser panic.
func FuzzDHCPWatchFrame(f *testing.F) {
	f.Add(ackFrame(f, reply(f, dhcpv4.MessageTypeAck, "52:54:00:99:02:01", "10.99.0.150")))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		(&dhcpWatch{}).frame(b, time.Now())
	})
}

// TestUEFITriedDisk: the serial console of an OVMF VM after the
// exit-to-disk script, as seen in the HA lab before the fix (two PXE
// options, then an iPXE shell) and after it (the disk's option).
func TestUEFITriedDisk(t *testing.T) {
	pxe := `BdsDxe: loading Boot0003 "UEFI PXEv4 (MAC:525400990202) 2" from PciRoot(0x0)/Pci(0x1,0x0)/MAC(525400990202,0x1)/IPv4(0.0.0.0)` + "\r\n"
	disk := `BdsDxe: loading Boot0004 "UEFI Misc Device" from PciRoot(0x0)/Pci(0x3,0x0)` + "\r\n"
	script := "Kiln: booting from local disk\r\n"
	for _, c := range []struct {
		name, serial string
		want         bool
	}{
		{"no script yet", disk, false},
		{"disk after the script", script + pxe + disk, true},
		{"disk only before the last script", disk + script + pxe, false},
		{"an iPXE shell after the script", script + disk + "iPXE> ", false},
		{"network only", script + pxe, false},
		{"the boot manager menu", script + pxe + `BdsDxe: loading Boot0000 "UiApp" from Fv(7CB8BDC9-F8EB-4F34-AAEA-3EE4AF6516A1)/FvFile(462CAA21-7614-4503-836E-8AB6F4662331)` + "\r\n", false},
	} {
		if got := uefiTriedDisk([]byte(c.serial)); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// The HA run's weaker check: back in the firmware, even when its next
	// option is a network boot without an offer (seen in CI during the
	// partition).
	noOffer := script + "Could not boot image: Error 0x00000001\r\n" +
		`BdsDxe: failed to load Boot0002 "UEFI PXEv4 (MAC:525400990204)" from PciRoot(0x0)/Pci(0x1,0x0)/MAC(525400990204,0x1): Not Found` + "\r\n>>Start PXE over IPv4.\r\n  PXE-E16: No valid offer received.\r\n"
	for _, c := range []struct {
		name, serial string
		want         bool
	}{
		{"a network option without an offer", noOffer, true},
		{"the disk", script + pxe + disk, true},
		{"an iPXE shell", script + pxe + "iPXE> ", false},
		{"nothing after the script yet", script, false},
	} {
		if got := uefiReturnedToFirmware([]byte(c.serial)); got != c.want {
			t.Errorf("returned to firmware, %s: %v, want %v", c.name, got, c.want)
		}
	}
}
