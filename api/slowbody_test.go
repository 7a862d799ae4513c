package api_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	. "kiln/api"
	"kiln/appliance/lifecycle/lifecycletest"
	"kiln/store"
)

// Short body timeouts so that the slow-body tests run in seconds; the
// defaults (DefaultBodyIdleTimeout, DefaultJSONBodyTimeout) work the same.
const (
	testBodyIdle = 1 * time.Second
	testJSONBody = 1500 * time.Millisecond
)

// lockedBuf is a goroutine-safe log buffer.
type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// serveReal runs the API with Serve on a real 127.0.0.1 listener (the
// http.Server of production, not httptest's) and returns its address; the
// server logs (text, level info) into log when it is not nil.
func serveReal(t *testing.T, f Backend, log *lockedBuf) string {
	t.Helper()
	cfg := testConfig()
	cfg.BodyIdleTimeout, cfg.JSONBodyTimeout = testBodyIdle, testJSONBody
	logger := testLogger(t)
	if log != nil {
		logger = slog.New(slog.NewTextHandler(log, nil))
	}
	s, err := New(cfg, f, prometheus.NewRegistry(), logger)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// rawAnswer is what a raw TCP client got back.
type rawAnswer struct {
	status  int
	code    string        // error code of a JSON error body
	after   time.Duration // from the end of the request headers to the status line
	sent    int           // body bytes sent before the answer
	closed  bool          // the server closed the connection after the answer
	rawBody string
}

// trickle sends a request's headers (declaring Content-Length: declared),
// then body one byte every `every` (all at once when every is 0, nothing
// when body is ""), half-closing after the body when cut is set, and reads
// the answer. It never waits more than 20 s.
func trickle(t *testing.T, addr, method, path, token string, hdr []string, declared int, body string, every time.Duration, cut bool) rawAnswer {
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
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	type result struct {
		a   rawAnswer
		err error
	}
	got := make(chan result, 1)
	go func() {
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			got <- result{err: err}
			return
		}
		a := rawAnswer{status: res.StatusCode, after: time.Since(start)}
		rb, _ := io.ReadAll(res.Body)
		res.Body.Close()
		a.rawBody = string(rb)
		var eb ErrorBody
		if json.Unmarshal(rb, &eb) == nil {
			a.code = eb.Error.Code
		}
		// Closed after the answer? The next read ends at once with EOF.
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = br.ReadByte()
		a.closed = err == io.EOF
		got <- result{a: a}
	}()
	sent := 0
	for sent < len(body) {
		n := len(body)
		if every > 0 {
			select {
			case r := <-got:
				if r.err != nil {
					t.Fatalf("%s %s: %v", method, path, r.err)
				}
				r.a.sent = sent
				return r.a
			case <-time.After(every):
			}
			n = sent + 1
		}
		if _, err := io.WriteString(c, body[sent:n]); err != nil {
			break // the server closed the connection
		}
		sent = n
	}
	if cut {
		_ = c.(*net.TCPConn).CloseWrite()
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("%s %s: %v", method, path, r.err)
	}
	r.a.sent = sent
	return r.a
}

// TestSlowBodiesAreBounded: a body trickled one byte at a time no longer
// holds a connection (issue 20: one byte every 4 s held it for 80 s before
// any answer, even with an invalid token). A refused credential is answered
// at once without waiting for the body and the connection closed; a JSON
// body is cut at JSONBodyTimeout however steadily it trickles; any body is
// cut when it stalls for BodyIdleTimeout; an upload that keeps coming is
// not cut by the JSON bound.
func TestSlowBodiesAreBounded(t *testing.T) {
	d := lifecycletest.New(t)
	f := d.Backend()
	m := fixtureMachine(t, d.Store, "", "52:54:00:00:00:01", store.StateRegistered, nil)
	boot, err := d.Controller.BootFor(context.Background(), "52:54:00:00:00:01")
	if err != nil {
		t.Fatal(err)
	}
	agentTok := boot.Token
	var log lockedBuf
	addr := serveReal(t, f, &log)
	site := `{"name":"abcdefghij-abcdefghij"}`
	const atOnce = 500 * time.Millisecond // far below every timeout in play

	t.Run("refused credentials answered at once", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			path, token string
			hdr         []string
			status      int
			code        string
		}{
			{"/v1/sites", "bogus", nil, 401, CodeUnauthorized},
			{"/v1/sites", "", nil, 401, CodeUnauthorized},
			{"/v1/sites", viewerTok, nil, 403, CodeForbidden},
			{"/v1/agent/report", "bogus", []string{HeaderMachine, m.ID}, 403, CodeForbidden},
			{"/v1/agent/report", agentTok, nil, 400, CodeInvalid}, // no X-Kiln-Machine: cannot check the token
			{"/v1/images?name=a&version=1&sha256=" + strings.Repeat("a", 64), "bogus", nil, 401, CodeUnauthorized},
		} {
			// Headers only; the body never comes. 100 bytes is under the
			// 256 KiB net/http reads of an unread body before answering.
			for _, declared := range []int{100, 1 << 20} {
				a := trickle(t, addr, "POST", c.path, c.token, c.hdr, declared, "", 0, false)
				if a.status != c.status || a.code != c.code || a.after > atOnce || !a.closed {
					t.Errorf("POST %s token %q, %d-byte body: %d %s after %v (closed %v), want %d %s at once and closed",
						c.path, c.token, declared, a.status, a.code, a.after, a.closed, c.status, c.code)
				}
			}
		}
	})
	t.Run("stalled body cut at the idle timeout", func(t *testing.T) {
		t.Parallel()
		a := trickle(t, addr, "POST", "/v1/sites", adminTok, nil, len(site), site, 3*testBodyIdle, false)
		if a.status != http.StatusRequestTimeout || a.code != CodeBodyTimeout || a.after > testBodyIdle+atOnce || !a.closed {
			t.Fatalf("stalled: %d %s after %v (closed %v): %s", a.status, a.code, a.after, a.closed, a.rawBody)
		}
	})
	t.Run("trickled JSON body cut at the JSON bound", func(t *testing.T) {
		t.Parallel()
		// One byte every 250 ms never stalls for the idle timeout, but would
		// take 7 s for this body.
		a := trickle(t, addr, "POST", "/v1/sites", adminTok, nil, len(site), site, 250*time.Millisecond, false)
		if a.status != http.StatusRequestTimeout || a.code != CodeBodyTimeout || a.after > testJSONBody+atOnce || a.sent >= len(site) {
			t.Fatalf("trickled JSON: %d %s after %v, %d of %d bytes: %s", a.status, a.code, a.after, a.sent, len(site), a.rawBody)
		}
	})
	t.Run("upload that keeps coming is not cut", func(t *testing.T) {
		t.Parallel()
		data := "0123456789abc" // 13 bytes × 250 ms ≈ 3.3 s, past the JSON bound
		q := "/v1/images?name=slow&version=1&sha256=" + sha256hex(data)
		a := trickle(t, addr, "POST", q, adminTok, nil, len(data), data, 250*time.Millisecond, false)
		if a.status != http.StatusCreated || a.sent != len(data) || a.after < testJSONBody {
			t.Fatalf("slow upload: %d %s after %v, %d bytes: %s", a.status, a.code, a.after, a.sent, a.rawBody)
		}
	})
	t.Run("body cut off by the client", func(t *testing.T) {
		t.Parallel()
		for _, path := range []string{"/v1/sites", "/v1/images?name=cut&version=1&sha256=" + strings.Repeat("a", 64)} {
			a := trickle(t, addr, "POST", path, adminTok, nil, 1000, `{"name":"x`, 0, true)
			if a.status != http.StatusBadRequest || a.code != CodeBodyIncomplete || a.after > atOnce {
				t.Errorf("%s cut off: %d %s after %v: %s", path, a.status, a.code, a.after, a.rawBody)
			}
		}
		if ims, _ := f.ListImages(); len(ims) > 1 {
			t.Errorf("a cut-off upload was recorded: %+v", ims)
		}
		// The client's doing: an INFO line, not an ERROR (it was
		// `level=ERROR msg="request failed" ... unexpected EOF`).
		if l := log.String(); strings.Contains(l, "level=ERROR") || !strings.Contains(l, `level=INFO msg="request body not received"`) {
			t.Errorf("log:\n%s", l)
		}
	})
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestBodyDeadlineClearedAfterTheBody: once a body has arrived, its read
// deadline is gone: the connection is reused for the next request after
// longer than the idle timeout (a deadline left behind would have the
// server's background read cancel the request or drop the connection).
func TestBodyDeadlineClearedAfterTheBody(t *testing.T) {
	addr := serveReal(t, realBackend(t), nil)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	send := func(method, path, body string) int {
		t.Helper()
		fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s",
			method, path, adminTok, len(body), body)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	if code := send("POST", "/v1/sites", `{"name":"one"}`); code != 201 {
		t.Fatalf("first: %d", code)
	}
	time.Sleep(testBodyIdle + 500*time.Millisecond)
	if code := send("POST", "/v1/sites", `{"name":"two"}`); code != 201 {
		t.Fatalf("second on the same connection: %d", code)
	}
	if code := send("GET", "/v1/sites", ""); code != 200 {
		t.Fatalf("third: %d", code)
	}
}
