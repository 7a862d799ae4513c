package api_test

import (
	"fmt"
	"strings"
	"testing"

	. "kiln/api"
	"kiln/deploy/lab/testkit"
	"kiln/store"
)

// TestMachineMACRule: POST /v1/machines applies the store's one MAC rule
// (store.ParseMachineMAC) to NIC and BMC MACs: a group, broadcast or zero
// address is a 400 naming the field, a unicast one is stored lower-case.
func TestMachineMACRule(t *testing.T) {
	h := newHarness(t)
	for i, c := range testkit.MACCases {
		up := strings.ToUpper(c.MAC)
		for _, tc := range []struct{ field, body string }{
			{"intended.nics[0].mac", fmt.Sprintf(`{"name":"n%d","intended":{"nics":[{"mac":%q}]}}`, i, up)},
			{"intended.bmc_mac", fmt.Sprintf(`{"name":"b%d","intended":{"serial":"S%d","bmc_mac":%q}}`, i, i, up)},
		} {
			r := h.do("POST", "/v1/machines", adminTok, tc.body)
			if !c.Unicast {
				h.want(r, 400, CodeInvalid)
				if d := r.err(); d.Field != tc.field || !strings.Contains(d.Message, "no NIC has") {
					t.Errorf("%s (%s) in %s: %+v", c.MAC, c.Why, tc.field, d)
				}
				continue
			}
			h.want(r, 201, "")
			var m store.Machine
			r.into(t, &m)
			if got := m.Intended.BMCMAC; tc.field == "intended.bmc_mac" && got != c.MAC {
				t.Errorf("bmc_mac stored as %q, want %q", got, c.MAC)
			}
			if tc.field != "intended.bmc_mac" && m.Intended.NICs[0].MAC != c.MAC {
				t.Errorf("mac stored as %q, want %q", m.Intended.NICs[0].MAC, c.MAC)
			}
		}
	}
}
