package bmc

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
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

// FuzzParseRedfishFirmware: the firmware and BIOS documents (DSP0268
// SoftwareInventory, Task, Bios, UpdateService). An error wraps ErrBadAnswer
// and carries no value; an accepted document, written back in its schema's
// shape, reads back the same.
func FuzzParseRedfishFirmware(f *testing.F) {
	for _, s := range []string{
		`{"@odata.id":"/redfish/v1/UpdateService/FirmwareInventory/BIOS","Id":"BIOS","Name":"BIOS","Version":"2.1.0","Updateable":true,"SoftwareId":"x","RelatedItem":[{"@odata.id":"/redfish/v1/Systems/1"}]}`,
		`{"@odata.id":"/redfish/v1/TaskService/Tasks/3","Id":"3","TaskState":"Running","TaskStatus":"OK","PercentComplete":40,"TaskMonitor":"/redfish/v1/TaskService/TaskMonitors/3","Messages":[{"MessageId":"Update.1.0.AwaitToActivate","Message":"reboot"}]}`,
		`{"Attributes":{"A":"B","N":5,"F":1.5,"T":true,"Z":null},"AttributeRegistry":"R","@Redfish.Settings":{"SettingsObject":{"@odata.id":"/redfish/v1/Systems/1/Bios/Settings"},"SupportedApplyTimes":["OnReset"],"Time":"2026-01-02T03:04:05Z"}}`,
		`{"FirmwareInventory":{"@odata.id":"/redfish/v1/UpdateService/FirmwareInventory"},"MultipartHttpPushUri":"/redfish/v1/UpdateService/upload","Actions":{"#UpdateService.SimpleUpdate":{"target":"/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate"}}}`,
		`{"TaskState":"Bogus"}`, `{"Attributes":{"A":[1]}}`, `{"Id":"x","Name":"y","@odata.id":"http://evil/redfish/v1/x"}`, `[`, `null`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		bad := func(what string, err error, zero bool) {
			if !errors.Is(err, ErrBadAnswer) || !zero {
				t.Fatalf("%s %.80q: error %v (value zero: %v)", what, s, err, zero)
			}
		}
		if fc, err := parseRfSoftwareInventory(strings.NewReader(s)); err != nil {
			bad("SoftwareInventory", err, fc.ID == "" && fc.Name == "" && fc.Path == "")
		} else {
			var rel []any
			for _, r := range fc.Related {
				rel = append(rel, map[string]string{"@odata.id": r})
			}
			doc, _ := json.Marshal(map[string]any{"@odata.id": fc.Path, "Id": fc.ID, "Name": fc.Name, "Version": fc.Version,
				"Updateable": fc.Updateable, "SoftwareId": fc.SoftwareID, "RelatedItem": rel})
			fc2, err := parseRfSoftwareInventory(strings.NewReader(string(doc)))
			if err != nil || fmt.Sprint(fc2) != fmt.Sprint(fc) {
				t.Fatalf("%.80q -> %+v; written back %s reads %+v, %v", s, fc, doc, fc2, err)
			}
		}
		if ts, err := parseRfTask(strings.NewReader(s)); err != nil {
			bad("Task", err, ts.State == "" && ts.ID == "")
		} else {
			if !taskStates[ts.State] || ts.Percent < -1 || ts.Percent > 100 || len(ts.Messages) != len(ts.MessageIDs) {
				t.Fatalf("%.80q -> invalid task %+v", s, ts)
			}
			doc := map[string]any{"Id": ts.ID, "TaskState": ts.State}
			if ts.Path != "" {
				doc["@odata.id"] = ts.Path
			}
			if ts.Monitor != "" {
				doc["TaskMonitor"] = ts.Monitor
			}
			if ts.Status != "" {
				doc["TaskStatus"] = ts.Status
			}
			if ts.Percent >= 0 {
				doc["PercentComplete"] = ts.Percent
			}
			var msgs []any
			for i := range ts.Messages {
				msgs = append(msgs, map[string]string{"MessageId": ts.MessageIDs[i], "Message": ts.Messages[i]})
			}
			doc["Messages"] = msgs
			raw, _ := json.Marshal(doc)
			ts2, err := parseRfTask(strings.NewReader(string(raw)))
			if err != nil || fmt.Sprint(ts2) != fmt.Sprint(ts) {
				t.Fatalf("%.80q -> %+v; written back %s reads %+v, %v", s, ts, raw, ts2, err)
			}
		}
		if b, err := parseRfBios(strings.NewReader(s)); err != nil {
			bad("Bios", err, b.Attributes == nil && b.SettingsPath == "")
		} else {
			for k, v := range b.Attributes {
				switch v.(type) {
				case nil, bool, string, int64, float64:
				default:
					t.Fatalf("%.80q: attribute %q has type %T", s, k, v)
				}
			}
			settings := map[string]any{"SupportedApplyTimes": b.ApplyTimes}
			if b.SettingsPath != "" {
				settings["SettingsObject"] = map[string]string{"@odata.id": b.SettingsPath}
			}
			if !b.AppliedAt.IsZero() {
				settings["Time"] = b.AppliedAt.Format(time.RFC3339Nano)
			}
			raw, _ := json.Marshal(map[string]any{"Attributes": b.Attributes, "AttributeRegistry": b.Registry, "@Redfish.Settings": settings})
			b2, err := parseRfBios(strings.NewReader(string(raw)))
			if err != nil || b2.SettingsPath != b.SettingsPath || !b2.AppliedAt.Equal(b.AppliedAt) || len(b2.Attributes) != len(b.Attributes) ||
				fmt.Sprint(b2.ApplyTimes) != fmt.Sprint(b.ApplyTimes) || b2.Registry != b.Registry {
				t.Fatalf("%.80q -> %+v; written back %s reads %+v, %v", s, b, raw, b2, err)
			}
			for k, v := range b.Attributes {
				if AttrString(b2.Attributes[k]) != AttrString(v) {
					t.Fatalf("%.80q: attribute %q %v reads back %v", s, k, v, b2.Attributes[k])
				}
			}
		}
		if us, err := parseRfUpdateService(strings.NewReader(s)); err != nil {
			bad("UpdateService", err, us == (rfUpdateService{}))
		} else {
			for _, p := range []string{us.Inventory, us.SimpleUpdate, us.MultipartPush} {
				if p != "" && (!strings.HasPrefix(p, "/redfish/v1/") || strings.Contains(p, "..")) {
					t.Fatalf("%.80q: UpdateService reference %q", s, p)
				}
			}
		}
	})
}
