package labimage

import (
	"kiln/deploy/lab/testreq"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestBuildIsRealAndRepeatable(t *testing.T) {
	testreq.Commands(t, "mkfs.ext4", "debugfs", "sfdisk")
	a, err := Build(t.TempDir(), "a", 8, "kiln-lab")
	if err != nil {
		t.Fatal(err)
	}
	if a.Size != 9<<20 {
		t.Fatalf("size %d, want %d", a.Size, 9<<20)
	}
	out, err := exec.Command("sfdisk", "-d", a.Path).CombinedOutput()
	if err != nil {
		t.Fatalf("sfdisk -d: %v: %s", err, out)
	}
	if !strings.Contains(string(out), "start=        2048") || !strings.Contains(string(out), "type=83") {
		t.Fatalf("partition table not as built:\n%s", out)
	}
	time.Sleep(1100 * time.Millisecond) // a second build in another second: no wall-clock time may leak in
	b, err := Build(t.TempDir(), "a", 8, "kiln-lab")
	if err != nil {
		t.Fatal(err)
	}
	if a.SHA256 != b.SHA256 {
		t.Fatalf("two builds differ: %s vs %s", a.SHA256, b.SHA256)
	}
}
