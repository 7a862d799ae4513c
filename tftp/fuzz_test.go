package tftp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzCleanName: an accepted name is the requested one without its leading
// slashes, and is local (filepath.IsLocal: no "..", not absolute), clean, and
// free of NUL, backslash and control bytes; a name with a ".." element is
// always refused.
func FuzzCleanName(f *testing.F) {
	for _, s := range []string{"ipxe.efi", "a/b/c", "../x", "/etc/passwd", "/undionly.kpxe", "//x", "/../x", "/",
		"a\\b", "a\x00b", "a//b", "./a", "a/", "..", ".", "a/../b", "\x7f", "pxelinux.cfg/01-aa-bb", "a/.../b",
		"%2e%2e/x", "/./a", strings.Repeat("a", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, err := CleanName(name)
		hasParent := false
		for _, el := range strings.Split(name, "/") {
			hasParent = hasParent || el == ".."
		}
		if err != nil {
			if !errors.Is(err, ErrBadPath) {
				t.Fatalf("%q: error %v does not wrap ErrBadPath", name, err)
			}
			return
		}
		if hasParent {
			t.Fatalf("accepted parent element in %q", name)
		}
		if got != strings.TrimLeft(name, "/") || got == "" || len(name) > MaxNameLen || !filepath.IsLocal(got) ||
			strings.ContainsAny(got, "\\\x00") || path.Clean(got) != got {
			t.Fatalf("CleanName(%q) = %q: not the local clean form", name, got)
		}
		for i := 0; i < len(got); i++ {
			if got[i] < 0x20 || got[i] == 0x7f {
				t.Fatalf("accepted control byte in %q", name)
			}
		}
	})
}

// FuzzRRQ: parseRequest never panics, and an accepted request is at most
// MaxRequestLen octets, re-encodes to exactly the packet it came from, has
// mode netascii or octet (any case) and complete options with distinct
// non-empty names; when its name is also accepted by CleanName, that name
// stays inside a root directory (filepath.IsLocal).
func FuzzRRQ(f *testing.F) {
	for _, p := range [][]byte{
		rq(opRRQ, "undionly.kpxe", "../../etc/passwd", "octet", ""), // issue 20: mode field is a path
		[]byte("\x00\x01undionly.kpxe\x00../../etc/passwd\x00octet\x00"),
		rq(opRRQ, "undionly.kpxe", "octet"),
		rq(opRRQ, "/undionly.kpxe", "netascii"),
		rq(opRRQ, "//x", "OCTET", "BLKSIZE", "1468", "tsize", "0"),
		rq(opRRQ, "x", "mail"),
		rq(opRRQ, "x", "octet", "blksize"),
		rq(opRRQ, "x", "octet", "", "1468"),
		rq(opRRQ, "x", "octet", "blksize", "1468", "BlkSize", "512"),
		[]byte("\x00\x01x\x00octet"),
		[]byte("\x00\x01x\x00octet\x00blksize\x001468"),
		rq(opRRQ, "x", "octet", "o", strings.Repeat("v", 600)),
		rq(opWRQ, "x", "octet"),
		{0, 1}, {0, 1, 0}, {0, 1, 0, 0}, {0, 3, 0, 1}, {0, 5, 0, 0, 0}, {},
	} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, pkt []byte) {
		r, err := parseRequest(pkt)
		if err != nil {
			if !errors.Is(err, ErrIllegalOp) {
				t.Fatalf("%q: error %v does not wrap ErrIllegalOp", pkt, err)
			}
			return
		}
		if len(pkt) > MaxRequestLen || (r.op != opRRQ && r.op != opWRQ) {
			t.Fatalf("accepted %q (op %d, %d octets)", pkt, r.op, len(pkt))
		}
		if m := strings.ToLower(r.mode); m != ModeNetascii && m != ModeOctet {
			t.Fatalf("accepted mode %q in %q", r.mode, pkt)
		}
		if !bytes.Equal(r.encode(), pkt) {
			t.Fatalf("%q parsed to %+v, which encodes to %q", pkt, r, r.encode())
		}
		seen := map[string]bool{}
		for _, o := range r.options {
			k := strings.ToLower(o.name)
			if k == "" || seen[k] {
				t.Fatalf("accepted empty or repeated option %q in %q", o.name, pkt)
			}
			seen[k] = true
		}
		if name, err := CleanName(r.filename); err == nil && !filepath.IsLocal(name) {
			t.Fatalf("name %q from %q resolves outside the root as %q", r.filename, pkt, name)
		}
	})
}

// FuzzRequest sends arbitrary datagrams to a live server (parseRequest,
// CleanName and the transfer start) and checks that it never crashes, never
// serves a file outside the root, answers DATA only to a request parseRequest
// accepts with mode netascii or octet, and still serves a good request.
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
		[]byte("\x00\x01undionly.kpxe\x00../../etc/passwd\x00octet\x00"),
		rq(opRRQ, "/sub/hello.txt", "octet"), rq(opRRQ, "/../secret", "octet"), rq(opRRQ, "//escape", "octet"),
		rq(opRRQ, "sub/hello.txt", "mail"), rq(opRRQ, "sub/hello.txt", "octet", "", "1"),
		rq(opRRQ, "sub/hello.txt", "NetAscii", "TSIZE", "0"),
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
				if _, err := parseRequest(pkt); err != nil {
					t.Fatalf("DATA sent for a request parseRequest refuses (%v): %q", err, pkt)
				}
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
