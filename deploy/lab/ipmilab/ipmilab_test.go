package ipmilab

import (
	"context"
	"errors"
	"testing"
)

// The running BMC is tested through bmc's TestIPMIEndToEndQEMU (root, netns
// kbm-*); this checks Start refuses incomplete options before touching anything.
func TestStartNeedsOptions(t *testing.T) {
	full := Options{NetNS: "ns", Addr: "10.0.0.1", User: "u", StateDir: t.TempDir(), LabDir: "lab", QEMUArgs: []string{"/bin/true"}}
	for name, o := range map[string]Options{
		"no netns": func() Options { o := full; o.NetNS = ""; return o }(),
		"no addr":  func() Options { o := full; o.Addr = ""; return o }(),
		"no user":  func() Options { o := full; o.User = ""; return o }(),
		"no state": func() Options { o := full; o.StateDir = ""; return o }(),
		"no lab":   func() Options { o := full; o.LabDir = ""; return o }(),
		"no qemu":  func() Options { o := full; o.QEMUArgs = nil; return o }(),
	} {
		if b, err := Start(context.Background(), o); !errors.Is(err, ErrOptions) || b != nil {
			t.Errorf("%s: Start = %v, %v; want ErrOptions", name, b, err)
		}
	}
}
