package dhcp

import (
	"net"
	"testing"

	"kiln/deploy/lab/testkit"
)

// TestMACRuleAgreesWithStore: the DHCP server drops a request whose chaddr
// store.ParseMachineMAC would refuse for a machine, and serves one it would
// accept (the protocol layer keeps its own copy of the rule: dhcp imports
// nothing of Kiln's, its tests included). Both copies are checked against
// the one table, testkit.MACCases: this test for dhcp's, store's
// TestParseMachineMAC for store.ParseMachineMAC.
func TestMACRuleAgreesWithStore(t *testing.T) {
	for _, c := range testkit.MACCases {
		hw, err := net.ParseMAC(c.MAC)
		if err != nil {
			t.Fatal(err)
		}
		if got := unicastMAC(hw); got != c.Unicast {
			t.Errorf("%s (%s): dhcp unicastMAC %v, want unicast %v (store.ParseMachineMAC's answer, store's TestParseMachineMAC)", c.MAC, c.Why, got, c.Unicast)
		}
	}
}
