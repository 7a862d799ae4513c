package testkit

// MACCase is one MAC address and whether it is a NIC's address under
// store.ParseMachineMAC (EUI-48, I/G bit clear, not all zeros).
type MACCase struct {
	MAC     string
	Unicast bool
	Why     string
}

// MACCases is the table every MAC check of Kiln is compared against:
// store.ParseMachineMAC (import, API: store's TestParseMachineMAC, api's
// TestMachineMACRule) and the protocol layers' own copies of the rule (dhcp
// and httpboot import nothing of Kiln's, their tests included:
// TestMACRuleAgreesWithStore in each). Each of them is asserted to give
// every case's answer, so they agree with each other on every case here.
// The table lives here, not in store/storetest, because the protocol
// packages' tests may import the lab's packages but not the store.
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
