package httpboot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ipxebin "github.com/tinkerbell/ipxedust/binary"

	"kiln/deploy/lab/testkit"
)

// mapBackend is a real in-memory Backend (the appliance's adapter over the
// store is the production one); err, when set, is returned for every MAC.
type mapBackend struct {
	mu    sync.Mutex
	boots map[string]Boot
	err   error
}

func (b *mapBackend) BootFor(_ context.Context, mac net.HardwareAddr) (Boot, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return Boot{}, b.err
	}
	bt, ok := b.boots[mac.String()]
	if !ok {
		return Boot{}, fmt.Errorf("mac %s: %w", mac, ErrUnknownMachine)
	}
	return bt, nil
}

type testEnv struct {
	srv     *Server
	reg     *prometheus.Registry
	base    string
	backend *mapBackend
	envDir  string
	kernel  []byte
}

// startHTTP runs a Server on bind ("127.0.0.1:0" or a netns veth address).
func startHTTP(t testing.TB, bind string, mutate func(*Config)) *testEnv {
	t.Helper()
	dir := t.TempDir()
	envDir := filepath.Join(dir, "env")
	must(t, os.MkdirAll(envDir, 0o755))
	kernel := bytes.Repeat([]byte("KERNEL-0123456789"), 40000) // ~680 KB
	must(t, os.WriteFile(filepath.Join(envDir, EnvKernel), kernel, 0o644))
	must(t, os.WriteFile(filepath.Join(envDir, EnvInitramfs), []byte("initramfs-bytes"), 0o644))
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	cfg := Config{BaseURL: base, AgentURL: "http://10.72.2.1:9090", EnvDir: envDir, ImageDir: filepath.Join(dir, "images"),
		KernelArgs: []string{"console=ttyS0"}}
	if mutate != nil {
		mutate(&cfg)
	}
	be := &mapBackend{boots: map[string]Boot{
		"52:54:00:00:00:01": {Action: ActionAgent, MachineID: "m-1", Token: "tok1", Hostname: "node-1"},
		"52:54:00:00:00:02": {Action: ActionLocal, Hostname: "node-2"},
		"52:54:00:00:00:03": {Action: ActionAgent, MachineID: "m-3", Token: "tok ${evil}"},
	}}
	reg := prometheus.NewRegistry()
	s, err := New(cfg, be, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.Serve(ctx, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})), ln)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return &testEnv{srv: s, reg: reg, base: base, backend: be, envDir: envDir, kernel: kernel}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// noRedirect is a client that reports 3xx instead of following it.
var noRedirect = &http.Client{
	Timeout:       30 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

func do(t testing.TB, method, url string, hdr map[string]string, body io.Reader) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	must(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := noRedirect.Do(req)
	must(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	return resp, b
}

func etagOf(b []byte) string {
	s := sha256.Sum256(b)
	return `"` + hex.EncodeToString(s[:]) + `"`
}

func TestNoRedirectsEver(t *testing.T) {
	e := startHTTP(t, "127.0.0.1:0", nil)
	// Raw request lines so that no client cleans the path first.
	for _, p := range []string{"//ipxe.efi", "/ipxe.efi/", "//env//vmlinuz", "/env/vmlinuz/", "/./ipxe.efi",
		"/env/../ipxe.efi", "//", "/", "/images/", "/images//x", "/ipxe/52:54:00:00:00:01/", "//ipxe//52:54:00:00:00:02",
		"/images", "/env", "/ipxe", "/../../etc/passwd", "/env/%2e%2e/ipxe.efi", "/images/..%2fenv"} {
		code := rawGet(t, strings.TrimPrefix(e.base, "http://"), p)
		if code >= 300 && code < 400 {
			t.Errorf("%s: status %d (redirect)", p, code)
		}
		if code != 200 && code != 404 && code != 400 {
			t.Errorf("%s: status %d", p, code)
		}
	}
	if c := rawGet(t, strings.TrimPrefix(e.base, "http://"), "//ipxe.efi"); c != 200 {
		t.Errorf("//ipxe.efi: %d, want 200", c)
	}
}

// rawGet sends a literal request line and returns the status code.
func rawGet(t testing.TB, addr, path string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	must(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "HEAD %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path)
	var proto string
	var code int
	if _, err := fmt.Fscanf(c, "%s %d", &proto, &code); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return code
}

func TestFilesRangeETagHead(t *testing.T) {
	e := startHTTP(t, "127.0.0.1:0", nil)
	files := map[string][]byte{
		"/ipxe.efi": ipxebin.Files["ipxe.efi"], "/snp.efi": ipxebin.Files["snp.efi"],
		"/undionly.kpxe": ipxebin.Files["undionly.kpxe"], "/env/vmlinuz": e.kernel, "/env/initramfs": []byte("initramfs-bytes"),
	}
	for p, want := range files {
		resp, b := do(t, "GET", e.base+p, nil, nil)
		if resp.StatusCode != 200 || !bytes.Equal(b, want) {
			t.Fatalf("%s: %d, %d bytes", p, resp.StatusCode, len(b))
		}
		if resp.Header.Get("ETag") != etagOf(want) {
			t.Errorf("%s: ETag %s, want %s", p, resp.Header.Get("ETag"), etagOf(want))
		}
		if resp.ContentLength != int64(len(want)) {
			t.Errorf("%s: Content-Length %d", p, resp.ContentLength)
		}
		resp, b = do(t, "GET", e.base+p, map[string]string{"Range": "bytes=5-9"}, nil)
		if resp.StatusCode != 206 || !bytes.Equal(b, want[5:10]) ||
			resp.Header.Get("Content-Range") != fmt.Sprintf("bytes 5-9/%d", len(want)) {
			t.Errorf("%s Range: %d %q %q", p, resp.StatusCode, b, resp.Header.Get("Content-Range"))
		}
		resp, b = do(t, "HEAD", e.base+p, nil, nil)
		if resp.StatusCode != 200 || len(b) != 0 || resp.ContentLength != int64(len(want)) {
			t.Errorf("%s HEAD: %d len %d body %d", p, resp.StatusCode, resp.ContentLength, len(b))
		}
		resp, _ = do(t, "GET", e.base+p, map[string]string{"If-None-Match": etagOf(want)}, nil)
		if resp.StatusCode != http.StatusNotModified {
			t.Errorf("%s If-None-Match: %d", p, resp.StatusCode)
		}
	}
	// The ETag follows content changes (cache keyed by size+mtime).
	newK := []byte("a different kernel")
	must(t, os.WriteFile(filepath.Join(e.envDir, EnvKernel), newK, 0o644))
	later := time.Now().Add(2 * time.Second)
	must(t, os.Chtimes(filepath.Join(e.envDir, EnvKernel), later, later))
	resp, b := do(t, "GET", e.base+"/env/vmlinuz", nil, nil)
	if !bytes.Equal(b, newK) || resp.Header.Get("ETag") != etagOf(newK) {
		t.Fatalf("after change: ETag %s body %q", resp.Header.Get("ETag"), b)
	}
	for _, p := range []string{"/env/other", "/images/nope", "/images/.meta", "/nope.efi"} {
		if resp, _ := do(t, "GET", e.base+p, nil, nil); resp.StatusCode != 404 {
			t.Errorf("%s: %d, want 404", p, resp.StatusCode)
		}
	}
	if v := testkit.Sample(t, e.reg, "kiln_httpboot_sent_bytes_total", "class", "ipxe"); v < float64(len(ipxebin.Files["ipxe.efi"])) {
		t.Errorf("ipxe bytes metric %v", v)
	}
	if v := testkit.Sample(t, e.reg, "kiln_httpboot_errors_total", "class", "env", "reason", "not_found"); v != 1 {
		t.Errorf("env not_found metric %v", v)
	}
}

func TestScriptRoutes(t *testing.T) {
	e := startHTTP(t, "127.0.0.1:0", nil)
	get := func(mac string) (int, string) {
		resp, b := do(t, "GET", e.base+"/ipxe/"+mac, nil, nil)
		return resp.StatusCode, string(b)
	}
	code, s := get("52:54:00:00:00:01")
	if code != 200 || !strings.Contains(s, "kiln.machine=m-1 kiln.token=tok1 console=ttyS0") ||
		!strings.Contains(s, e.base+"/env/vmlinuz") || !strings.Contains(s, e.base+"/env/initramfs") {
		t.Fatalf("agent: %d\n%s", code, s)
	}
	// Other MAC spellings name the same machine.
	if _, s2 := get("52-54-00-00-00-01"); s2 != s {
		t.Fatalf("hyphen MAC differs:\n%s", s2)
	}
	if code, s = get("52:54:00:00:00:02"); code != 200 || !strings.HasSuffix(s, "\nexit 1\n") {
		t.Fatalf("local: %d\n%s", code, s)
	}
	if code, s = get("52:54:00:00:00:03"); code != 200 || !strings.HasSuffix(s, "\nexit 1\n") || strings.Contains(s, "evil") {
		t.Fatalf("unsafe token: %d\n%s", code, s)
	}
	if code, s = get("52:54:00:00:00:99"); code != 200 || !strings.HasSuffix(s, "\nexit 1\n") {
		t.Fatalf("unknown (exit policy): %d\n%s", code, s)
	}
	if code, _ = get("not-a-mac"); code != 400 {
		t.Fatalf("bad mac: %d", code)
	}
	// Group (broadcast, multicast) and all-zero addresses name no NIC: 400,
	// and the backend (which would record a discovered machine) is not asked.
	for _, mac := range []string{"ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01", "33:33:00:00:00:01", "00:00:00:00:00:00", "53:54:00:00:00:01"} {
		if code, _ = get(mac); code != 400 {
			t.Errorf("group or zero mac %s: %d, want 400", mac, code)
		}
	}
	e.backend.mu.Lock()
	e.backend.err = errors.New("store unavailable")
	e.backend.mu.Unlock()
	if code, s = get("52:54:00:00:00:01"); code != 200 || !strings.Contains(s, "chain --replace --autofree "+e.base+"/ipxe/52:54:00:00:00:01") {
		t.Fatalf("backend error: %d\n%s", code, s)
	}
	if v := testkit.Sample(t, e.reg, "kiln_httpboot_errors_total", "class", "script", "reason", "unsafe_value"); v != 1 {
		t.Errorf("unsafe_value metric %v", v)
	}
	backendErrs := testkit.Sample(t, e.reg, "kiln_httpboot_errors_total", "class", "script", "reason", "backend")
	// A held boot (ErrRetryLater) gets the same wait-and-refetch script, but is
	// not a backend error.
	e.backend.mu.Lock()
	e.backend.err = fmt.Errorf("%w: agent still running", ErrRetryLater)
	e.backend.mu.Unlock()
	if code, s = get("52:54:00:00:00:01"); code != 200 || !strings.Contains(s, "sleep 10") ||
		!strings.Contains(s, "chain --replace --autofree "+e.base+"/ipxe/52:54:00:00:00:01") || strings.Contains(s, "kernel ") {
		t.Fatalf("held boot: %d\n%s", code, s)
	}
	if v := testkit.Sample(t, e.reg, "kiln_httpboot_errors_total", "class", "script", "reason", "backend"); v != backendErrs {
		t.Errorf("a held boot was counted as a backend error (%v → %v)", backendErrs, v)
	}

	d := startHTTP(t, "127.0.0.1:0", func(c *Config) { c.UnknownPolicy = PolicyDiscover })
	resp, b := do(t, "GET", d.base+"/ipxe/52:54:00:00:00:99", nil, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "kernel ") || strings.Contains(string(b), "kiln.machine") {
		t.Fatalf("discover: %d\n%s", resp.StatusCode, b)
	}
}

func TestUploadRoute(t *testing.T) {
	e := startHTTP(t, "127.0.0.1:0", func(c *Config) { c.AllowUpload = true })
	img := bytes.Repeat([]byte{1, 2, 3, 4}, 300000)
	sum := sha256.Sum256(img)
	resp, b := do(t, "PUT", e.base+"/images/os-1.raw", map[string]string{HeaderImageSHA256: hex.EncodeToString(sum[:])}, bytes.NewReader(img))
	if resp.StatusCode != 201 {
		t.Fatalf("upload: %d %s", resp.StatusCode, b)
	}
	// The HTTP route always needs the digest header.
	if resp, b := do(t, "PUT", e.base+"/images/os-3.raw", nil, bytes.NewReader(img)); resp.StatusCode != 400 {
		t.Fatalf("upload without %s: %d %s", HeaderImageSHA256, resp.StatusCode, b)
	}
	resp, b = do(t, "PUT", e.base+"/images/os-2.raw", map[string]string{HeaderImageSHA256: strings.Repeat("0", 64)}, bytes.NewReader(img))
	if resp.StatusCode != 422 {
		t.Fatalf("bad digest upload: %d %s", resp.StatusCode, b)
	}
	resp, b = do(t, "GET", e.base+"/images/os-1.raw", map[string]string{"Range": "bytes=-4"}, nil)
	if resp.StatusCode != 206 || !bytes.Equal(b, img[len(img)-4:]) || resp.Header.Get("ETag") != etagOf(img) {
		t.Fatalf("image range: %d %v %s", resp.StatusCode, b, resp.Header.Get("ETag"))
	}
	if resp, _ = do(t, "GET", e.base+"/images/os-2.raw", nil, nil); resp.StatusCode != 404 {
		t.Fatalf("rejected upload visible: %d", resp.StatusCode)
	}
	// Without AllowUpload, PUT is not routed, and its body is refused unread.
	n := startHTTP(t, "127.0.0.1:0", nil)
	if resp, _ = do(t, "PUT", n.base+"/images/x", map[string]string{HeaderImageSHA256: hex.EncodeToString(sum[:])}, bytes.NewReader(img)); resp.StatusCode != 413 {
		t.Fatalf("PUT without AllowUpload: %d", resp.StatusCode)
	}
	if resp, _ = do(t, "PUT", n.base+"/images/x", nil, nil); resp.StatusCode != 405 {
		t.Fatalf("PUT without AllowUpload, no body: %d", resp.StatusCode)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{BaseURL: "http://10.0.0.1:8080", AgentURL: "https://kiln.site:9443"}
	if err := ok.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, mut := range []func(*Config){
		func(c *Config) { c.BaseURL = "" },
		func(c *Config) { c.BaseURL = "http://10.0.0.1/" },
		func(c *Config) { c.BaseURL = "http://10.0.0.1/${x}" },
		func(c *Config) { c.AgentURL = "ftp://x" },
		func(c *Config) { c.UnknownPolicy = "maybe" },
		func(c *Config) { c.KernelArgs = []string{"a b"} },
		func(c *Config) { c.KernelArgs = []string{"kiln.token=x"} },
		func(c *Config) { c.FetchRetries = -1 },
		func(c *Config) { c.Addr = "bad" },
	} {
		c := ok
		mut(&c)
		if err := c.WithDefaults().Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v accepted (%v)", c, err)
		}
	}
	if _, err := New(ok, nil, nil); !errors.Is(err, ErrConfig) {
		t.Errorf("nil backend: %v", err)
	}
}
