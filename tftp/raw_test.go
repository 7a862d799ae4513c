package tftp

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ipxebin "github.com/tinkerbell/ipxedust/binary"

	"kiln/deploy/lab/testkit"
)

// startServer runs a Server on a fresh UDP socket bound to bind ("127.0.0.1:0" etc.).
func startServer(t testing.TB, cfg Config, bind string) (*Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := New(cfg, reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ua, err := net.ResolveUDPAddr("udp", bind)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenUDP("udp", ua)
	if err != nil {
		t.Fatalf("listen %s: %v", bind, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() { done <- s.Serve(ctx, log, conn) }()
	for s.Addr() == nil {
		time.Sleep(time.Millisecond)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Serve did not return after cancel")
		}
		s.Close()
	})
	return s, reg
}

func port(s *Server) int { return s.Addr().(*net.UDPAddr).Port }

// rq builds an RRQ/WRQ with options in the given order.
func rq(op uint16, name, mode string, opts ...string) []byte {
	b := binary.BigEndian.AppendUint16(nil, op)
	b = append(b, name...)
	b = append(b, 0)
	b = append(b, mode...)
	b = append(b, 0)
	for _, o := range opts {
		b = append(b, o...)
		b = append(b, 0)
	}
	return b
}

type rawClient struct {
	t    testing.TB
	conn *net.UDPConn
	srv  *net.UDPAddr
	peer *net.UDPAddr // server's transfer TID, learned from the first reply
}

func newRaw(t testing.TB, srv *net.UDPAddr) *rawClient {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, conn: c, srv: srv}
}

func (c *rawClient) send(b []byte) {
	c.t.Helper()
	to := c.srv
	if c.peer != nil {
		to = c.peer
	}
	if _, err := c.conn.WriteToUDP(b, to); err != nil {
		c.t.Fatal(err)
	}
}

// recv returns the next packet and its source; fails the test after d.
func (c *rawClient) recv(d time.Duration) ([]byte, *net.UDPAddr) {
	c.t.Helper()
	buf := make([]byte, 70000)
	c.conn.SetReadDeadline(time.Now().Add(d))
	n, from, err := c.conn.ReadFromUDP(buf)
	if err != nil {
		c.t.Fatalf("no reply within %s: %v", d, err)
	}
	if c.peer == nil {
		c.peer = from
	}
	return buf[:n], from
}

func op(p []byte) uint16 { return binary.BigEndian.Uint16(p) }

func parseOACK(p []byte) map[string]string {
	m := map[string]string{}
	parts := bytes.Split(p[2:], []byte{0})
	for i := 0; i+1 < len(parts); i += 2 {
		m[strings.ToLower(string(parts[i]))] = string(parts[i+1])
	}
	return m
}

func ack(block uint16) []byte {
	return binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, opACK), block)
}

// fetch reads the rest of a transfer whose first reply was first.
func (c *rawClient) fetch(first []byte, blksize int) []byte {
	c.t.Helper()
	var out []byte
	p := first
	want := uint16(1)
	if op(p) == opOACK {
		c.send(ack(0))
		p, _ = c.recv(3 * time.Second)
	}
	for {
		if op(p) != opDATA {
			c.t.Fatalf("want DATA, got opcode %d %q", op(p), p)
		}
		blk := binary.BigEndian.Uint16(p[2:])
		if blk == want {
			out = append(out, p[4:]...)
			want++
		}
		c.send(ack(blk))
		if len(p)-4 < blksize {
			return out
		}
		p, _ = c.recv(3 * time.Second)
	}
}

func TestPlainRRQGetsDataNoOACK(t *testing.T) {
	s, reg := startServer(t, Config{}, "127.0.0.1:0")
	c := newRaw(t, s.Addr().(*net.UDPAddr))
	c.send(rq(opRRQ, "ipxe.efi", "octet"))
	p, _ := c.recv(2 * time.Second)
	if op(p) != opDATA || binary.BigEndian.Uint16(p[2:]) != 1 {
		t.Fatalf("plain RRQ: want DATA block 1, got opcode %d % x", op(p), p[:4])
	}
	if len(p) != 4+512 {
		t.Fatalf("plain RRQ block size = %d, want 512", len(p)-4)
	}
	got := c.fetch(p, 512)
	if !bytes.Equal(got, ipxebin.Files["ipxe.efi"]) {
		t.Fatalf("content mismatch: got %d bytes want %d", len(got), len(ipxebin.Files["ipxe.efi"]))
	}
	waitCounter(t, reg, "kiln_tftp_transfers_total", 1, "class", "ipxe", "result", "ok")
	waitCounter(t, reg, "kiln_tftp_sent_bytes_total", float64(len(got)), "class", "ipxe")
}

func TestOnlyRequestedOptionsAcknowledged(t *testing.T) {
	s, _ := startServer(t, Config{}, "127.0.0.1:0")
	size := strconv.Itoa(len(ipxebin.Files["undionly.kpxe"]))
	cases := []struct {
		name string
		opts []string
		want map[string]string
		blk  int
	}{
		{"tsize only", []string{"tsize", "0"}, map[string]string{"tsize": size}, 512},
		{"blksize only", []string{"blksize", "1468"}, map[string]string{"blksize": "1468"}, 1468},
		{"blksize 512", []string{"blksize", "512"}, map[string]string{"blksize": "512"}, 512},
		{"blksize clamped", []string{"blksize", "8192"}, map[string]string{"blksize": "1468"}, 1468},
		{"windowsize not offered", []string{"blksize", "1024", "windowsize", "4", "tsize", "0"},
			map[string]string{"blksize": "1024", "tsize": size}, 1024},
		{"unknown option ignored", []string{"timeout", "3", "multicast", ""}, nil, 512},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newRaw(t, s.Addr().(*net.UDPAddr))
			c.send(rq(opRRQ, "undionly.kpxe", "octet", tc.opts...))
			p, _ := c.recv(2 * time.Second)
			if tc.want == nil {
				if op(p) != opDATA || len(p)-4 != tc.blk {
					t.Fatalf("want DATA with %d bytes, got opcode %d len %d", tc.blk, op(p), len(p))
				}
			} else {
				if op(p) != opOACK {
					t.Fatalf("want OACK, got opcode %d", op(p))
				}
				got := parseOACK(p)
				if fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("OACK = %v, want %v", got, tc.want)
				}
			}
			data := c.fetch(p, tc.blk)
			if !bytes.Equal(data, ipxebin.Files["undionly.kpxe"]) {
				t.Fatalf("content mismatch (%d bytes)", len(data))
			}
		})
	}
}

func TestLargeBlocksOptIn(t *testing.T) {
	// Loopback's MTU (65536) does not clamp, so the configured cap decides.
	s, _ := startServer(t, Config{MaxBlockSize: 8192, AllowLargeBlocks: true}, "127.0.0.1:0")
	c := newRaw(t, s.Addr().(*net.UDPAddr))
	c.send(rq(opRRQ, "snp.efi", "octet", "blksize", "8192"))
	p, _ := c.recv(2 * time.Second)
	if op(p) != opOACK || parseOACK(p)["blksize"] != "8192" {
		t.Fatalf("want OACK blksize=8192, got %q", p)
	}
	if got := c.fetch(p, 8192); !bytes.Equal(got, ipxebin.Files["snp.efi"]) {
		t.Fatal("content mismatch")
	}
	if _, err := New(Config{MaxBlockSize: 8192}, nil); err == nil {
		t.Fatal("MaxBlockSize 8192 without AllowLargeBlocks accepted")
	}
}

// UEFI firmware sends tsize (+blksize), reads the size from the OACK, answers
// with ERROR 8 and then sends a fresh RRQ (RFC 2347 option negotiation abort).
func TestAbortedTsizeProbeThenFreshRRQ(t *testing.T) {
	s, reg := startServer(t, Config{}, "127.0.0.1:0")
	addr := s.Addr().(*net.UDPAddr)
	c := newRaw(t, addr)
	c.send(rq(opRRQ, "ipxe.efi", "octet", "tsize", "0", "blksize", "1468"))
	p, _ := c.recv(2 * time.Second)
	if op(p) != opOACK || parseOACK(p)["tsize"] != strconv.Itoa(len(ipxebin.Files["ipxe.efi"])) {
		t.Fatalf("probe: want OACK with tsize, got %q", p)
	}
	e := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, opERROR), 8)
	c.send(append(append(e, "abort"...), 0))

	c2 := newRaw(t, addr)
	c2.send(rq(opRRQ, "ipxe.efi", "octet", "blksize", "1468"))
	p, _ = c2.recv(2 * time.Second)
	if op(p) != opOACK {
		t.Fatalf("fresh RRQ: want OACK, got opcode %d", op(p))
	}
	if got := c2.fetch(p, 1468); !bytes.Equal(got, ipxebin.Files["ipxe.efi"]) {
		t.Fatal("content mismatch after aborted probe")
	}
	waitCounter(t, reg, "kiln_tftp_errors_total", 1, "class", "ipxe", "reason", "aborted")
}

func TestMissingFileImmediateError(t *testing.T) {
	s, reg := startServer(t, Config{Root: t.TempDir()}, "127.0.0.1:0")
	c := newRaw(t, s.Addr().(*net.UDPAddr))
	start := time.Now()
	c.send(rq(opRRQ, "autoexec.ipxe", "octet"))
	p, _ := c.recv(time.Second)
	if op(p) != opERROR {
		t.Fatalf("want ERROR, got opcode %d", op(p))
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("error took %s", d)
	}
	if string(p) != "\x00\x05\x00\x01file not found\x00" {
		t.Fatalf("want ERROR 1 \"file not found\", got %q", p)
	}
	waitCounter(t, reg, "kiln_tftp_errors_total", 1, "class", "other", "reason", "not_found")
}

// rootWithEscape builds a root holding a served file, an in-root symlink and
// a symlink to a secret outside the root.
func rootWithEscape(t testing.TB) (root string) {
	t.Helper()
	dir := t.TempDir()
	root = filepath.Join(dir, "root")
	must(t, os.MkdirAll(filepath.Join(root, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "sub", "hello.txt"), []byte("hello from root\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "secret"), []byte("SECRET\n"), 0o644))
	must(t, os.Symlink("../secret", filepath.Join(root, "escape")))
	must(t, os.Symlink(filepath.Join(dir, "secret"), filepath.Join(root, "abs-escape")))
	must(t, os.Symlink("sub/hello.txt", filepath.Join(root, "inside")))
	return root
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestHostilePathsAndWRQRefused(t *testing.T) {
	s, reg := startServer(t, Config{Root: rootWithEscape(t)}, "127.0.0.1:0")
	addr := s.Addr().(*net.UDPAddr)
	// Escapes and unclean names: ERROR 2 "access violation", byte for byte.
	for _, name := range []string{"../secret", "sub/../../secret", "/../secret", "//../secret", "sub\\hello.txt",
		"\\secret", "..\\secret", "escape", "abs-escape", "sub//hello.txt", "./sub/hello.txt", "/./sub/hello.txt",
		"sub/", "..", "/..", "/", "//", "sub/\x01"} {
		t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
			c := newRaw(t, addr)
			c.send(rq(opRRQ, name, "octet"))
			p, _ := c.recv(time.Second)
			if string(p) != "\x00\x05\x00\x02access violation\x00" {
				t.Fatalf("%q: want ERROR 2 \"access violation\", got %q", name, p)
			}
		})
	}
	// Root-relative names that name nothing, and a name that only looks
	// encoded (TFTP names are not URL-decoded): ERROR 1.
	for _, name := range []string{"/etc/passwd", "%2e%2e/secret", "%2e%2e%2fsecret", "sub/hello.txt/x"} {
		c := newRaw(t, addr)
		c.send(rq(opRRQ, name, "octet"))
		p, _ := c.recv(time.Second)
		if string(p) != "\x00\x05\x00\x01file not found\x00" {
			t.Fatalf("%q: want ERROR 1 \"file not found\", got %q", name, p)
		}
	}
	for _, name := range []string{"sub/hello.txt", "inside"} {
		c := newRaw(t, addr)
		c.send(rq(opRRQ, name, "octet"))
		p, _ := c.recv(time.Second)
		if op(p) != opDATA || string(c.fetch(p, 512)) != "hello from root\n" {
			t.Fatalf("%s: not served: %q", name, p)
		}
	}
	c := newRaw(t, addr)
	c.send(rq(opWRQ, "upload.bin", "octet"))
	p, _ := c.recv(time.Second)
	if string(p) != "\x00\x05\x00\x02access violation: read-only server\x00" {
		t.Fatalf("WRQ: want ERROR 2 \"access violation: read-only server\", got %q", p)
	}
	if _, err := os.Stat(filepath.Join(s.cfg.Root, "upload.bin")); err == nil {
		t.Fatal("WRQ created a file")
	}
	waitCounter(t, reg, "kiln_tftp_errors_total", 1, "class", "other", "reason", "write_refused")
}

// The reply must come from the address the RRQ was sent to, not the
// host's default source address: send to 127.0.0.2 on a wildcard socket.
func TestReplyFromRequestedAddress(t *testing.T) {
	s, _ := startServer(t, Config{}, "0.0.0.0:0")
	c := newRaw(t, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: port(s)})
	c.send(rq(opRRQ, "undionly.kpxe", "octet"))
	p, from := c.recv(2 * time.Second)
	if op(p) != opDATA {
		t.Fatalf("want DATA, got %d", op(p))
	}
	if !from.IP.Equal(net.IPv4(127, 0, 0, 2)) {
		t.Fatalf("reply came from %s, want 127.0.0.2", from.IP)
	}
	c.fetch(p, 512)
}

func TestConcurrentTransfersBounded(t *testing.T) {
	s, reg := startServer(t, Config{MaxTransfers: 2, Timeout: 200 * time.Millisecond, Retries: 2}, "127.0.0.1:0")
	addr := s.Addr().(*net.UDPAddr)
	// Two stalled transfers (DATA 1 never acknowledged) hold both slots.
	for i := 0; i < 2; i++ {
		c := newRaw(t, addr)
		c.send(rq(opRRQ, "ipxe.efi", "octet"))
		if p, _ := c.recv(time.Second); op(p) != opDATA {
			t.Fatalf("transfer %d: want DATA", i)
		}
	}
	c := newRaw(t, addr)
	c.send(rq(opRRQ, "ipxe.efi", "octet"))
	p, _ := c.recv(time.Second)
	if string(p) != "\x00\x05\x00\x00server busy\x00" {
		t.Fatalf("third transfer: want ERROR 0 \"server busy\", got %q", p)
	}
	waitCounter(t, reg, "kiln_tftp_errors_total", 1, "class", "other", "reason", "busy")
	// Once the stalled ones time out, a slot frees up.
	for i := 0; testkit.Sample(t, reg, "kiln_tftp_active_transfers") > 0; i++ {
		if i > 200 {
			t.Fatal("stalled transfers never timed out")
		}
		time.Sleep(20 * time.Millisecond)
	}
	c = newRaw(t, addr)
	c.send(rq(opRRQ, "undionly.kpxe", "octet"))
	p, _ = c.recv(time.Second)
	if op(p) != opDATA {
		t.Fatalf("after timeout: want DATA, got %q", p)
	}
	c.fetch(p, 512)
}

func TestParallelFetches(t *testing.T) {
	s, _ := startServer(t, Config{}, "127.0.0.1:0")
	addr := s.Addr().(*net.UDPAddr)
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newRaw(t, addr)
			c.send(rq(opRRQ, "undionly.kpxe", "octet", "blksize", "1468"))
			p, _ := c.recv(2 * time.Second)
			if got := c.fetch(p, 1468); !bytes.Equal(got, ipxebin.Files["undionly.kpxe"]) {
				t.Error("content mismatch")
			}
		}()
	}
	wg.Wait()
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{Addr: "nope"},
		{MaxBlockSize: 100},
		{MaxBlockSize: 70000, AllowLargeBlocks: true},
		{MaxTransfers: -1},
		{Timeout: time.Hour},
		{Retries: 100},
	}
	for _, c := range bad {
		if err := c.WithDefaults().Validate(); err == nil {
			t.Errorf("%+v: accepted", c)
		}
	}
	if err := (Config{}).WithDefaults().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if _, err := New(Config{Root: "/nonexistent/kiln"}, nil); err == nil {
		t.Fatal("missing root accepted")
	}
}

// waitCounter polls reg until the sample with labels reaches want.
func waitCounter(t testing.TB, reg *prometheus.Registry, name string, want float64, labels ...string) {
	t.Helper()
	var got float64
	for i := 0; i < 100; i++ {
		got = testkit.Sample(t, reg, name, labels...)
		if got >= want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s%v = %v, want >= %v", name, labels, got, want)
}
