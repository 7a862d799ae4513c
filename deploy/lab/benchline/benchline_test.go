package benchline

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	kea := &Peer{What: "kea-dhcp4-2.2.0", Value: 2000}
	for _, c := range []struct {
		l    Line
		want string // "" = must be refused
		err  string // part of the refusal
	}{
		{Line{Name: "dhcp_dora_per_s", Unit: "exchanges/s", Kiln: 4000, Peer: kea, Fields: []Field{{"note", "kea-memfile-no-fsync"}}},
			"bench: dhcp_dora_per_s kiln=4000 peer=2000 unit=exchanges/s ratio=2.000 peer_is=kea-dhcp4-2.2.0 note=kea-memfile-no-fsync", ""},
		{Line{Name: "import_2000_rows_seconds", Unit: "s", Kiln: 0.01234},
			"bench: import_2000_rows_seconds kiln=0.01234 unit=s (no peer)", ""},
		{Line{Name: "x", Unit: "us", Kiln: 258.34, Peer: &Peer{What: "kea", Value: 280}},
			"bench: x kiln=258.3 peer=280.0 unit=us ratio=0.9226 peer_is=kea", ""},
		// a peer that never ran: zero, NaN, Inf, negative, unnamed
		{Line{Name: "x", Unit: "s", Kiln: 1, Peer: &Peer{What: "kea", Value: 0}}, "", "peer kea figure is 0"},
		{Line{Name: "x", Unit: "s", Kiln: 1, Peer: &Peer{What: "kea", Value: math.NaN()}}, "", "not measured"},
		{Line{Name: "x", Unit: "s", Kiln: 1, Peer: &Peer{What: "kea", Value: math.Inf(1)}}, "", "not measured"},
		{Line{Name: "x", Unit: "s", Kiln: 1, Peer: &Peer{What: "kea", Value: -3}}, "", "negative"},
		{Line{Name: "x", Unit: "s", Kiln: 1, Peer: &Peer{Value: 3}}, "", "name the peer"},
		// Kiln's own figure missing
		{Line{Name: "x", Unit: "s", Kiln: 0}, "", "kiln figure is 0"},
		{Line{Name: "x", Unit: "s", Kiln: math.Inf(-1), Peer: kea}, "", "kiln figure"},
		// malformed words
		{Line{Name: "two words", Unit: "s", Kiln: 1}, "", "name"},
		{Line{Name: "x", Unit: "", Kiln: 1}, "", "unit"},
		{Line{Name: "x", Unit: "s", Kiln: 1, Fields: []Field{{"note", "has space"}}}, "", "field"},
		{Line{Name: "x", Unit: "s", Kiln: 1, Fields: []Field{{"", "v"}}}, "", "field"},
	} {
		got, err := Format(c.l)
		if c.want != "" {
			if err != nil || got != c.want {
				t.Errorf("Format(%+v) = %q, %v; want %q", c.l, got, err, c.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("Format(%+v) = %q, %v; want an error containing %q", c.l, got, err, c.err)
		}
	}
}

func TestNum(t *testing.T) {
	for v, want := range map[float64]string{4000: "4000", 1234567: "1234567", 258.34: "258.3", 1.5: "1.500", 0.000123456: "0.0001235", 0: "0"} {
		if got := Num(v); got != want {
			t.Errorf("Num(%v) = %q, want %q", v, got, want)
		}
	}
}

// recTB records Fatalf and Skipf instead of ending the test.
type recTB struct {
	testing.TB
	fatal, skip []string
}

func (r *recTB) Helper()                   {}
func (r *recTB) Fatalf(f string, a ...any) { r.fatal = append(r.fatal, fmt.Sprintf(f, a...)) }
func (r *recTB) Skipf(f string, a ...any)  { r.skip = append(r.skip, fmt.Sprintf(f, a...)) }

// A peer that never ran (figure 0) fails the test instead of printing ratio=0.
func TestPrintFailsOnMissingPeer(t *testing.T) {
	r := &recTB{TB: t}
	Print(r, Line{Name: "dhcp_dora_per_s", Unit: "exchanges/s", Kiln: 4000, Peer: &Peer{What: "kea", Value: 0}})
	if len(r.fatal) != 1 || !strings.Contains(r.fatal[0], "peer kea figure is 0") {
		t.Fatalf("Print with a zero peer: fatal %q", r.fatal)
	}
	r = &recTB{TB: t}
	Print(r, Line{Name: "x", Unit: "s", Kiln: 1, Peer: &Peer{What: "kea", Value: 2}})
	if len(r.fatal) != 0 {
		t.Fatalf("Print of a valid line failed: %q", r.fatal)
	}
}

// Without KILN_BENCH=1 a bench skips; with it, a missing peer binary fails.
func TestNeed(t *testing.T) {
	t.Setenv(Env, "")
	r := &recTB{TB: t}
	Need(r, false)
	if len(r.skip) == 0 || len(r.fatal) != 0 {
		t.Fatalf("KILN_BENCH unset: skip %q fatal %q", r.skip, r.fatal)
	}
	t.Setenv(Env, "1")
	r = &recTB{TB: t}
	absent := "kiln-no-such-peer" // deps-check:absent (no package provides it, on purpose)
	Need(r, false, "sh", absent)
	if len(r.skip) != 0 || len(r.fatal) != 1 || !strings.Contains(r.fatal[0], absent) {
		t.Fatalf("KILN_BENCH=1, missing binary: skip %q fatal %q", r.skip, r.fatal)
	}
}
