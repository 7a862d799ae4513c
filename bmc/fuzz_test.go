package bmc

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// The BMC's answers are network bytes: their parsers must never panic, must
// return either a valid value or an error wrapping ErrBadAnswer, and must
// agree with a second reading of the same answer (the spec's table, or the
// value encoded again).

// FuzzParseIPMIPower: `ipmitool chassis power status` is accepted exactly
// when its only non-blank line is "Chassis Power is on" or "... off", and
// then gives that state.
func FuzzParseIPMIPower(f *testing.F) {
	for _, s := range []string{"Chassis Power is on\n", "Chassis Power is off", "", "\x00\xff", "Chassis Power is on\nx", "\n  Chassis Power is off \r\n\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var lines []string
		for _, l := range strings.Split(s, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				lines = append(lines, l)
			}
		}
		var want PowerState
		if len(lines) == 1 && lines[0] == "Chassis Power is on" {
			want = PowerOn
		} else if len(lines) == 1 && lines[0] == "Chassis Power is off" {
			want = PowerOff
		}
		st, err := parseIPMIPower(s)
		if st != want || (err == nil) != (want != "") || (err != nil && !errors.Is(err, ErrBadAnswer)) {
			t.Fatalf("%.80q -> %.80q, %v; want %.80q", s, st, err, want)
		}
	})
}

// FuzzParseBootParam5: boot flags (IPMI v2.0 §28.13, boot option parameter
// 5): data byte 1 bit 7 valid, bit 6 persistent, bit 5 EFI; byte 2 bits 5:2
// the boot device selector. Any 5 data bytes printed the way ipmitool prints
// them decode to exactly those bits; arbitrary text is accepted only with
// one "Boot parameter data:" line of 10 hex digits, decoded the same way.
func FuzzParseBootParam5(f *testing.F) {
	for _, s := range []string{"Boot parameter data: 8004000000\n", "Boot parameter data: 0004000000", "Boot parameter data: ",
		"Boot parameter data: 80040000001122", "garbage", "Boot parameter data: e03c000000\nBoot parameter data: 00"} {
		f.Add(s, []byte{0x80, 0x04, 0, 0, 0})
	}
	// A line longer than bufio.Scanner's 64 KiB token hid the lines after it.
	f.Add("Boot parameter data: 8004000000\n"+strings.Repeat("x", 70000)+"\nBoot parameter data: 0000000000\n", []byte{})
	spec := func(b []byte) bootFlags {
		return bootFlags{Valid: b[0]&0x80 != 0, Persistent: b[0]&0x40 != 0, EFI: b[0]&0x20 != 0, Device: (b[1] & 0x3C) >> 2}
	}
	f.Fuzz(func(t *testing.T, s string, data []byte) {
		if len(data) >= 5 {
			out := "Boot parameter version: 1\nBoot parameter 5 is valid/unlocked\nBoot parameter data: " + hex.EncodeToString(data[:5]) + "\n Boot Flags :\n"
			got, err := parseBootParam5(out)
			if err != nil || got != spec(data[:5]) {
				t.Fatalf("data % x -> %+v, %v; want %+v", data[:5], got, err, spec(data[:5]))
			}
		}
		got, err := parseBootParam5(s)
		if err != nil {
			if !errors.Is(err, ErrBadAnswer) || got != (bootFlags{}) {
				t.Fatalf("%.80q: error %v with value %+v", s, err, got)
			}
			return
		}
		var lines []string
		for _, l := range strings.Split(s, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Boot parameter data:"); ok {
				lines = append(lines, strings.TrimSpace(v))
			}
		}
		if len(lines) != 1 {
			t.Fatalf("%.80q accepted with %d data lines", s, len(lines))
		}
		b, herr := hex.DecodeString(lines[0])
		if herr != nil || len(b) != 5 || got != spec(b) {
			t.Fatalf("%.80q -> %+v; the data line says % x (%v)", s, got, b, herr)
		}
	})
}

// FuzzParseRedfishBoot: a ComputerSystem's Boot override properties (Redfish
// ComputerSystem v1 "Boot"). Accepted values, written back as a
// ComputerSystem document, read back unchanged; an error carries no value.
// parseRedfishPowerState accepts exactly "On" and "Off".
func FuzzParseRedfishBoot(f *testing.F) {
	for _, s := range []string{`{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once","BootSourceOverrideMode":"UEFI"}}`,
		`{"Boot":null}`, `{"PowerState":"On"}`, `[`, `{"Boot":{"BootSourceOverrideTarget":null,"BootSourceOverrideEnabled":"Once"}}`, "On", "Off", "PoweringOn"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := parseBoot(strings.NewReader(s))
		if err != nil {
			if b != (bootSettings{}) || !errors.Is(err, ErrBadAnswer) {
				t.Fatalf("error with a value: %v %v", b, err)
			}
		} else {
			boot := map[string]string{"BootSourceOverrideTarget": b.Target, "BootSourceOverrideEnabled": b.Enabled}
			if b.Mode != "" {
				boot["BootSourceOverrideMode"] = b.Mode
			}
			doc, _ := json.Marshal(map[string]any{"Boot": boot})
			b2, err := parseBoot(strings.NewReader(string(doc)))
			if err != nil || b2 != b {
				t.Fatalf("%.80q -> %v; written back as %s it reads %v, %v", s, b, doc, b2, err)
			}
		}
		st, err := parseRedfishPowerState(s)
		want := map[string]PowerState{"On": PowerOn, "Off": PowerOff}[s]
		if st != want || (err == nil) != (want != "") || (err != nil && !errors.Is(err, ErrBadAnswer)) {
			t.Fatalf("power state %.80q -> %.80q, %v", s, st, err)
		}
	})
}
