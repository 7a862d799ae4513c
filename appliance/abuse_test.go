package appliance

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Tests of issue 20's break-it findings on the API, against the whole
// appliance (real store, lifecycle, catalog and both listeners on loopback),
// as `kiln serve` runs it with the embedded default configuration.

// rawExchange sends a request's headers with Content-Length: declared, then
// the first `send` bytes of body, then (with halfClose) ends its side of
// the connection, and reads the answer. It returns the status, the error
// code of the body, the time from the headers to the answer and whether the
// server closed the connection after it.
func rawExchange(t *testing.T, addr, method, path, token string, hdr []string, declared int, body string, halfClose bool) (int, string, time.Duration, bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: kiln\r\nContent-Length: %d\r\n", method, path, declared)
	if token != "" {
		fmt.Fprintf(&b, "Authorization: Bearer %s\r\n", token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	b.WriteString("\r\n")
	start := time.Now()
	if _, err := io.WriteString(c, b.String()+body); err != nil {
		t.Fatal(err)
	}
	if halfClose {
		_ = c.(*net.TCPConn).CloseWrite()
	}
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s %s: no answer: %v", method, path, err)
	}
	took := time.Since(start)
	rb, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var eb struct{ Error struct{ Code string } }
	_ = json.Unmarshal(rb, &eb)
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, rerr := br.ReadByte()
	return res.StatusCode, eb.Error.Code, took, rerr == io.EOF
}

// TestSlowBodiesBothListeners: on the API listener and on the boot listener
// (agent routes and httpboot's), a request whose body never comes is
// answered at once when refused, and cut at the configured body timeout
// when accepted; before, a body trickled one byte every 4 s held the
// connection 80 s on either port, invalid token or not.
func TestSlowBodiesBothListeners(t *testing.T) {
	const idle, jsonTotal = 700 * time.Millisecond, time.Second
	n := startNode(t, DefaultNodeID, nil, func(c *Config) {
		c.API.BodyIdleTimeout, c.API.JSONBodyTimeout = idle, jsonTotal
	})
	n.waitReady(t)
	api, boot := n.cfg.API.Addr, n.cfg.Boot.HTTPAddr
	const atOnce = 500 * time.Millisecond
	for _, c := range []struct {
		name, addr, method, path, token string
		hdr                             []string
		status                          int
		code                            string
		within                          time.Duration
	}{
		{"API, invalid token", api, "POST", "/v1/sites", "bogus", nil, 401, "unauthorized", atOnce},
		{"API, invalid token, upload", api, "POST", "/v1/images?name=x&version=1&sha256=" + strings.Repeat("a", 64), "bogus", nil, 401, "unauthorized", atOnce},
		{"API, admin, body never comes", api, "POST", "/v1/sites", n.token, nil, 408, "body_timeout", idle + atOnce},
		{"boot, agent route, invalid token", boot, "POST", "/v1/agent/report", "bogus", []string{"X-Kiln-Machine", "m-1"}, 403, "forbidden", atOnce},
		{"boot, agent route, no machine header", boot, "POST", "/v1/agent/register", "bogus", nil, 400, "invalid", atOnce},
		{"boot, iPXE script with a body", boot, "POST", "/ipxe/52:54:00:00:00:01", "", nil, 413, "", atOnce},
		{"boot, image with a body", boot, "GET", "/images/x", "", nil, 413, "", atOnce},
	} {
		status, code, took, closed := rawExchange(t, c.addr, c.method, c.path, c.token, c.hdr, 100, "", false)
		if status != c.status || code != c.code || took > c.within || !closed {
			t.Errorf("%s: %d %q after %v (closed %v), want %d %q within %v and closed",
				c.name, status, code, took, closed, c.status, c.code, c.within)
		}
	}
}

// TestCutOffUploadIsTheClientsError: an upload the client cuts off (it
// declared 1 MiB, sent 64 KiB and closed its side) is 400 body_incomplete,
// not 500 internal, and leaves nothing: no image record, no catalog file,
// no temporary file.
func TestCutOffUploadIsTheClientsError(t *testing.T) {
	n := startNode(t, DefaultNodeID, nil)
	n.waitReady(t)
	q := url.Values{"name": {"cut.raw"}, "version": {"1"}, "sha256": {strings.Repeat("a", 64)}}
	status, code, _, _ := rawExchange(t, n.cfg.API.Addr, "POST", "/v1/images?"+q.Encode(), n.token, nil,
		1<<20, strings.Repeat("x", 64<<10), true)
	if status != http.StatusBadRequest || code != "body_incomplete" {
		t.Fatalf("cut-off upload: %d %q, want 400 body_incomplete", status, code)
	}
	imgDir := n.cfg.Boot.ImageDir
	for _, dir := range []string{imgDir, filepath.Join(imgDir, ".tmp"), filepath.Join(imgDir, ".meta")} {
		des, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, de := range des {
			if !de.IsDir() {
				t.Errorf("left behind: %s", filepath.Join(dir, de.Name()))
			}
		}
	}
	code2, body := httpDo(t, n.token, "GET", "http://"+n.cfg.API.Addr+"/v1/images", "", nil)
	if code2 != 200 || !strings.Contains(string(body), `"items":[]`) {
		t.Fatalf("images after a cut-off upload: %d %s", code2, body)
	}
}
