package httpboot

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"kiln/deploy/lab/testkit"
)

// A client that closes its connection the moment it has read the last byte
// (no keep-alive, as a firmware HTTP client or the fleet simulator's iPXE
// does) got the whole file: the transfer counts ok, never aborted, however
// quickly the close races the end of the handler. A client that hangs up in
// the middle of a large file counts aborted.
func TestCompleteTransferThenCloseIsNotAborted(t *testing.T) {
	e := startHTTP(t, "127.0.0.1:0", nil)
	big := make([]byte, 32<<20)
	must(t, os.WriteFile(filepath.Join(e.envDir, EnvInitramfs), big, 0o644))
	addr := e.base[len("http://"):]
	get := func(path, extra string, readBody bool) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n%s\r\n", path, extra)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		if readBody {
			n, err := io.Copy(io.Discard, resp.Body)
			if err != nil || n != resp.ContentLength {
				t.Fatalf("GET %s: %d of %d bytes: %v", path, n, resp.ContentLength, err)
			}
		}
		// close at once (deferred), with nothing else read
	}
	const rounds = 300
	for i := 0; i < rounds; i++ {
		get("/env/vmlinuz", "Range: bytes=0-65535\r\n", true)
	}
	get("/env/initramfs", "", false) // hang up after the headers: 32 MiB cannot all be in socket buffers
	deadline := time.Now().Add(5 * time.Second)
	for testkit.Sample(t, e.reg, "kiln_httpboot_transfers_total", "class", "env") < rounds+1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if ok := testkit.Sample(t, e.reg, "kiln_httpboot_transfers_total", "class", "env", "result", "ok"); ok != rounds {
		t.Errorf("complete transfers counted ok: %v, want %d", ok, rounds)
	}
	if ab := testkit.Sample(t, e.reg, "kiln_httpboot_errors_total", "class", "env", "reason", "aborted"); ab != 1 {
		t.Errorf("transfers counted aborted: %v, want 1 (the hang-up mid-file)", ab)
	}
}
