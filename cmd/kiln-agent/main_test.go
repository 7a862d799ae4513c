package main

import (
	"kiln/deploy/lab/testreq"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseCmdline(t *testing.T) {
	m := parseCmdline("BOOT_IMAGE=/vmlinuz console=ttyS0,115200 quiet kiln.url=http://10.0.0.1:8080 kiln.machine=m-7 kiln.token=a=b\n")
	if m["kiln.url"] != "http://10.0.0.1:8080" || m["kiln.machine"] != "m-7" || m["kiln.token"] != "a=b" {
		t.Errorf("%v", m)
	}
	if _, ok := m["quiet"]; !ok {
		t.Error("flag without value lost")
	}
}

func FuzzParseCmdline(f *testing.F) {
	f.Add("kiln.url=http://x kiln.machine=y")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		for k := range parseCmdline(s) {
			if strings.ContainsAny(k, " \t\n") {
				t.Fatalf("key %q has whitespace", k)
			}
		}
	})
}

// TestEnvBuildReproducible builds the in-RAM environment twice (deploy/env/build.sh, the
// kernel .deb cached in build/cache) and requires identical digests.
func TestEnvBuildReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("env build skipped in -short mode")
	}
	var digests []string
	for i := 0; i < 2; i++ {
		out := testreq.BuildEnv(t) // a failing build fails the test
		d, err := os.ReadFile(filepath.Join(out, "DIGESTS"))
		if err != nil {
			t.Fatal(err)
		}
		if lines := strings.Split(strings.TrimSpace(string(d)), "\n"); len(lines) != 3 ||
			!strings.HasSuffix(lines[0], ".deb") || !strings.HasSuffix(lines[1], "vmlinuz") || !strings.HasSuffix(lines[2], "initramfs") {
			t.Fatalf("DIGESTS:\n%s", d)
		}
		digests = append(digests, string(d))
	}
	if digests[0] != digests[1] {
		t.Fatalf("builds differ:\n%s\n%s", digests[0], digests[1])
	}
	t.Logf("reproducible:\n%s", digests[0])
}
