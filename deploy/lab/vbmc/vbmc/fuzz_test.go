package vbmc

import (
	"testing"
	"time"
)

func FuzzParseBootPatch(f *testing.F) {
	for _, s := range []string{`{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once","BootSourceOverrideMode":"UEFI"}}`,
		`{"Boot":{"BootSourceOverrideTarget":"Floppy"}}`, `{"Boot":{}}`, `{"Boot":1}`, `{"Other":1}`, `{} {}`, `[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		bp, err := ParseBootPatch(b)
		if err != nil {
			return
		}
		if len(bp.Keys) == 0 || len(bp.Keys) != len(bp.Values) {
			t.Fatalf("accepted %q as %+v", b, bp)
		}
		for k, v := range bp.Values {
			ok := false
			for _, a := range bootAllowed[k] {
				ok = ok || a == v
			}
			if !ok {
				t.Fatalf("accepted %s=%q", k, v)
			}
		}
	})
}

func FuzzParseQMPLine(f *testing.F) {
	for _, s := range []string{`{"QMP":{"version":{}}}`, `{"return":{}}`, `{"error":{"class":"GenericError","desc":"x"}}`,
		`{"event":"RESET","timestamp":{}}`, `{"return":{},"event":"X"}`, `{}`, `x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseQMPLine(b)
		if err == nil {
			n := 0
			for _, present := range []bool{m.QMP != nil, m.Return != nil, m.Error != nil, m.Event != ""} {
				if present {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("accepted %q with %d kinds", b, n)
			}
		}
	})
}

func TestParseQuirk(t *testing.T) {
	var q Quirks
	for _, s := range []string{"ignore-override", "reject-mode", "half-apply-400", "error-off-when-off", "slow=1.5s"} {
		if err := ParseQuirk(s, &q); err != nil {
			t.Fatal(s, err)
		}
	}
	if !q.IgnoreOverride || !q.RejectMode || !q.HalfApply400 || !q.ErrorOffWhenOff || q.Slow != 1500*time.Millisecond {
		t.Fatalf("%+v", q)
	}
	for _, s := range []string{"", "slow", "slow=-1s", "slow=abc", "explode"} {
		if err := ParseQuirk(s, &q); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}
