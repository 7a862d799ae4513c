package httpboot

import (
	"bytes"
	"fmt"
	"kiln/deploy/lab/testreq"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	ipxebin "github.com/tinkerbell/ipxedust/binary"
)

// Real curl in a network namespace "kbt-h*" joined by a veth pair in
// 10.72.2.0/24; the server runs in the test process on the host end.

var nsSeq atomic.Int32

type netnsLink struct{ ns, hostIP, nsIP string }

func needRoot(t *testing.T, bins ...string) {
	t.Helper()
	testreq.Root(t, "creates network namespaces")
	testreq.Commands(t, append([]string{"ip"}, bins...)...)
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func newLink(t testing.TB, subnet int) netnsLink {
	t.Helper()
	id := fmt.Sprintf("%d%d", os.Getpid()%10000, nsSeq.Add(1))
	l := netnsLink{ns: "kbt-h" + id, hostIP: fmt.Sprintf("10.72.%d.1", subnet), nsIP: fmt.Sprintf("10.72.%d.2", subnet)}
	vh, vc := "kbthh"+id, "kbthc"+id
	run(t, "ip", "netns", "add", l.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", l.ns).Run() })
	run(t, "ip", "link", "add", vh, "type", "veth", "peer", "name", vc)
	t.Cleanup(func() { exec.Command("ip", "link", "del", vh).Run() })
	run(t, "ip", "link", "set", vc, "netns", l.ns)
	run(t, "ip", "addr", "add", l.hostIP+"/24", "dev", vh)
	run(t, "ip", "link", "set", vh, "up")
	run(t, "ip", "-n", l.ns, "addr", "add", l.nsIP+"/24", "dev", vc)
	run(t, "ip", "-n", l.ns, "link", "set", vc, "up")
	run(t, "ip", "-n", l.ns, "link", "set", "lo", "up")
	return l
}

func (l netnsLink) curl(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("timeout", append([]string{"30", "ip", "netns", "exec", l.ns, "curl", "-sS"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestRealCurl(t *testing.T) {
	needRoot(t, "curl")
	l := newLink(t, 2)
	e := startHTTP(t, l.hostIP+":0", nil)
	dir := t.TempDir()
	base := e.base

	t.Run("never 3xx", func(t *testing.T) {
		for _, p := range []string{"//ipxe.efi", "/ipxe.efi/", "//env//vmlinuz", "/env/vmlinuz/", "//", "/images/",
			"//ipxe//52:54:00:00:00:01", "/ipxe/52:54:00:00:00:01/", "/./snp.efi", "/env/../undionly.kpxe"} {
			out, err := l.curl(t, dir, "--path-as-is", "-o", "/dev/null", "-w", "%{http_code}", base+p)
			if err != nil {
				t.Fatalf("%s: %v %s", p, err, out)
			}
			code, _ := strconv.Atoi(out)
			if code != 200 && code != 404 {
				t.Errorf("%s: %d, want 200 or 404", p, code)
			}
		}
		out, _ := l.curl(t, dir, "--path-as-is", "-o", "/dev/null", "-w", "%{http_code}", base+"//ipxe.efi")
		if out != "200" {
			t.Errorf("//ipxe.efi: %s", out)
		}
	})
	t.Run("full and range", func(t *testing.T) {
		if out, err := l.curl(t, dir, "-o", "ipxe.efi", base+"/ipxe.efi"); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		got, _ := os.ReadFile(filepath.Join(dir, "ipxe.efi"))
		if !bytes.Equal(got, ipxebin.Files["ipxe.efi"]) {
			t.Fatal("ipxe.efi mismatch")
		}
		out, err := l.curl(t, dir, "-r", "100-199", "-o", "part", "-w", "%{http_code}", base+"/env/vmlinuz")
		got, _ = os.ReadFile(filepath.Join(dir, "part"))
		if err != nil || out != "206" || !bytes.Equal(got, e.kernel[100:200]) {
			t.Fatalf("range: %v %s %d bytes", err, out, len(got))
		}
		// Resume a partial download (curl -C -), as an agent retry would.
		must(t, os.WriteFile(filepath.Join(dir, "resume"), e.kernel[:1000], 0o644))
		if out, err := l.curl(t, dir, "-C", "-", "-o", "resume", base+"/env/vmlinuz"); err != nil {
			t.Fatalf("resume: %v %s", err, out)
		}
		got, _ = os.ReadFile(filepath.Join(dir, "resume"))
		if !bytes.Equal(got, e.kernel) {
			t.Fatal("resumed kernel mismatch")
		}
		out, err = l.curl(t, dir, "-I", base+"/undionly.kpxe")
		if err != nil || !strings.Contains(out, fmt.Sprintf("Content-Length: %d", len(ipxebin.Files["undionly.kpxe"]))) ||
			!strings.Contains(out, "Etag: "+etagOf(ipxebin.Files["undionly.kpxe"])) {
			t.Fatalf("HEAD: %v\n%s", err, out)
		}
	})
	t.Run("script", func(t *testing.T) {
		out, err := l.curl(t, dir, base+"/ipxe/52:54:00:00:00:01")
		if err != nil || !strings.HasPrefix(out, "#!ipxe\n") || !strings.Contains(out, "kiln.machine=m-1") {
			t.Fatalf("%v\n%s", err, out)
		}
		out, _ = l.curl(t, dir, "-w", "%{http_code}", base+"/ipxe/52:54:00:00:00:02")
		if !strings.HasSuffix(out, "exit\n200") {
			t.Fatalf("local: %s", out)
		}
	})
}
