// Package benchline is the one place that gates Kiln's benchmarks and prints
// their `bench:` lines (`make bench` greps them from `go test -v` output).
//
// A line has one of two forms:
//
//	bench: NAME kiln=K peer=P unit=U ratio=K/P peer_is=WHAT [KEY=VALUE ...]
//	bench: NAME kiln=K unit=U (no peer) [KEY=VALUE ...]
//
// The first compares Kiln with a peer product measured in the same run under
// the same conditions (WHAT names it, e.g. kea-dhcp4-2.2.0); the second is a
// figure with nothing to compare it with, and says so instead of printing a
// ratio. Trailing KEY=VALUE fields are context (a note on a difference of
// conditions, a drop percentage) and are not checked.
//
// Print fails the test (t.Fatalf, after printing `bench: NAME FAILED: why`)
// when Kiln's or the peer's figure is zero, negative, NaN or ±Inf, or when a
// comparison names no peer: a peer that did not start or a figure that was
// never measured must not pass as `ratio=0`.
package benchline

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Env is the variable that turns benchmarks on (`make bench` sets it to 1).
const Env = "KILN_BENCH"

// Need skips t unless KILN_BENCH=1. Once benchmarks are asked for, what they
// need is required: it fails t when root is true and the process is not root,
// or when one of bins is not on PATH, naming it (a bench whose peer cannot
// start fails rather than skipping).
func Need(t testing.TB, root bool, bins ...string) {
	t.Helper()
	if os.Getenv(Env) != "1" {
		t.Skipf("benchmark: set %s=1 (make bench)", Env)
		return
	}
	if root && os.Geteuid() != 0 {
		t.Fatalf("benchmark needs root (network namespaces); run make bench as root")
	}
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			t.Fatalf("benchmark needs %s on PATH (make deps installs it): %v", b, err)
		}
	}
}

// Peer is the product a figure is compared with, measured in the same run.
type Peer struct {
	// What names the peer on the line (no spaces), e.g. "kea-dhcp4-2.2.0",
	// "nginx", "hashicorp-raft+trivial-fsm".
	What string
	// Value is the peer's figure, in the line's unit.
	Value float64
}

// Field is a KEY=VALUE appended to a line for context; VALUE has no spaces.
type Field struct {
	Key, Value string
}

// Line is one `bench:` line.
type Line struct {
	// Name is the figure's name, e.g. dhcp_dora_per_s (no spaces).
	Name string
	// Unit of both figures, e.g. exchanges/s, s, bytes (no spaces).
	Unit string
	// Kiln is Kiln's figure.
	Kiln float64
	// Peer is what Kiln is compared with; nil prints the "(no peer)" form.
	Peer *Peer
	// Fields follow the figures as KEY=VALUE.
	Fields []Field
}

// Print checks l and prints it on stdout (see the package comment for the
// forms and for what fails t).
func Print(t testing.TB, l Line) {
	t.Helper()
	s, err := Format(l)
	if err != nil {
		fmt.Printf("bench: %s FAILED: %v\n", l.Name, err)
		t.Fatalf("bench %s: %v", l.Name, err)
		return
	}
	fmt.Println(s)
}

// Format renders l, or says why it is not a valid line (the checks of Print).
func Format(l Line) (string, error) {
	for _, w := range [][2]string{{"name", l.Name}, {"unit", l.Unit}} {
		if w[1] == "" || strings.ContainsAny(w[1], " \t\n") {
			return "", fmt.Errorf("%s %q: want a non-empty word", w[0], w[1])
		}
	}
	if err := valid("kiln", l.Kiln); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "bench: %s kiln=%s", l.Name, Num(l.Kiln))
	if l.Peer == nil {
		fmt.Fprintf(&b, " unit=%s (no peer)", l.Unit)
	} else {
		if l.Peer.What == "" || strings.ContainsAny(l.Peer.What, " \t\n") {
			return "", fmt.Errorf("peer %q: name the peer product in one word (did it run?)", l.Peer.What)
		}
		if err := valid("peer "+l.Peer.What, l.Peer.Value); err != nil {
			return "", err
		}
		fmt.Fprintf(&b, " peer=%s unit=%s ratio=%s peer_is=%s", Num(l.Peer.Value), l.Unit, Num(l.Kiln/l.Peer.Value), l.Peer.What)
	}
	for _, f := range l.Fields {
		if f.Key == "" || strings.ContainsAny(f.Key, "=") || strings.ContainsAny(f.Key+f.Value, " \t\n") {
			return "", fmt.Errorf("field %q=%q: want KEY=VALUE without spaces", f.Key, f.Value)
		}
		fmt.Fprintf(&b, " %s=%s", f.Key, f.Value)
	}
	return b.String(), nil
}

func valid(who string, v float64) error {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return fmt.Errorf("%s figure is %v: not measured", who, v)
	case v <= 0:
		return fmt.Errorf("%s figure is %v: zero or negative means it did not run or measured nothing", who, v)
	}
	return nil
}

// Num formats a figure with 4 significant digits and no exponent: 4000,
// 258.3, 0.01230.
func Num(v float64) string {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Sprint(v)
	}
	d := 3 - int(math.Floor(math.Log10(math.Abs(v))))
	if d < 0 {
		d = 0
	}
	return fmt.Sprintf("%.*f", d, v)
}
