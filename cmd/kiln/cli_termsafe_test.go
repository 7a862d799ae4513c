package main

import (
	"strings"
	"testing"

	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// TestCLITableNeverPrintsControlCharacters: a record whose text holds
// terminal control characters (stored before the API refused them, or
// written by another path) is shown with visible escapes in table output;
// the raw bytes never reach the terminal (issue 20: `kiln machines list`
// printed NUL, ESC, U+202E and a newline as they were).
func TestCLITableNeverPrintsControlCharacters(t *testing.T) {
	e := newCLIEnv(t)
	names := []string{"a\x00b", "esc\x1b[31mred", "rtl\u202eevil", "two\nlines", "tab\tcol", "bad\xffutf8"}
	for i, n := range names {
		e.machine(n, i, store.StateAvailable)
	}
	for _, args := range [][]string{{"machines", "list"}, {"events"}} {
		out := e.admin(args...)
		for _, r := range out {
			if r != '\n' && !rules.TextRune(r) {
				t.Fatalf("kiln %v printed %U raw:\n%q", args, r, out)
			}
		}
		if strings.Contains(out, "\xff") {
			t.Fatalf("kiln %v printed invalid UTF-8:\n%q", args, out)
		}
	}
	out := e.admin("machines", "list")
	for _, want := range []string{`a\x00b`, `esc\x1b[31mred`, `rtl\u202eevil`, `two\nlines`, `tab\tcol`, "bad\uFFFDutf8"} {
		if !strings.Contains(out, want) {
			t.Errorf("machines list lacks %s:\n%s", want, out)
		}
	}
	// One machine, one line: 6 rows and the header.
	if n := strings.Count(out, "\n"); n != len(names)+1 {
		t.Errorf("%d lines, want %d:\n%s", n, len(names)+1, out)
	}
}

func TestTermSafe(t *testing.T) {
	for in, want := range map[string]string{
		"plain":         "plain",
		"Zürich ラック":    "Zürich ラック",
		"\x1b[2J":       `\x1b[2J`,
		"a\u2028b":      `a\u2028b`,
		"\u2066x\u2069": `\u2066x\u2069`,
		"\x9b":          `\x9b`,
		"\u009b":        `\u009b`,
	} {
		if got := termSafe(in); got != want {
			t.Errorf("termSafe(%q) = %q, want %q", in, got, want)
		}
	}
}
