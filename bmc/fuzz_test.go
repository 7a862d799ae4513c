package bmc

import (
	"strings"
	"testing"
)

// The BMC's answers are network bytes: their parsers must never panic, and must return
// either a valid value or an error.

func FuzzParseIPMIPower(f *testing.F) {
	for _, s := range []string{"Chassis Power is on\n", "Chassis Power is off", "", "\x00\xff", "Chassis Power is on\nx"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		st, err := parseIPMIPower(s)
		if (err == nil) == (st == "") || (err == nil && st != PowerOn && st != PowerOff) {
			t.Fatalf("%q -> %q, %v", s, st, err)
		}
	})
}

func FuzzParseBootParam5(f *testing.F) {
	for _, s := range []string{"Boot parameter data: 8004000000\n", "Boot parameter data: 0004000000", "Boot parameter data: ",
		"Boot parameter data: 80040000001122", "garbage"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := parseBootParam5(s)
		if err == nil && b.Device > 15 {
			t.Fatalf("device selector %d out of range", b.Device)
		}
	})
}

func FuzzParseRedfishBoot(f *testing.F) {
	for _, s := range []string{`{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once","BootSourceOverrideMode":"UEFI"}}`,
		`{"Boot":null}`, `{"PowerState":"On"}`, `[`, `{"Boot":{"BootSourceOverrideTarget":null,"BootSourceOverrideEnabled":"Once"}}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := parseBoot(strings.NewReader(s))
		if err != nil && b != (bootSettings{}) {
			t.Fatalf("error with a value: %v %v", b, err)
		}
		_, _ = parseRedfishPowerState(s)
	})
}
