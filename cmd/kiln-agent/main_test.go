package main

import (
	"kiln/deploy/lab/testreq"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"
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

// FuzzParseCmdline: the kernel command line (Documentation/admin-guide/kernel-parameters:
// space-separated "name" or "name=value"; a later occurrence of a name replaces an earlier
// one here). Every field appears in the map under the text before its first '=' with the
// text after it; keys and values hold no white space; the map written back as a command
// line parses to the same map.
func FuzzParseCmdline(f *testing.F) {
	f.Add("kiln.url=http://x kiln.machine=y")
	f.Add("")
	f.Add("a=b=c a=d \t=x quiet")
	f.Fuzz(func(t *testing.T, s string) {
		m := parseCmdline(s)
		fields := strings.Fields(s)
		seen := map[string]bool{}
		for i := len(fields) - 1; i >= 0; i-- { // the last occurrence wins
			k, v, _ := strings.Cut(fields[i], "=")
			if !seen[k] && m[k] != v {
				t.Fatalf("%q: field %q gives %q=%q, map has %q", s, fields[i], k, v, m[k])
			}
			seen[k] = true
		}
		if len(m) != len(seen) {
			t.Fatalf("%q: %d keys, %d distinct names", s, len(m), len(seen))
		}
		var b strings.Builder
		for k, v := range m {
			if strings.ContainsFunc(k+v, unicode.IsSpace) || strings.Contains(k, "=") {
				t.Fatalf("%q: key %q value %q", s, k, v)
			}
			b.WriteString(k + "=" + v + " ")
		}
		if again := parseCmdline(b.String()); !maps.Equal(again, m) {
			t.Fatalf("%q: %v written back as %q parses to %v", s, m, b.String(), again)
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
