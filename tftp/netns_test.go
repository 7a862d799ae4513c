package tftp

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	ipxebin "github.com/tinkerbell/ipxedust/binary"

	"kiln/deploy/lab/testkit"
	"kiln/deploy/lab/testreq"
)

// This file's tests run real TFTP clients (atftp, tftp-hpa, curl) inside a
// network namespace "kbt-t*" joined to the host by a veth pair in 10.72.1.0/24
// (10.72.4.0/24 for the jumbo-frame link). The server runs in the test
// process on the host end of the veth.

// clientTimeout bounds one client run in the namespace.
const clientTimeout = 20 * time.Second

var (
	atftpOACK = regexp.MustCompile(`(?i)blksize[:= ]+(\d+)`)
	curlOACK  = regexp.MustCompile(`blksize.*?\(?(\d{3,5})\)?`)
)

func TestRealClients(t *testing.T) {
	testreq.Root(t, "network namespaces", "ip", "atftp", "tftp", "curl")
	l := testkit.NewLink(t, "kbt-t", netip.MustParsePrefix("10.72.1.0/24"), 1500)
	root := rootWithEscape(t)
	s, _ := startServer(t, Config{Root: root}, l.HostIP+":0")
	p := strconv.Itoa(port(s))
	dir := t.TempDir()
	want := ipxebin.Files["ipxe.efi"]
	check := func(t *testing.T, file string) {
		t.Helper()
		got, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: %d bytes, err %v; want %d bytes of ipxe.efi", file, len(got), err, len(want))
		}
	}

	t.Run("atftp blksize", func(t *testing.T) {
		for _, tc := range []struct{ ask, want string }{{"512", "512"}, {"1468", "1468"}, {"8192", "1468"}} {
			out, err := l.Exec(clientTimeout, dir, "atftp", "--trace", "--option", "blksize "+tc.ask, "--option", "tsize 0",
				"-g", "-r", "ipxe.efi", "-l", "atftp-"+tc.ask, l.HostIP, p)
			if err != nil {
				t.Fatalf("atftp blksize %s: %v\n%s", tc.ask, err, out)
			}
			m := atftpOACK.FindAllStringSubmatch(out, -1)
			if len(m) < 2 || m[len(m)-1][1] != tc.want {
				t.Fatalf("atftp blksize %s: negotiated %v, want %s\n%s", tc.ask, m, tc.want, out)
			}
			check(t, "atftp-"+tc.ask)
		}
	})
	t.Run("curl blksize", func(t *testing.T) {
		for _, tc := range []struct{ ask, want string }{{"512", "512"}, {"1468", "1468"}, {"8192", "1468"}} {
			out, err := l.Exec(clientTimeout, dir, "curl", "-sS", "-v", "--tftp-blksize", tc.ask, "-o", "curl-"+tc.ask,
				"tftp://"+l.HostIP+":"+p+"/ipxe.efi")
			if err != nil {
				t.Fatalf("curl blksize %s: %v\n%s", tc.ask, err, out)
			}
			if !strings.Contains(out, "blksize parsed from OACK ("+tc.want+")") {
				t.Fatalf("curl blksize %s: OACK not %s\n%s", tc.ask, tc.want, out)
			}
			check(t, "curl-"+tc.ask)
		}
	})
	t.Run("tftp-hpa plain", func(t *testing.T) {
		out, err := l.Exec(clientTimeout, dir, "tftp", "-m", "binary", l.HostIP, p, "-c", "get", "ipxe.efi", "hpa")
		if err != nil {
			t.Fatalf("tftp-hpa: %v\n%s", err, out)
		}
		check(t, "hpa")
	})
	t.Run("root file", func(t *testing.T) {
		out, err := l.Exec(clientTimeout, dir, "curl", "-sS", "tftp://"+l.HostIP+":"+p+"/sub/hello.txt")
		if err != nil || out != "hello from root\n" {
			t.Fatalf("curl root file: %v %q", err, out)
		}
	})
	t.Run("traversal refused", func(t *testing.T) {
		// curl exits 68 (CURLE_TFTP_NOTFOUND) on ERROR 1 and 69
		// (CURLE_TFTP_PERM) on ERROR 2; tftp-hpa prints code and text.
		for _, tc := range []struct {
			name, hpa string
			curl      int
		}{
			{"../secret", "Error code 2: access violation", 69},
			{"escape", "Error code 2: access violation", 69},
			{"sub/../../secret", "Error code 2: access violation", 69},
			{"/../secret", "Error code 2: access violation", 69},
			{"/etc/passwd", "Error code 1: file not found", 68}, // root-relative: <root>/etc/passwd
		} {
			name := tc.name
			dst := "trav-" + strings.NewReplacer("/", "_", ".", "_").Replace(name)
			outs := []string{}
			out, err := l.Exec(clientTimeout, dir, "atftp", "-g", "-r", name, "-l", dst+"-a", l.HostIP, p)
			outs = append(outs, out)
			if err == nil {
				t.Errorf("atftp %q: succeeded", name)
			}
			out, err = l.Exec(clientTimeout, dir, "curl", "-sS", "--path-as-is", "-o", dst+"-c", "tftp://"+l.HostIP+":"+p+"/"+name)
			outs = append(outs, out)
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != tc.curl {
				t.Errorf("curl %q: want exit %d, got %v", name, tc.curl, err)
			}
			out, _ = l.Exec(clientTimeout, dir, "tftp", "-m", "binary", l.HostIP, p, "-c", "get", name, dst+"-h")
			outs = append(outs, out)
			if strings.TrimSpace(out) != tc.hpa {
				t.Errorf("tftp-hpa %q: %q, want %q", name, out, tc.hpa)
			}
			for _, f := range []string{dst + "-a", dst + "-c", dst + "-h"} {
				if b, _ := os.ReadFile(filepath.Join(dir, f)); bytes.Contains(b, []byte("SECRET")) {
					t.Errorf("%s: secret leaked", f)
				}
			}
			t.Logf("%q: %q", name, outs)
		}
	})
	t.Run("WRQ refused", func(t *testing.T) {
		must(t, os.WriteFile(filepath.Join(dir, "up.bin"), []byte("data"), 0o644))
		if out, err := l.Exec(clientTimeout, dir, "atftp", "-p", "-l", "up.bin", "-r", "up-a.bin", l.HostIP, p); err == nil {
			t.Errorf("atftp put succeeded: %s", out)
		}
		if out, err := l.Exec(clientTimeout, dir, "curl", "-sS", "-T", "up.bin", "tftp://"+l.HostIP+":"+p+"/up-c.bin"); err == nil {
			t.Errorf("curl put succeeded: %s", out)
		}
		out, _ := l.Exec(clientTimeout, dir, "tftp", "-m", "binary", l.HostIP, p, "-c", "put", "up.bin", "up-h.bin")
		if !strings.Contains(strings.ToLower(out), "error") {
			t.Errorf("tftp-hpa put: no error: %q", out)
		}
		for _, f := range []string{"up-a.bin", "up-c.bin", "up-h.bin"} {
			if _, err := os.Stat(filepath.Join(root, f)); err == nil {
				t.Errorf("%s created in root", f)
			}
		}
	})
	t.Run("missing file fast", func(t *testing.T) {
		start := time.Now()
		_, err := l.Exec(clientTimeout, dir, "curl", "-sS", "-o", "x", "tftp://"+l.HostIP+":"+p+"/autoexec.ipxe")
		if err == nil {
			t.Fatal("missing file fetched")
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("missing file took %s", d)
		}
	})
}

// Large blocks need the opt-in and a link that carries them (MTU 9000 here).
func TestRealClientJumboOptIn(t *testing.T) {
	testreq.Root(t, "network namespaces", "ip", "atftp")
	l := testkit.NewLink(t, "kbt-t", netip.MustParsePrefix("10.72.4.0/24"), 9000)
	s, _ := startServer(t, Config{MaxBlockSize: 8192, AllowLargeBlocks: true}, l.HostIP+":0")
	dir := t.TempDir()
	out, err := l.Exec(clientTimeout, dir, "atftp", "--trace", "--option", "blksize 8192", "-g", "-r", "ipxe.efi", "-l", "j", l.HostIP, strconv.Itoa(port(s)))
	if err != nil {
		t.Fatalf("atftp: %v\n%s", err, out)
	}
	m := atftpOACK.FindAllStringSubmatch(out, -1)
	if len(m) < 2 || m[len(m)-1][1] != "8192" {
		t.Fatalf("negotiated %v, want 8192\n%s", m, out)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "j"))
	if !bytes.Equal(got, ipxebin.Files["ipxe.efi"]) {
		t.Fatal("content mismatch")
	}
}
