package httpboot

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ipxebin "github.com/tinkerbell/ipxedust/binary"

	"kiln/deploy/lab/testkit"
	"kiln/deploy/lab/testreq"
)

// Real curl in a network namespace "kbt-h*" joined by a veth pair in
// 10.72.2.0/24; the server runs in the test process on the host end.

// curl runs curl -sS with args in l's namespace, in dir, for at most 30 s.
func curl(l testkit.Link, dir string, args ...string) (string, error) {
	return l.Exec(30*time.Second, dir, "curl", append([]string{"-sS"}, args...)...)
}

func TestRealCurl(t *testing.T) {
	testreq.Root(t, "network namespaces", "ip", "curl")
	l := testkit.NewLink(t, "kbt-h", netip.MustParsePrefix("10.72.2.0/24"), 0)
	e := startHTTP(t, l.HostIP+":0", nil)
	dir := t.TempDir()
	base := e.base

	t.Run("never 3xx", func(t *testing.T) {
		for _, p := range []string{"//ipxe.efi", "/ipxe.efi/", "//env//vmlinuz", "/env/vmlinuz/", "//", "/images/",
			"//ipxe//52:54:00:00:00:01", "/ipxe/52:54:00:00:00:01/", "/./snp.efi", "/env/../undionly.kpxe"} {
			out, err := curl(l, dir, "--path-as-is", "-o", "/dev/null", "-w", "%{http_code}", base+p)
			if err != nil {
				t.Fatalf("%s: %v %s", p, err, out)
			}
			code, _ := strconv.Atoi(out)
			if code != 200 && code != 404 {
				t.Errorf("%s: %d, want 200 or 404", p, code)
			}
		}
		out, _ := curl(l, dir, "--path-as-is", "-o", "/dev/null", "-w", "%{http_code}", base+"//ipxe.efi")
		if out != "200" {
			t.Errorf("//ipxe.efi: %s", out)
		}
	})
	t.Run("full and range", func(t *testing.T) {
		if out, err := curl(l, dir, "-o", "ipxe.efi", base+"/ipxe.efi"); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		got, _ := os.ReadFile(filepath.Join(dir, "ipxe.efi"))
		if !bytes.Equal(got, ipxebin.Files["ipxe.efi"]) {
			t.Fatal("ipxe.efi mismatch")
		}
		out, err := curl(l, dir, "-r", "100-199", "-o", "part", "-w", "%{http_code}", base+"/env/vmlinuz")
		got, _ = os.ReadFile(filepath.Join(dir, "part"))
		if err != nil || out != "206" || !bytes.Equal(got, e.kernel[100:200]) {
			t.Fatalf("range: %v %s %d bytes", err, out, len(got))
		}
		// Resume a partial download (curl -C -), as an agent retry would.
		must(t, os.WriteFile(filepath.Join(dir, "resume"), e.kernel[:1000], 0o644))
		if out, err := curl(l, dir, "-C", "-", "-o", "resume", base+"/env/vmlinuz"); err != nil {
			t.Fatalf("resume: %v %s", err, out)
		}
		got, _ = os.ReadFile(filepath.Join(dir, "resume"))
		if !bytes.Equal(got, e.kernel) {
			t.Fatal("resumed kernel mismatch")
		}
		out, err = curl(l, dir, "-I", base+"/undionly.kpxe")
		if err != nil || !strings.Contains(out, fmt.Sprintf("Content-Length: %d", len(ipxebin.Files["undionly.kpxe"]))) ||
			!strings.Contains(out, "Etag: "+etagOf(ipxebin.Files["undionly.kpxe"])) {
			t.Fatalf("HEAD: %v\n%s", err, out)
		}
	})
	t.Run("script", func(t *testing.T) {
		out, err := curl(l, dir, base+"/ipxe/52:54:00:00:00:01")
		if err != nil || !strings.HasPrefix(out, "#!ipxe\n") || !strings.Contains(out, "kiln.machine=m-1") {
			t.Fatalf("%v\n%s", err, out)
		}
		out, _ = curl(l, dir, "-w", "%{http_code}", base+"/ipxe/52:54:00:00:00:02")
		if !strings.HasSuffix(out, "exit 1\n200") {
			t.Fatalf("local: %s", out)
		}
	})
}
