package storetest

// MACCase is one MAC address and whether it is a NIC's address under
// store.ParseMachineMAC (EUI-48, I/G bit clear, not all zeros).
type MACCase struct {
	MAC     string
	Unicast bool
	Why     string
}

// MACCases is the table every MAC check of Kiln is compared against:
// store.ParseMachineMAC (import, API) and the protocol layers' own tests
// (dhcp, httpboot), which import nothing of Kiln's and so keep a copy of the
// rule; their tests assert both agree on every case here.
var MACCases = []MACCase{
	{"52:54:00:12:34:56", true, "QEMU OUI, unicast"},
	{"00:1b:21:aa:bb:cc", true, "Intel OUI, unicast"},
	{"02:00:00:00:00:01", true, "locally administered unicast"},
	{"fe:ff:ff:ff:ff:ff", true, "locally administered, I/G bit clear"},
	{"00:00:00:00:00:01", true, "not all zeros"},
	{"00:00:00:00:00:00", false, "all zeros"},
	{"ff:ff:ff:ff:ff:ff", false, "broadcast"},
	{"01:00:5e:00:00:fb", false, "IPv4 multicast (RFC 1112)"},
	{"33:33:00:00:00:01", false, "IPv6 multicast (RFC 2464)"},
	{"01:80:c2:00:00:00", false, "IEEE 802.1D bridge group"},
	{"03:00:00:00:00:01", false, "locally administered group"},
	{"09:00:2b:00:00:04", false, "group bit set in an OUI block"},
}
