package tftp

import (
	"bytes"
	"encoding/binary"
	"net"
	"path"
	"strings"
	"testing"
	"time"
)

// FuzzCleanName: an accepted name is relative, clean, has no "..", NUL,
// backslash or control byte, and is returned unchanged.
func FuzzCleanName(f *testing.F) {
	for _, s := range []string{"ipxe.efi", "a/b/c", "../x", "/etc/passwd", "a\\b", "a\x00b", "a//b",
		"./a", "a/", "..", ".", "a/../b", "\x7f", "pxelinux.cfg/01-aa-bb", "a/.../b", strings.Repeat("a", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, err := CleanName(name)
		if err != nil {
			return
		}
		if got != name || name == "" || len(name) > MaxNameLen || strings.HasPrefix(name, "/") ||
			strings.ContainsAny(name, "\\\x00") || path.Clean(name) != name {
			t.Fatalf("accepted unsafe %q", name)
		}
		for _, el := range strings.Split(name, "/") {
			if el == ".." {
				t.Fatalf("accepted parent element in %q", name)
			}
		}
		for i := 0; i < len(name); i++ {
			if name[i] < 0x20 || name[i] == 0x7f {
				t.Fatalf("accepted control byte in %q", name)
			}
		}
	})
}

// FuzzRequest sends arbitrary datagrams to a live server (the pin/tftp
// request parser plus Kiln's name handling) and checks that it never crashes,
// never serves a file outside the root, and still serves a good request.
func FuzzRequest(f *testing.F) {
	for _, p := range [][]byte{
		rq(opRRQ, "ipxe.efi", "octet"),
		rq(opRRQ, "../secret", "octet"),
		rq(opRRQ, "escape", "octet", "blksize", "1468"),
		rq(opRRQ, "sub/hello.txt", "netascii", "tsize", "0", "blksize", "99999"),
		rq(opRRQ, "sub/hello.txt", "octet", "blksize"),
		rq(opWRQ, "x", "octet"),
		{0, 1}, {0, 1, 0}, {0, 1, 0, 0}, {0, 2, 'a', 0}, {0, 6, 0, 0, 0, 0}, {0, 4, 0, 1}, {0, 5, 0, 1, 0}, {},
		rq(opRRQ, "sub/hello.txt\x00\x00\x00", "octet", "blksize", "-1", "tsize", "x"),
	} {
		f.Add(p)
	}
	s, _ := startServer(f, Config{Root: rootWithEscape(f), Timeout: 50 * time.Millisecond, Retries: 1}, "127.0.0.1:0")
	addr := s.Addr().(*net.UDPAddr)
	f.Fuzz(func(t *testing.T, pkt []byte) {
		c := newRaw(t, addr)
		c.send(pkt)
		c.conn.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		buf := make([]byte, 70000)
		for {
			n, _, err := c.conn.ReadFromUDP(buf)
			if err != nil {
				break
			}
			if bytes.Contains(buf[:n], []byte("SECRET")) {
				t.Fatalf("served outside root for %q", pkt)
			}
			if n >= 4 && binary.BigEndian.Uint16(buf) == opDATA {
				break // a real file; do not drive the transfer
			}
		}
		g := newRaw(t, addr)
		g.send(rq(opRRQ, "sub/hello.txt", "octet"))
		p, _ := g.recv(2 * time.Second)
		if op(p) != opDATA || string(g.fetch(p, 512)) != "hello from root\n" {
			t.Fatalf("server unhealthy after %q: %q", pkt, p)
		}
	})
}
