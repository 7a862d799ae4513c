package rules

import (
	"kiln/deploy/lab/testkit"
	"strings"
	"testing"
)

var hostile = testkit.HostileText

func TestTextRuleRefusesHostileCharacters(t *testing.T) {
	for name, v := range hostile {
		if err := CheckText(v, MaxTextLen); err == nil {
			t.Errorf("%s: CheckText(%q) accepted", name, v)
		}
		if Printable(v) {
			t.Errorf("%s: Printable(%q) = true", name, v)
		}
		if err := CheckName(v); err == nil {
			t.Errorf("%s: CheckName(%q) accepted", name, v)
		}
		if err := CheckLabel("k", v); err == nil {
			t.Errorf("%s: CheckLabel value %q accepted", name, v)
		}
		if got := SanitizeText(v, 100); !Printable(got) {
			t.Errorf("%s: SanitizeText(%q) = %q, still not printable", name, v, got)
		}
	}
	for _, ok := range []string{"", "Dell Inc.", "PowerEdge R760 — rev. 2", "Zürich hall 3", "ラック", "a,b=c", "\uFFFD"} {
		if err := CheckText(ok, MaxTextLen); err != nil {
			t.Errorf("CheckText(%q): %v", ok, err)
		}
	}
	if err := CheckText(strings.Repeat("x", MaxTextLen+1), MaxTextLen); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("over-long text: %v", err)
	}
	// The message names the character and where it is, never echoing it raw.
	err := CheckText("ab\u202ecd", MaxTextLen)
	if err == nil || !strings.Contains(err.Error(), "U+202E at byte 2") || strings.ContainsRune(err.Error(), '\u202e') {
		t.Errorf("message %v", err)
	}
}

func TestNameRule(t *testing.T) {
	for _, ok := range []string{"n1", "rack3-u12", "web_01.fra", strings.Repeat("a", MaxNameLen)} {
		if err := CheckName(ok); err != nil {
			t.Errorf("CheckName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-lead", "trail-", "sp ace", "ünï", strings.Repeat("a", MaxNameLen+1), strings.Repeat("x", 100<<10)} {
		if err := CheckName(bad); err == nil {
			t.Errorf("CheckName(%.20q) accepted", bad)
		}
	}
}

func TestLabelHostnameHostPortRules(t *testing.T) {
	for _, c := range []struct {
		k, v string
		ok   bool
	}{
		{"zone", "a", true}, {"example.com/pool", "gpu", true}, {"k", "", true},
		{"", "x", false}, {"-k", "x", false}, {"k-", "x", false}, {strings.Repeat("k", MaxLabelKeyLen+1), "x", false},
		{"k", "a,b", false}, {"k", "a=b", false}, {"k", strings.Repeat("v", MaxLabelValueLen+1), false},
	} {
		if err := CheckLabel(c.k, c.v); (err == nil) != c.ok {
			t.Errorf("CheckLabel(%q, %q) = %v, want ok=%v", c.k, c.v, err, c.ok)
		}
	}
	for _, c := range []struct {
		v  string
		ok bool
	}{
		{"node-1", true}, {"node-1.fra.example.com", true}, {"Node-1", false}, {"bad_host", false},
		{"-x", false}, {"x..y", false}, {strings.Repeat("a", 64), false}, {strings.Repeat("a.", 127) + "a", false},
	} {
		if err := CheckHostname(c.v); (err == nil) != c.ok {
			t.Errorf("CheckHostname(%q) = %v, want ok=%v", c.v, err, c.ok)
		}
	}
	for _, c := range []struct {
		v  string
		ok bool
	}{
		{"10.0.0.1", true}, {"10.0.0.1:623", true}, {"BMC-7.mgmt.example", true}, {"[fd00::1]:443", true}, {"fd00::1", true},
		{"10.0.0.1:0", false}, {"10.0.0.1:99999", false}, {"http://bmc", false}, {"bmc host", false}, {"bmc\x1b", false}, {"", false},
	} {
		if err := CheckHostPort(c.v); (err == nil) != c.ok {
			t.Errorf("CheckHostPort(%q) = %v, want ok=%v", c.v, err, c.ok)
		}
	}
}

func TestSanitizeTextCutsOnRuneBoundary(t *testing.T) {
	got := SanitizeText("bad\x1b[31m\n"+strings.Repeat("é", 10), 10)
	if got != "bad [31m " || len(got) > 10 {
		t.Fatalf("got %q", got)
	}
	if got := SanitizeText("ééé", 5); got != "éé" {
		t.Fatalf("cut inside a rune: %q", got)
	}
	if got := SanitizeText("a\xffb", -1); got != "a\uFFFDb" {
		t.Fatalf("invalid UTF-8: %q", got)
	}
}
