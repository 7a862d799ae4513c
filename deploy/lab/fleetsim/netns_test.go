package fleetsim

import (
	"net/netip"
	"testing"
)

// Every machine's BMC address is a distinct host of bmcRoute (machines past
// 2032 once fell outside it: "no route to host" and never inspected).
func TestBMCAddrsInRoute(t *testing.T) {
	route := netip.MustParsePrefix(bmcRoute)
	seen := map[netip.Addr]bool{}
	for i := 0; i < MaxMachines; i++ {
		a := bmcAddr(i)
		if !route.Contains(a) || a == route.Addr() || a == netip.MustParseAddr("10.97.15.255") || seen[a] {
			t.Fatalf("machine %d: BMC address %s outside %s, not a host, or taken twice", i, a, route)
		}
		seen[a] = true
	}
}
