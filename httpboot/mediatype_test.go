package httpboot

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"kiln/deploy/lab/testreq"
)

// rawExchange sends one literal HTTP/1.1 request and returns the status
// code and the response's header lines exactly as received.
func rawExchange(t testing.TB, addr, req string) (int, []string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	must(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Write([]byte(req))
	must(t, err)
	br := bufio.NewReader(c)
	status, err := br.ReadString('\n')
	must(t, err)
	f := strings.Fields(status)
	if len(f) < 2 {
		t.Fatalf("status line %q", status)
	}
	code, err := strconv.Atoi(f[1])
	must(t, err)
	var lines []string
	for {
		l, err := br.ReadString('\n')
		must(t, err)
		if l == "\r\n" {
			return code, lines
		}
		lines = append(lines, strings.TrimSuffix(l, "\r\n"))
	}
}

func header(lines []string, name string) (string, bool) {
	for _, l := range lines {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, name) {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// TestContentTypesAndNoEmptyHeaders (issue 20 item 5): every boot file is
// served with the media type UEFI HTTP boot expects (application/efi for
// .efi; vnd.efi-iso and vnd.efi-img for images; octet-stream for kernel,
// initramfs and the BIOS binary; text/plain for the script), on GET, HEAD
// and Range requests; and no response of any route carries a header whose
// value is empty (checked on the raw bytes).
func TestContentTypesAndNoEmptyHeaders(t *testing.T) {
	e := startHTTP(t, "127.0.0.1:0", func(c *Config) { c.AllowUpload = true })
	addr := strings.TrimPrefix(e.base, "http://")
	for _, n := range []string{"disk.img", "BOOT.ISO", "os.raw.gz", "tool.efi", "ubuntu.qcow2"} {
		b := bytes.Repeat([]byte(n), 100)
		s := sha256.Sum256(b)
		if _, err := e.srv.Catalog().Upload(context.Background(), n, bytes.NewReader(b), hex.EncodeToString(s[:]), int64(len(b))); err != nil {
			t.Fatal(err)
		}
	}
	types := map[string]string{
		"/ipxe.efi":               "application/efi",
		"/snp.efi":                "application/efi",
		"/undionly.kpxe":          "application/octet-stream",
		"/env/vmlinuz":            "application/octet-stream",
		"/env/initramfs":          "application/octet-stream",
		"/images/disk.img":        "application/vnd.efi-img",
		"/images/BOOT.ISO":        "application/vnd.efi-iso",
		"/images/tool.efi":        "application/efi",
		"/images/os.raw.gz":       "application/octet-stream",
		"/images/ubuntu.qcow2":    "application/octet-stream",
		"/ipxe/52:54:00:00:00:01": "text/plain; charset=utf-8",
	}
	for p, want := range types {
		for _, req := range []string{
			"GET " + p + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
			"HEAD " + p + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
			"GET " + p + " HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\nConnection: close\r\n\r\n",
		} {
			code, lines := rawExchange(t, addr, req)
			if code != 200 && code != 206 {
				t.Fatalf("%q: status %d", req, code)
			}
			if got, _ := header(lines, "Content-Type"); got != want {
				t.Errorf("%s %s: Content-Type %q, want %q", strings.Fields(req)[0], p, got, want)
			}
		}
	}
	// Every route, including errors, conditional and upload answers: no
	// header line may have an empty value.
	etag := etagOf(e.kernel)
	img := []byte("an uploaded image")
	sum := sha256.Sum256(img)
	reqs := []string{
		"GET /nope.efi HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /images/nope.img HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /env/other HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /ipxe/not-a-mac HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /env/vmlinuz HTTP/1.1\r\nHost: x\r\nIf-None-Match: " + etag + "\r\n\r\n",
		"GET /env/vmlinuz HTTP/1.1\r\nHost: x\r\nRange: bytes=99999999-\r\n\r\n",
		"GET /env/vmlinuz HTTP/1.1\r\nHost: x\r\nRange: bytes=0-1,5-6\r\n\r\n",
		"PUT /images/new.img HTTP/1.1\r\nHost: x\r\nX-Image-SHA256: " + hex.EncodeToString(sum[:]) +
			"\r\nContent-Length: " + strconv.Itoa(len(img)) + "\r\n\r\n" + string(img),
		"PUT /images/bad.img HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",
		"POST /ipxe.efi HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
	}
	for p := range types {
		reqs = append(reqs, "GET "+p+" HTTP/1.1\r\nHost: x\r\n\r\n", "HEAD "+p+" HTTP/1.1\r\nHost: x\r\n\r\n")
	}
	for _, req := range reqs {
		req = strings.Replace(req, "\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1)
		code, lines := rawExchange(t, addr, req)
		for _, l := range lines {
			k, v, ok := strings.Cut(l, ":")
			if !ok || strings.TrimSpace(v) == "" {
				t.Errorf("%q → %d: header line %q has no value", strings.SplitN(req, "\r\n", 2)[0], code, l)
			}
			if strings.EqualFold(k, "ETag") && !strings.HasPrefix(strings.TrimSpace(v), `"`) {
				t.Errorf("%q: ETag %q", req, v)
			}
		}
	}
}

// TestCurlSeesEFIContentType: the probe with the real client,
// `curl -sI http://.../ipxe.efi`.
func TestCurlSeesEFIContentType(t *testing.T) {
	testreq.Commands(t, "curl")
	e := startHTTP(t, "127.0.0.1:0", nil)
	for p, want := range map[string]string{"/ipxe.efi": "application/efi", "/snp.efi": "application/efi",
		"/undionly.kpxe": "application/octet-stream", "/env/vmlinuz": "application/octet-stream"} {
		out, err := exec.Command("curl", "-sI", "--max-time", "5", e.base+p).CombinedOutput()
		if err != nil {
			t.Fatalf("curl -sI %s: %v %s", p, err, out)
		}
		line := ""
		for _, l := range strings.Split(string(out), "\r\n") {
			if strings.HasPrefix(strings.ToLower(l), "content-type:") {
				line = l
			}
		}
		if line != "Content-Type: "+want {
			t.Fatalf("curl -sI %s: %q, want %q", p, line, "Content-Type: "+want)
		}
		t.Log(fmt.Sprintf("curl -sI %s → %s", p, line))
	}
}

func TestMediaTypeTable(t *testing.T) {
	for name, want := range map[string]string{
		"ipxe.efi": MediaTypeEFI, "BOOTX64.EFI": MediaTypeEFI, "x.iso": MediaTypeEFIISO, "x.Img": MediaTypeEFIImg,
		"vmlinuz": MediaTypeOctets, "initramfs": MediaTypeOctets, "undionly.kpxe": MediaTypeOctets,
		"os.img.gz": MediaTypeOctets, "efi": MediaTypeOctets, "": MediaTypeOctets, ".efi": MediaTypeEFI,
	} {
		if got := MediaType(name); got != want {
			t.Errorf("MediaType(%q) = %q, want %q", name, got, want)
		}
	}
}
