package httpboot

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestBodiesRefusedAtOnce: no boot endpoint reads a request body, so one
// that carries a body is answered 413 at once, without reading it, and the
// connection is closed (issue 20: a body trickled one byte every 4 s held a
// boot-port connection for 80 s before the 405). A raw TCP client sends the
// headers and then nothing.
func TestBodiesRefusedAtOnce(t *testing.T) {
	e := startHTTP(t, "127.0.0.1:0", nil)
	addr := strings.TrimPrefix(e.base, "http://")
	for _, c := range []struct{ method, path, framing string }{
		{"POST", "/ipxe/52:54:00:00:00:01", "Content-Length: 100"},
		{"GET", "/ipxe/52:54:00:00:00:01", "Content-Length: 20"},
		{"GET", "/env/vmlinuz", "Content-Length: 5"},
		{"POST", "/images/x", "Transfer-Encoding: chunked"},
		{"PUT", "/images/x", "Content-Length: 1048576"},
		{"POST", "/nothing/here", "Content-Length: 10"},
	} {
		conn, err := net.Dial("tcp", addr)
		must(t, err)
		_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
		start := time.Now()
		fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: kiln\r\n%s\r\n\r\n", c.method, c.path, c.framing)
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s %s (%s): %v", c.method, c.path, c.framing, err)
		}
		took := time.Since(start)
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, rerr := br.ReadByte()
		conn.Close()
		if res.StatusCode != http.StatusRequestEntityTooLarge || took > 500*time.Millisecond || rerr != io.EOF {
			t.Errorf("%s %s (%s): %d after %v, then %v; want 413 at once and the connection closed",
				c.method, c.path, c.framing, res.StatusCode, took, rerr)
		}
	}
	// Requests without a body are served as before, on a kept-alive connection.
	for i := 0; i < 2; i++ {
		if resp, _ := do(t, "GET", e.base+"/ipxe/52:54:00:00:00:01", nil, nil); resp.StatusCode != 200 {
			t.Fatalf("GET script: %d", resp.StatusCode)
		}
	}
}
