package agent

import (
	"bufio"
	"encoding/binary"
	"os"
	"strconv"
	"strings"
	"testing"

	"kiln/api/agentapi"
)

// loadIdentify reads a 256-word IDENTIFY dump ("NNN: WWWW WWWW ...", # comments).
func loadIdentify(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b []byte
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || !strings.Contains(line, ":") {
			continue
		}
		for _, w := range strings.Fields(strings.SplitN(line, ":", 2)[1]) {
			v, err := strconv.ParseUint(w, 16, 16)
			if err != nil {
				t.Fatal(err)
			}
			b = binary.LittleEndian.AppendUint16(b, uint16(v))
		}
	}
	if len(b) != 512 {
		t.Fatalf("%s: %d bytes", path, len(b))
	}
	return b
}

// setWord sets word i of IDENTIFY data b and fixes the integrity word.
func setWord(b []byte, i int, v uint16) []byte {
	c := append([]byte(nil), b...)
	binary.LittleEndian.PutUint16(c[2*i:], v)
	c[510] = 0xA5
	var sum byte
	for _, x := range c[:511] {
		sum += x
	}
	c[511] = -sum
	return c
}

// TestATAIdentifyCaptured: a real drive's IDENTIFY DEVICE (a Samsung 870 QVO whose BIOS
// froze it) decodes to its model, firmware, capacity and security state, and the plan is
// "frozen": reported with the thaw step, then the overwrite.
func TestATAIdentifyCaptured(t *testing.T) {
	b := loadIdentify(t, "testdata/ata-identify-samsung-870qvo-frozen.txt")
	id, err := parseATAIdentify(b)
	if err != nil {
		t.Fatal(err)
	}
	if id.Model != "Samsung SSD 870 QVO 4TB" || id.Firmware != "SVQ02B6Q" || id.Serial != "S5STNF0W000000X" ||
		id.Sectors != 7814037168 || !id.ChecksumOK {
		t.Fatalf("identity: %+v", id)
	}
	if !id.SecuritySupported || !id.Frozen || !id.EnhancedSupported || id.Enabled || id.Locked ||
		id.EraseMinutes != 4 || id.EnhancedEraseMinutes != 8 {
		t.Fatalf("security: %+v", id)
	}
	d := ataPlan(id)
	if d.Outcome != agentapi.EraseFrozen || d.Method != agentapi.EraseATASecurityEnhanced || !d.Fallback ||
		!strings.Contains(d.NextStep, "suspend") || !strings.Contains(d.Why, "word 128=0x0029") {
		t.Fatalf("plan: %+v", d)
	}
	// A corrupted byte breaks the integrity word.
	bad := append([]byte(nil), b...)
	bad[100] ^= 1
	if _, err := parseATAIdentify(bad); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("corrupted identify: %v", err)
	}
}

// TestATAPlan: the decision for each security state (word 128 variants of the captured
// drive; word 82 bit 1 cleared for "not supported").
func TestATAPlan(t *testing.T) {
	base := loadIdentify(t, "testdata/ata-identify-samsung-870qvo-frozen.txt")
	for _, tc := range []struct {
		name          string
		w82, w128     uint16
		method        string
		outcome       string
		fallback, kpw bool
	}{
		{"not supported", 0x7469, 0x0000, "", agentapi.EraseUnsupported, true, false},
		{"supported, thawed, enhanced", 0x746B, 0x0021, agentapi.EraseATASecurityEnhanced, "", true, false},
		{"supported, thawed, normal only", 0x746B, 0x0001, agentapi.EraseATASecurity, "", true, false},
		{"frozen", 0x746B, 0x0029, agentapi.EraseATASecurityEnhanced, agentapi.EraseFrozen, true, false},
		{"locked", 0x746B, 0x0027, agentapi.EraseATASecurityEnhanced, agentapi.EraseFailed, false, false},
		{"count expired", 0x746B, 0x0013, agentapi.EraseATASecurity, agentapi.EraseFailed, true, false},
		{"enabled (interrupted erase)", 0x746B, 0x0023, agentapi.EraseATASecurityEnhanced, "", true, true},
		{"word 128 invalid", 0x746B, 0xFFFF, "", agentapi.EraseUnsupported, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setWord(setWord(base, 82, tc.w82), 128, tc.w128)
			id, err := parseATAIdentify(b)
			if err != nil {
				t.Fatal(err)
			}
			d := ataPlan(id)
			if d.Method != tc.method || d.Outcome != tc.outcome || d.Fallback != tc.fallback || d.KnownPassword != tc.kpw {
				t.Fatalf("plan %+v", d)
			}
			if (d.Outcome == agentapi.EraseFrozen || d.Outcome == agentapi.EraseFailed) && d.NextStep == "" {
				t.Error("a blocked drive needs a next step")
			}
		})
	}
}

func TestATAEraseMinutes(t *testing.T) {
	for w, want := range map[uint16]int{0: 0, 2: 4, 0xFF: 510, 0x8000 | 300: 600, 0x1234: 0x34 * 2} {
		if got := ataEraseMinutes(w); got != want {
			t.Errorf("%#04x: %d, want %d", w, got, want)
		}
	}
}

// nvmeIDCtrlData builds Identify Controller data with the given capability fields.
func nvmeIDCtrlData(oacs uint16, fna uint8, sanicap uint32) []byte {
	b := make([]byte, 4096)
	binary.LittleEndian.PutUint16(b[0:], 0x1b36) // QEMU's PCI vendor
	copy(b[4:24], "NVME0001            ")
	copy(b[24:64], "QEMU NVMe Ctrl                          ")
	copy(b[64:72], "7.2.22  ")
	binary.LittleEndian.PutUint16(b[256:], oacs)
	binary.LittleEndian.PutUint32(b[328:], sanicap)
	binary.LittleEndian.PutUint32(b[516:], 256)
	b[524] = fna
	return b
}

// TestNVMePlan: the methods offered for each capability combination, strongest first.
func TestNVMePlan(t *testing.T) {
	names := func(p []nvmeMethod) string {
		var s []string
		for _, m := range p {
			s = append(s, m.name)
		}
		return strings.Join(s, ",")
	}
	for _, tc := range []struct {
		oacs    uint16
		fna     uint8
		sanicap uint32
		want    string
		lacks   int
	}{
		{0x0000, 0, 0, "", 3},
		{0x0002, 0, 0, agentapi.EraseNVMeFormatUserData, 3},
		{0x000A, 0x04, 0, agentapi.EraseNVMeFormatCrypto + "," + agentapi.EraseNVMeFormatUserData, 2},
		{0x0002, 0x04, 0x3, agentapi.EraseNVMeSanitizeCrypto + "," + agentapi.EraseNVMeSanitizeBlock + "," + agentapi.EraseNVMeFormatCrypto + "," + agentapi.EraseNVMeFormatUserData, 0},
		{0x0000, 0, 0x2, agentapi.EraseNVMeSanitizeBlock, 2},
	} {
		id, err := parseNVMeIDCtrl(nvmeIDCtrlData(tc.oacs, tc.fna, tc.sanicap))
		if err != nil {
			t.Fatal(err)
		}
		if id.Serial != "NVME0001" || id.Model != "QEMU NVMe Ctrl" || id.FW != "7.2.22" || id.NN != 256 {
			t.Fatalf("identify: %+v", id)
		}
		plan, lacks := nvmePlan(id)
		if names(plan) != tc.want || len(lacks) != tc.lacks {
			t.Errorf("OACS %#x FNA %#x SANICAP %#x: plan %q lacks %q, want %q", tc.oacs, tc.fna, tc.sanicap, names(plan), lacks, tc.want)
		}
	}
	// FNA bit 1 (secure erase applies to every namespace) makes the format broadcast.
	id, _ := parseNVMeIDCtrl(nvmeIDCtrlData(2, 2, 0))
	if plan, _ := nvmePlan(id); len(plan) != 1 || !plan[0].allNS {
		t.Errorf("FNA bit 1: %+v", plan)
	}
}

func TestNVMEIDNS(t *testing.T) {
	b := make([]byte, 4096)
	binary.LittleEndian.PutUint64(b[0:], 131072)
	b[25] = 7    // 8 formats
	b[26] = 0x14 // current format 4, metadata at the end of the LBA
	b[29] = 0x09 // PI type 1, PI first
	b[128+4*4+2] = 12
	ns, err := parseNVMeIDNS(b)
	if err != nil {
		t.Fatal(err)
	}
	if ns.NSZE != 131072 || ns.LBAF != 4 || !ns.MSET || ns.PI != 1 || !ns.PIL || ns.LBADS != 12 {
		t.Fatalf("%+v", ns)
	}
	b[26] = 0x09 // format 9 > NLBAF 7
	if _, err := parseNVMeIDNS(b); err == nil {
		t.Fatal("format beyond NLBAF accepted")
	}
	if _, err := parseNVMeIDNS(b[:100]); err == nil {
		t.Fatal("short data accepted")
	}
}

func TestSanitizeStatus(t *testing.T) {
	b := make([]byte, 512)
	binary.LittleEndian.PutUint16(b[0:], 0x8000)
	binary.LittleEndian.PutUint16(b[2:], 0x0102) // in progress, global data erased
	binary.LittleEndian.PutUint32(b[4:], 0x0C)   // crypto erase, AUSE
	binary.LittleEndian.PutUint32(b[16:], 30)
	s, err := parseSanitizeStatus(b)
	if err != nil {
		t.Fatal(err)
	}
	if s.SPROG != 0x8000 || s.State != sanInProgress || !s.GlobalErased || s.SCDW10 != 0x0C || s.EstCrypto != 30 {
		t.Fatalf("%+v", s)
	}
	binary.LittleEndian.PutUint16(b[2:], 0x0007)
	if _, err := parseSanitizeStatus(b); err == nil {
		t.Fatal("reserved state accepted")
	}
}

func TestNVMeStatusError(t *testing.T) {
	if s := nvmeStatusError(0x4002).Error(); !strings.Contains(s, "invalid field") {
		t.Errorf("%s", s)
	}
	if s := nvmeStatusError(0x10A).Error(); !strings.Contains(s, "invalid format") {
		t.Errorf("%s", s)
	}
}

func TestDescribeSense(t *testing.T) {
	// Descriptor sense, ABORTED COMMAND, ATA status return: error 04h (ABRT), status 51h.
	sense := []byte{0x72, 0x0B, 0x00, 0x00, 0, 0, 0, 14, 0x09, 12, 0, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x51}
	s := describeSense(sense, 2, 0, 8)
	if !strings.Contains(s, "sense key 0xb") || !strings.Contains(s, "ATA error 0x04 status 0x51") {
		t.Fatalf("%s", s)
	}
}

// Fuzz targets: the parsers of device data never panic, and what they accept is
// consistent.

func FuzzParseATAIdentify(f *testing.F) {
	f.Add(loadIdentify(f, "testdata/ata-identify-samsung-870qvo-frozen.txt"))
	f.Add(make([]byte, 512))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := parseATAIdentify(b)
		if err != nil {
			return
		}
		if !id.SecuritySupported && (id.Frozen || id.Locked || id.Enabled) {
			t.Fatalf("security bits without the feature set: %+v", id)
		}
		d := ataPlan(id)
		if d.Outcome == "" && d.Method == "" {
			t.Fatalf("plan with neither a method nor an outcome: %+v", d)
		}
		for _, s := range []string{id.Serial, id.Model, id.Firmware} {
			for _, r := range s {
				if r < 0x20 || r > 0x7e {
					t.Fatalf("non-printable %q", s)
				}
			}
		}
	})
}

func FuzzParseNVMeIDCtrl(f *testing.F) {
	f.Add(nvmeIDCtrlData(2, 4, 3))
	f.Add(make([]byte, 528))
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := parseNVMeIDCtrl(b)
		if err != nil {
			return
		}
		plan, lacks := nvmePlan(id)
		if len(plan)+len(lacks) < 3 || len(plan) > 4 {
			t.Fatalf("plan %v lacks %v", plan, lacks)
		}
	})
}

func FuzzParseNVMeIDNS(f *testing.F) {
	b := make([]byte, 4096)
	b[25], b[26], b[128+2] = 1, 0, 9
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		ns, err := parseNVMeIDNS(b)
		if err != nil {
			return
		}
		if ns.LBAF > int(ns.NLBAF) || ns.LBAF >= 64 {
			t.Fatalf("%+v", ns)
		}
	})
}

func FuzzParseSanitizeStatus(f *testing.F) {
	f.Add(make([]byte, 512))
	f.Add([]byte{0xff, 0xff, 0x01, 0x01, 0x0c, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := parseSanitizeStatus(b)
		if err == nil && s.State > sanCompletedN {
			t.Fatalf("%+v", s)
		}
	})
}

func FuzzDescribeSense(f *testing.F) {
	f.Add([]byte{0x72, 0x0B, 0x00, 0x00, 0, 0, 0, 14, 0x09, 12, 0, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x51})
	f.Add([]byte{0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = describeSense(b, 2, 0, 8)
	})
}

// TestSanitizeDone: the poll of the Sanitize Status log ends on our sanitize's completion
// or failure, not on a log still describing an earlier sanitize.
func TestSanitizeDone(t *testing.T) {
	const crypto = 4
	seq := func(states ...sanitizeStatus) (int, error) {
		saw := false
		for i, st := range states {
			done, err := sanitizeDone(st, crypto, &saw)
			if done || err != nil {
				return i, err
			}
		}
		return -1, nil
	}
	earlierBlock := sanitizeStatus{State: sanCompleted, SCDW10: 2 | 8}
	if i, err := seq(earlierBlock, sanitizeStatus{State: sanInProgress, SCDW10: 12}, sanitizeStatus{State: sanCompleted, SCDW10: 12}); i != 2 || err != nil {
		t.Errorf("earlier block erase, then ours: ended at %d (%v)", i, err)
	}
	if i, err := seq(earlierBlock, earlierBlock); i != -1 || err != nil {
		t.Errorf("an earlier sanitize's log was taken for ours: %d %v", i, err)
	}
	if i, err := seq(sanitizeStatus{State: sanCompletedN, SCDW10: 12}); i != 0 || err != nil {
		t.Errorf("completed at once (no deallocation): %d %v", i, err)
	}
	if _, err := seq(sanitizeStatus{State: sanInProgress}, sanitizeStatus{State: sanFailed}); err == nil {
		t.Error("failure not reported")
	}
}

func TestATABlockedPolicy(t *testing.T) {
	frozen := ataDecision{Outcome: agentapi.EraseFrozen, Fallback: true}
	locked := ataDecision{Outcome: agentapi.EraseFailed, Fallback: false}
	if ataBlockedIsFinal(frozen, erasePolicy(nil)) || !ataBlockedIsFinal(frozen, erasePolicy(&agentapi.ErasePolicy{OnFrozen: agentapi.OnFrozenFail})) {
		t.Error("frozen: overwrite by default, final under on_frozen=fail")
	}
	if !ataBlockedIsFinal(locked, erasePolicy(nil)) {
		t.Error("locked drive overwritten")
	}
}

func TestEraseGroup(t *testing.T) {
	for name, want := range map[string]string{"nvme0n1": "nvme0", "nvme12n3": "nvme12", "sda": "sda", "vda": "vda", "nvme": "nvme"} {
		if got := eraseGroup(name); got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
}
