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

// FuzzParseHealthUpdate: the health knob's body is accepted only with values from the
// enums, and then applies to a server without error.
func FuzzParseHealthUpdate(f *testing.F) {
	for _, s := range []string{`{"system":"Critical","chassis":"OK","event":"CPU1 IERR"}`, `{"system":"null"}`,
		`{"event":"x","severity":"Warning","clear_log":true}`, `{"system":"Bad"}`, `{}`, `{"x":1}`, `[`, `{"severity":"OK"}`} {
		f.Add([]byte(s))
	}
	srv, err := New(Config{Listen: "127.0.0.1:0", Username: "u", Password: "p", QEMUArgs: []string{"/bin/false"}, StateDir: f.TempDir()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = srv.ln.Close() })
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := ParseHealthUpdate(b)
		if err != nil {
			return
		}
		for _, v := range []string{u.System, u.Chassis} {
			if v != "" && !healthAllowed[v] {
				t.Fatalf("accepted health %q", v)
			}
		}
		if err := srv.SetHealth("1", u); err != nil {
			t.Fatalf("accepted %q but SetHealth: %v", b, err)
		}
		h, _ := srv.Health("1")
		if (u.System != "" && h.System != u.System) || (u.Chassis != "" && h.Chassis != u.Chassis) {
			t.Fatalf("%q applied as %+v", b, h)
		}
	})
}

// FuzzParseBIOSPatch: an accepted Bios/Settings PATCH names only registry
// attributes with values in their enumeration or integer range; a
// firmware image header is accepted only for a known component and a
// well-formed version, and FirmwareImage of that header parses back to it.
func FuzzParseBIOSPatch(f *testing.F) {
	for _, s := range []string{`{"Attributes":{"ProcVirtualization":"Disabled","PowerOnDelaySeconds":30}}`,
		`{"Attributes":{"PowerOnDelaySeconds":"5"}}`, `{"Attributes":{}}`, `{"Attributes":{"X":1}}`,
		`{"Attributes":{"MemTest":"Enabled"},"@Redfish.SettingsApplyTime":{"ApplyTime":"OnReset"}}`, "KILNFW1\n{\"component\":\"BIOS\",\"version\":\"2.1.0\"}\nxx", `[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if attrs, _, err := ParseBIOSPatch(b); err == nil {
			if len(attrs) == 0 {
				t.Fatalf("accepted %q with no attributes", b)
			}
			for k, v := range attrs {
				a := registryAttr(k)
				if a == nil {
					t.Fatalf("accepted unknown attribute %q", k)
				}
				switch x := v.(type) {
				case string:
					ok := false
					for _, e := range a.Values {
						ok = ok || e == x
					}
					if !ok {
						t.Fatalf("accepted %s=%q", k, x)
					}
				case int:
					if a.Values != nil || x < a.Min || x > a.Max {
						t.Fatalf("accepted %s=%d", k, x)
					}
				default:
					t.Fatalf("accepted %s of type %T", k, v)
				}
			}
		}
		if h, err := ParseFirmwareImage(b); err == nil {
			if DefaultFirmware[h.Component] == "" || !versionRe.MatchString(h.Version) {
				t.Fatalf("accepted header %+v", h)
			}
			h2, err := ParseFirmwareImage(FirmwareImage(h.Component, h.Version, b))
			if err != nil || h2 != h {
				t.Fatalf("header %+v rebuilt reads %+v, %v", h, h2, err)
			}
		}
	})
}
