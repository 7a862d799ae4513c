package httpboot

import (
	"net"
	"testing"

	"kiln/deploy/lab/testkit"
)

// TestMACRuleAgreesWithStore: the boot HTTP server refuses an /ipxe/{mac}
// whose MAC store.ParseMachineMAC would refuse for a machine, and answers
// one it would accept (the protocol layer keeps its own copy of the rule:
// httpboot imports nothing of Kiln's, its tests included). Both copies are
// checked against the one table, testkit.MACCases: this test for
// httpboot's, store's TestParseMachineMAC for store.ParseMachineMAC.
func TestMACRuleAgreesWithStore(t *testing.T) {
	for _, c := range testkit.MACCases {
		hw, err := net.ParseMAC(c.MAC)
		if err != nil {
			t.Fatal(err)
		}
		if got := unicastMAC(hw); got != c.Unicast {
			t.Errorf("%s (%s): httpboot unicastMAC %v, want unicast %v (store.ParseMachineMAC's answer, store's TestParseMachineMAC)", c.MAC, c.Why, got, c.Unicast)
		}
	}
}
