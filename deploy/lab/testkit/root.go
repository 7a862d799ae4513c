package testkit

import (
	"os"
	"os/exec"
	"testing"
)

// NeedRoot skips t unless the process runs as root (effective UID 0) and
// every program in bins is found on PATH. why says what root is needed for
// ("network namespaces", "loop devices"); it is part of the skip message, as
// is the missing program. A test that needs root never passes silently: it
// runs, or it is reported as skipped with the reason.
func NeedRoot(t testing.TB, why string, bins ...string) {
	t.Helper()
	if uid := os.Geteuid(); uid != 0 {
		t.Skipf("needs root for %s (running as uid %d)", why, uid)
	}
	NeedBins(t, bins...)
}

// NeedBins skips t unless every program in bins is found on PATH; the skip
// message names the first one missing (`make deps` installs the lab's
// programs, deploy/scripts/packages.tsv names their Debian packages).
func NeedBins(t testing.TB, bins ...string) {
	t.Helper()
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("needs %s on PATH (make deps installs it): %v", b, err)
		}
	}
}
