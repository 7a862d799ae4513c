package api_test

import (
	"testing"

	. "kiln/api"
	"kiln/store"
)

// The firmware routes over the real domain: a baseline is set (admin only)
// (resource_version 0 sets it) and listed; invalid baselines are 400; a
// machine's firmware read (operator) and apply without a BMC are refused.
// The BMC path itself: appliance/lifecycle TestBaselineReadDriftApply.
func TestFirmwareRoutes(t *testing.T) {
	h := newHarness(t)
	b := Baseline{Vendor: "Acme", Model: "R1", Firmware: []BaselineFirmware{{Component: "BIOS", Version: "2.1.0", ImageURI: "http://10.0.0.1:8080/images/bios.fw"}},
		BIOS: map[string]string{"ProcVirtualization": "Disabled"}}
	h.want(h.do("PUT", "/v1/baselines", operatorTok, b), 403, CodeForbidden)
	r := h.do("PUT", "/v1/baselines", adminTok, b)
	h.want(r, 200, "")
	var got Baseline
	r.into(t, &got)
	if got.ID != store.BaselineID("acme", "r1") || got.ResourceVersion == 0 || got.BIOS["ProcVirtualization"] != "Disabled" {
		t.Fatalf("put baseline %+v", got)
	}
	h.want(h.do("PUT", "/v1/baselines", adminTok, Baseline{Vendor: "Acme"}), 400, CodeInvalid)
	h.want(h.do("PUT", "/v1/baselines", adminTok, Baseline{Vendor: "Acme", Model: "R2",
		Firmware: []BaselineFirmware{{Component: "BIOS", Version: "1", ImageURI: "ftp://x"}}}), 400, CodeInvalid)
	var list BaselineList
	r = h.do("GET", "/v1/baselines", viewerTok, nil)
	h.want(r, 200, "")
	r.into(t, &list)
	if len(list.Items) != 1 || list.Items[0].Model != "R1" {
		t.Fatalf("list %+v", list)
	}
	m := h.machine("fw-1", "52:54:00:aa:17:01", store.StateAvailable, nil)
	h.want(h.do("POST", "/v1/machines/"+m.ID+"/firmware/read", viewerTok, nil), 403, CodeForbidden)
	h.want(h.do("POST", "/v1/machines/"+m.ID+"/firmware/read", operatorTok, nil), 400, CodeInvalid) // no BMC enrolled
	if r := h.do("POST", "/v1/machines/"+m.ID+"/firmware/apply", operatorTok, nil); r.code < 400 {
		t.Fatalf("apply without a BMC answered %d %s", r.code, r.body)
	}
}
