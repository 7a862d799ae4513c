package httpboot

import (
	"net"
	"testing"

	"kiln/store"
	"kiln/store/storetest"
)

// TestMACRuleAgreesWithStore: the boot HTTP server refuses an /ipxe/{mac}
// whose MAC store.ParseMachineMAC would refuse for a machine, and answers
// one it would accept (the protocol layer keeps its own copy of the rule:
// httpboot imports nothing of Kiln's).
func TestMACRuleAgreesWithStore(t *testing.T) {
	for _, c := range storetest.MACCases {
		hw, err := net.ParseMAC(c.MAC)
		if err != nil {
			t.Fatal(err)
		}
		_, serr := store.ParseMachineMAC(c.MAC)
		if got := unicastMAC(hw); got != c.Unicast || got != (serr == nil) {
			t.Errorf("%s (%s): httpboot unicastMAC %v, store.ParseMachineMAC err %v, want unicast %v", c.MAC, c.Why, got, serr, c.Unicast)
		}
	}
}
