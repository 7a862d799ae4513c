package tftp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ipxebin "github.com/tinkerbell/ipxedust/binary"

	"kiln/deploy/lab/testreq"
)

// Issue 20 items 2-4: every request here is sent as raw bytes and every
// ERROR answer is compared byte for byte (opcode, code, text, NUL).

const (
	wantIllegal  = "\x00\x05\x00\x04illegal TFTP operation\x00"
	wantAccess   = "\x00\x05\x00\x02access violation\x00"
	wantNotFound = "\x00\x05\x00\x01file not found\x00"
	wantTimedOut = "\x00\x05\x00\x00timed out\x00"
	wantUnkTID   = "\x00\x05\x00\x05unknown transfer ID\x00"
)

// noReply fails if anything arrives on c within d.
func (c *rawClient) noReply(d time.Duration) {
	c.t.Helper()
	buf := make([]byte, 70000)
	c.conn.SetReadDeadline(time.Now().Add(d))
	if n, from, err := c.conn.ReadFromUDP(buf); err == nil {
		c.t.Fatalf("unexpected packet from %s: %q", from, buf[:min(n, 64)])
	}
}

func dataBlock(p []byte) (uint16, int) {
	if op(p) != opDATA {
		return 0, -1
	}
	return binary.BigEndian.Uint16(p[2:]), len(p) - 4
}

// TestRequestGrammar: RFC 1350 modes and the RFC 2347 option list. A
// request whose mode is not netascii/octet (the obsolete "mail" included),
// that is not NUL-terminated, has an option without a value, an empty or
// repeated option name, or is longer than 512 octets gets ERROR 4 and no
// data; a packet on port 69 that is not a request gets ERROR 4 too, except
// DATA and ACK (ERROR 5: port 69 is every transfer's port in pin/tftp's
// single-port mode, so they name a transfer that does not exist), an ERROR
// (never answered) and a packet too short to have an opcode.
func TestRequestGrammar(t *testing.T) {
	s, reg := startServer(t, Config{}, "127.0.0.1:0")
	addr := s.Addr().(*net.UDPAddr)
	refused := []struct{ label, pkt string }{
		{"issue 20: mode field is a path", "\x00\x01undionly.kpxe\x00../../etc/passwd\x00octet\x00"},
		{"mail mode", "\x00\x01undionly.kpxe\x00mail\x00"},
		{"MAIL mode", "\x00\x01undionly.kpxe\x00MAIL\x00"},
		{"binary is a client alias, not a mode", "\x00\x01undionly.kpxe\x00binary\x00"},
		{"empty mode", "\x00\x01undionly.kpxe\x00\x00"},
		{"NUL inside the name leaves an empty mode", "\x00\x01undionly.kpxe\x00\x00octet\x00"},
		{"no mode", "\x00\x01undionly.kpxe\x00"},
		{"mode not NUL-terminated", "\x00\x01undionly.kpxe\x00octet"},
		{"option without value", "\x00\x01undionly.kpxe\x00octet\x00blksize\x00"},
		{"option value not NUL-terminated", "\x00\x01undionly.kpxe\x00octet\x00blksize\x001468"},
		{"trailing NUL after the mode", "\x00\x01undionly.kpxe\x00octet\x00\x00"},
		{"empty option name", "\x00\x01undionly.kpxe\x00octet\x00\x001468\x00"},
		{"option given twice", "\x00\x01undionly.kpxe\x00octet\x00blksize\x001468\x00BLKSIZE\x00512\x00"},
		{"request over 512 octets", string(rq(opRRQ, "undionly.kpxe", "octet", "x-pad", strings.Repeat("p", 512)))},
		{"only an opcode", "\x00\x01"},
		{"OACK on the server port", "\x00\x06blksize\x00512\x00"},
		{"unknown opcode", "\x00\x09x\x00octet\x00"},
		{"WRQ with a bad mode", "\x00\x02x\x00mail\x00"},
	}
	for _, tc := range refused {
		t.Run(tc.label, func(t *testing.T) {
			c := newRaw(t, addr)
			c.send([]byte(tc.pkt))
			p, _ := c.recv(time.Second)
			if string(p) != wantIllegal {
				t.Fatalf("RRQ %q → %q, want ERROR 4 %q", tc.pkt, p, wantIllegal)
			}
			c.noReply(100 * time.Millisecond) // and nothing else: no DATA
		})
	}
	for _, pkt := range []string{"", "\x00", "\x00\x05\x00\x00bye\x00", "\x00\x05\x00\x08abort\x00"} {
		c := newRaw(t, addr)
		c.send([]byte(pkt))
		c.noReply(200 * time.Millisecond)
	}
	waitCounter(t, reg, "kiln_tftp_errors_total", float64(len(refused)), "class", "other", "reason", "illegal")
	for _, pkt := range []string{"\x00\x03\x00\x01data", "\x00\x04\x00\x00"} { // DATA, ACK
		c := newRaw(t, addr)
		c.send([]byte(pkt))
		if p, _ := c.recv(time.Second); string(p) != wantUnkTID {
			t.Fatalf("%q on the server port → %q, want ERROR 5 %q", pkt, p, wantUnkTID)
		}
		c.noReply(100 * time.Millisecond)
	}
	waitCounter(t, reg, "kiln_tftp_errors_total", 2, "class", "other", "reason", "unknown_tid")

	// Accepted: mode and option names in any letter case (RFC 1350 §5,
	// RFC 2347: "case insensitive"); the OACK names options in lower case
	// (pin/tftp builds it from the canonical request the gate hands it).
	want := ipxebin.Files["undionly.kpxe"]
	for _, tc := range []struct {
		label, pkt, first string
		blk               int
	}{
		{"octet", "\x00\x01undionly.kpxe\x00octet\x00", "DATA", 512},
		{"OcTeT", "\x00\x01undionly.kpxe\x00OcTeT\x00", "DATA", 512},
		{"BLKSIZE upper case", "\x00\x01undionly.kpxe\x00OCTET\x00BLKSIZE\x001468\x00", "\x00\x06blksize\x001468\x00", 1468},
		{"unknown option ignored", "\x00\x01undionly.kpxe\x00octet\x00timeout\x003\x00", "DATA", 512},
		{"blksize out of range ignored", "\x00\x01undionly.kpxe\x00octet\x00blksize\x0099999\x00", "DATA", 512},
		{"blksize not a number ignored", "\x00\x01undionly.kpxe\x00octet\x00blksize\x00+1468\x00", "DATA", 512},
		{"tsize answered", "\x00\x01undionly.kpxe\x00octet\x00tsize\x000\x00", "\x00\x06tsize\x00" + strconv.Itoa(len(want)) + "\x00", 512},
	} {
		t.Run(tc.label, func(t *testing.T) {
			c := newRaw(t, addr)
			c.send([]byte(tc.pkt))
			p, _ := c.recv(time.Second)
			if tc.first == "DATA" {
				if b, n := dataBlock(p); b != 1 || n != tc.blk {
					t.Fatalf("%q → %q, want DATA block 1 of %d", tc.pkt, p[:min(len(p), 16)], tc.blk)
				}
			} else if string(p) != tc.first {
				t.Fatalf("%q → %q, want %q", tc.pkt, p, tc.first)
			}
			if got := c.fetch(p, tc.blk); !bytes.Equal(got, want) {
				t.Fatalf("content: %d bytes, want %d", len(got), len(want))
			}
		})
	}
}

// TestNetasciiMode: netascii (RFC 1350 via RFC 764) sends LF as CR LF and a
// bare CR as CR NUL; tsize is not answered in netascii mode (the octets sent
// are not the file's size). octet sends the bytes as they are.
func TestNetasciiMode(t *testing.T) {
	root := t.TempDir()
	text := "line1\nline2\r\nbare\rend"
	must(t, os.WriteFile(filepath.Join(root, "text.txt"), []byte(text), 0o644))
	s, _ := startServer(t, Config{Root: root}, "127.0.0.1:0")
	addr := s.Addr().(*net.UDPAddr)

	c := newRaw(t, addr)
	c.send(rq(opRRQ, "text.txt", "netascii"))
	p, _ := c.recv(time.Second)
	if got, want := string(c.fetch(p, 512)), "line1\r\nline2\r\x00\r\nbare\r\x00end"; got != want {
		t.Fatalf("netascii: got %q, want %q", got, want)
	}
	c = newRaw(t, addr)
	c.send(rq(opRRQ, "text.txt", "NetAscii", "tsize", "0", "blksize", "1024"))
	p, _ = c.recv(time.Second)
	if string(p) != "\x00\x06blksize\x001024\x00" {
		t.Fatalf("netascii with tsize: first reply %q, want OACK with blksize only", p)
	}
	c.fetch(p, 1024)
	c = newRaw(t, addr)
	c.send(rq(opRRQ, "text.txt", "octet"))
	p, _ = c.recv(time.Second)
	if got := string(c.fetch(p, 512)); got != text {
		t.Fatalf("octet: got %q", got)
	}
}

// TestLeadingSlash: "/name" and "//name" are the root-relative "name"
// (iPXE and several firmwares send the slash); escapes stay ERROR 2.
func TestLeadingSlash(t *testing.T) {
	s, reg := startServer(t, Config{Root: rootWithEscape(t)}, "127.0.0.1:0")
	addr := s.Addr().(*net.UDPAddr)
	for name, want := range map[string][]byte{
		"/undionly.kpxe": ipxebin.Files["undionly.kpxe"], "//undionly.kpxe": ipxebin.Files["undionly.kpxe"],
		"///ipxe.efi": ipxebin.Files["ipxe.efi"], "/sub/hello.txt": []byte("hello from root\n"),
		"//sub/hello.txt": []byte("hello from root\n"), "/inside": []byte("hello from root\n"),
	} {
		c := newRaw(t, addr)
		c.send(rq(opRRQ, name, "octet", "blksize", "1468"))
		p, _ := c.recv(time.Second)
		if string(p) != "\x00\x06blksize\x001468\x00" {
			t.Fatalf("%q: first reply %q, want OACK blksize=1468", name, p)
		}
		if got := c.fetch(p, 1468); !bytes.Equal(got, want) {
			t.Fatalf("%q: %d bytes, want %d", name, len(got), len(want))
		}
	}
	for _, name := range []string{"/../secret", "//../secret", "/sub/../../secret", "/escape", "/abs-escape", "/sub\\..\\..\\secret", "/"} {
		c := newRaw(t, addr)
		c.send(rq(opRRQ, name, "octet"))
		if p, _ := c.recv(time.Second); string(p) != wantAccess {
			t.Fatalf("%q → %q, want %q", name, p, wantAccess)
		}
	}
	waitCounter(t, reg, "kiln_tftp_transfers_total", 3, "class", "other", "result", "ok")
}

// TestRealClientsLeadingSlash runs tftp-hpa and atftp on loopback: the
// exact command of issue 20, `tftp -c get /undionly.kpxe` (tftp-hpa's
// default mode is netascii, so this also checks that netascii round-trips
// a binary file), and the refusals as each client prints them.
func TestRealClientsLeadingSlash(t *testing.T) {
	testreq.Commands(t, "tftp", "atftp", "timeout")
	s, _ := startServer(t, Config{Root: rootWithEscape(t)}, "127.0.0.1:0")
	port := strconv.Itoa(port(s))
	want := ipxebin.Files["undionly.kpxe"]
	runIn := func(dir, name string, args ...string) string {
		cmd := exec.Command("timeout", append([]string{"20", name}, args...)...)
		cmd.Dir = dir
		out, _ := cmd.CombinedOutput()
		return string(out)
	}
	for _, tc := range []struct {
		label string
		cmd   []string
		file  string
	}{
		{"tftp -c get /undionly.kpxe", []string{"tftp", "127.0.0.1", port, "-c", "get", "/undionly.kpxe"}, "undionly.kpxe"},
		{"tftp -m binary -c get /undionly.kpxe", []string{"tftp", "-m", "binary", "127.0.0.1", port, "-c", "get", "/undionly.kpxe"}, "undionly.kpxe"},
		{"tftp -c get //undionly.kpxe x", []string{"tftp", "127.0.0.1", port, "-c", "get", "//undionly.kpxe", "x"}, "x"},
		{"atftp -g -r /undionly.kpxe", []string{"atftp", "-g", "-r", "/undionly.kpxe", "-l", "a", "127.0.0.1", port}, "a"},
	} {
		dir := t.TempDir()
		out := runIn(dir, tc.cmd[0], tc.cmd[1:]...)
		got, err := os.ReadFile(filepath.Join(dir, tc.file))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: %d bytes (err %v), want %d; output %q", tc.label, len(got), err, len(want), out)
		}
		t.Logf("%s → %d bytes, identical to undionly.kpxe; output %q", tc.label, len(got), out)
	}
	dir := t.TempDir()
	for _, tc := range []struct{ label, want string }{
		{"get /../secret", "Error code 2: access violation"},
		{"get /nope.bin", "Error code 1: file not found"},
		{"put", "Error code 2: access violation: read-only server"},
	} {
		args := []string{"127.0.0.1", port, "-c"}
		if tc.label == "put" {
			must(t, os.WriteFile(filepath.Join(dir, "up.bin"), []byte("x"), 0o644))
			args = append(args, "put", "up.bin")
		} else {
			args = append(args, strings.Fields(tc.label)...)
		}
		out := strings.TrimSpace(runIn(dir, "tftp", args...))
		if out != tc.want {
			t.Fatalf("tftp %s: %q, want %q", tc.label, out, tc.want)
		}
		t.Logf("tftp -c %s → %q", tc.label, out)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "secret")); bytes.Contains(b, []byte("SECRET")) {
		t.Fatal("secret leaked")
	}
}

// TestTimeoutSendsFixedError: a client that stops acknowledging gets
// 1 + Retries sends of the packet, then ERROR 0 "timed out" — never the
// socket error text — whether it stopped after the RRQ, the OACK or a block.
func TestTimeoutSendsFixedError(t *testing.T) {
	s, reg := startServer(t, Config{Timeout: 100 * time.Millisecond, Retries: 2}, "127.0.0.1:0")
	addr := s.Addr().(*net.UDPAddr)
	collect := func(c *rawClient) []string {
		var seen []string
		buf := make([]byte, 70000)
		for {
			c.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, _, err := c.conn.ReadFromUDP(buf)
			if err != nil {
				t.Fatalf("after %q: nothing more: %v", seen, err)
			}
			p := buf[:n]
			if op(p) == opERROR {
				return append(seen, string(p))
			}
			b, l := dataBlock(p)
			seen = append(seen, fmt.Sprintf("op %d block %d len %d", op(p), b, l))
		}
	}
	for _, tc := range []struct {
		label string
		pkt   []byte
		acks  int // ACKs sent before going silent (0: none; OACK answered with ACK 0)
		want  string
	}{
		{"after the RRQ", rq(opRRQ, "ipxe.efi", "octet"), 0, "op 3 block 1 len 512"},
		{"after the OACK", rq(opRRQ, "ipxe.efi", "octet", "blksize", "1024"), 0, "op 6 block 0 len -1"},
		{"after block 2", rq(opRRQ, "ipxe.efi", "octet"), 2, "op 3 block 3 len 512"},
	} {
		t.Run(tc.label, func(t *testing.T) {
			c := newRaw(t, addr)
			c.send(tc.pkt)
			for i := 1; i <= tc.acks; i++ {
				p, _ := c.recv(time.Second)
				if b, _ := dataBlock(p); b != uint16(i) {
					t.Fatalf("want DATA %d, got %q", i, p[:4])
				}
				c.send(ack(uint16(i)))
			}
			seen := collect(c)
			wantSeen := []string{tc.want, tc.want, tc.want, wantTimedOut}
			if fmt.Sprint(seen) != fmt.Sprint(wantSeen) {
				t.Fatalf("got %q, want %q", seen, wantSeen)
			}
			t.Logf("RRQ %q, silent %s → %q", tc.pkt, tc.label, seen)
			c.noReply(300 * time.Millisecond)
		})
	}
	waitCounter(t, reg, "kiln_tftp_errors_total", 3, "class", "ipxe", "reason", "timeout")
}

// TestUnknownTID: a packet to a transfer's port from another port gets
// ERROR 5 (RFC 1350 §4) and the transfer goes on; the client's own ERROR
// ends the transfer without an answer.
func TestUnknownTIDAndClientError(t *testing.T) {
	s, reg := startServer(t, Config{Timeout: 300 * time.Millisecond, Retries: 1}, "127.0.0.1:0")
	addr := s.Addr().(*net.UDPAddr)
	c := newRaw(t, addr)
	c.send(rq(opRRQ, "undionly.kpxe", "octet"))
	p, tid := c.recv(time.Second)
	stray := newRaw(t, tid)
	stray.send(ack(1))
	if q, from := stray.recv(time.Second); string(q) != wantUnkTID || from.Port != tid.Port {
		t.Fatalf("stray ACK → %q from %s, want %q from %s", q, from, wantUnkTID, tid)
	}
	if got := c.fetch(p, 512); !bytes.Equal(got, ipxebin.Files["undionly.kpxe"]) {
		t.Fatal("transfer did not survive the stray packet")
	}

	c = newRaw(t, addr)
	c.send(rq(opRRQ, "undionly.kpxe", "octet"))
	c.recv(time.Second)
	c.send([]byte("\x00\x05\x00\x00disk full\x00"))
	c.noReply(800 * time.Millisecond) // longer than Timeout × (Retries+1): no resend, no ERROR back
	waitCounter(t, reg, "kiln_tftp_errors_total", 1, "class", "ipxe", "reason", "aborted")
}

// TestDuplicateACKNoResend: a duplicate ACK must not trigger a resend
// (the Sorcerer's Apprentice bug, RFC 1123 §4.2.3.1).
func TestDuplicateACKNoResend(t *testing.T) {
	s, _ := startServer(t, Config{Timeout: 2 * time.Second}, "127.0.0.1:0")
	c := newRaw(t, s.Addr().(*net.UDPAddr))
	c.send(rq(opRRQ, "undionly.kpxe", "octet"))
	c.recv(time.Second)
	c.send(ack(1))
	if p, _ := c.recv(time.Second); op(p) != opDATA || binary.BigEndian.Uint16(p[2:]) != 2 {
		t.Fatalf("want DATA 2, got %q", p[:4])
	}
	c.send(ack(1)) // duplicate
	c.noReply(500 * time.Millisecond)
	c.send(ack(2))
	p, _ := c.recv(time.Second)
	if op(p) != opDATA || binary.BigEndian.Uint16(p[2:]) != 3 {
		t.Fatalf("want DATA 3, got %q", p[:4])
	}
	c.fetch(p, 512)
}

// TestBlockNumberWraps: a file of more than 65535 blocks is sent with the
// block number wrapping from 65535 to 0 (as tftp-hpa and iPXE expect).
func TestBlockNumberWraps(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: sends 65,537 blocks")
	}
	root := t.TempDir()
	content := bytes.Repeat([]byte("0123456789abcdef"), (65536*512+16)/16)
	must(t, os.WriteFile(filepath.Join(root, "big.img"), content, 0o644))
	s, _ := startServer(t, Config{Root: root}, "127.0.0.1:0")
	c := newRaw(t, s.Addr().(*net.UDPAddr))
	c.send(rq(opRRQ, "big.img", "octet"))
	var got []byte
	var blocks []uint16
	for {
		p, _ := c.recv(3 * time.Second)
		b, n := dataBlock(p)
		if n < 0 {
			t.Fatalf("want DATA, got %q", p)
		}
		if len(blocks) == 0 || blocks[len(blocks)-1] != b {
			blocks = append(blocks, b)
			got = append(got, p[4:]...)
		}
		c.send(ack(b))
		if n < 512 {
			break
		}
	}
	if len(blocks) != 65537 || blocks[65534] != 65535 || blocks[65535] != 0 || blocks[65536] != 1 {
		t.Fatalf("%d blocks, last three %v", len(blocks), blocks[max(0, len(blocks)-3):])
	}
	if !bytes.Equal(got, content) {
		t.Fatalf("content: %d bytes, want %d", len(got), len(content))
	}
}

// TestDualStackReplyFromRequestedAddress: on a dual-stack socket ("[::]")
// an IPv4 request is answered from the address it was sent to.
func TestDualStackReplyFromRequestedAddress(t *testing.T) {
	s, _ := startServer(t, Config{}, "[::]:0")
	c := newRaw(t, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: port(s)})
	c.send(rq(opRRQ, "undionly.kpxe", "octet", "blksize", "1468"))
	p, from := c.recv(2 * time.Second)
	if !from.IP.Equal(net.IPv4(127, 0, 0, 2)) {
		t.Fatalf("reply came from %s, want 127.0.0.2", from.IP)
	}
	if got := c.fetch(p, 1468); !bytes.Equal(got, ipxebin.Files["undionly.kpxe"]) {
		t.Fatal("content mismatch")
	}
}

// TestReplyTable: each error class has its RFC 1350 code and fixed text,
// however the error was wrapped; anything else is ERROR 0 "server error".
func TestReplyTable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code ErrorCode
		msg  string
	}{
		{fmt.Errorf("%w: openat x: no such file", ErrNotFound), 1, "file not found"},
		{fmt.Errorf("%w: openat escape: path escapes from parent", ErrBadPath), 2, "access violation"},
		{ErrWriteRefused, 2, "access violation: read-only server"},
		{fmt.Errorf("%w: mode %q", ErrIllegalOp, "x"), 4, "illegal TFTP operation"},
		{ErrUnknownTID, 5, "unknown transfer ID"},
		{ErrBusy, 0, "server busy"},
		{fmt.Errorf("%w: read udp 10.97.0.1:40089: i/o timeout", ErrTimeout), 0, "timed out"},
		{errors.New("read udp 10.97.0.1:40089: i/o timeout"), 0, "server error"},
	} {
		code, msg := reply(tc.err)
		if code != tc.code || msg != tc.msg {
			t.Errorf("reply(%v) = %d %q, want %d %q", tc.err, code, msg, tc.code, tc.msg)
		}
	}
}

// TestPinErrorRewritten: pin/tftp sends every ERROR as code 1 with
// err.Error(); the gate maps that text back to its class and sends the
// replies table's code and fixed text instead. The read handler's
// sentinels map by their exact text, pin's own timeout to "timed out",
// anything else (a client's ERROR quoted back, a file read error) to
// ERROR 0 "server error".
func TestPinErrorRewritten(t *testing.T) {
	for _, tc := range []struct {
		pin  string
		code ErrorCode
		msg  string
	}{
		{ErrNotFound.Error(), 1, "file not found"},
		{ErrBadPath.Error(), 2, "access violation"},
		{ErrBusy.Error(), 0, "server busy"},
		{"channel timeout: 10.97.0.2:40089", 0, "timed out"},
		{"sending block 3: code=8, error: abort", 0, "server error"},
		{"read /srv/tftp/x: input/output error", 0, "server error"},
		{ErrInternal.Error(), 0, "server error"},
		{"", 0, "server error"},
	} {
		code, msg := reply(pinError(append([]byte(tc.pin), 0)))
		if code != tc.code || msg != tc.msg {
			t.Errorf("pin text %q → %d %q, want %d %q", tc.pin, code, msg, tc.code, tc.msg)
		}
	}
}

// TestGateForgetsUnstartedRequests: the gate's table of admitted requests
// is bounded by MaxTransfers, and a request pin never started (pin drops
// one that races a transfer's end or shutdown) stops counting once it is
// older than Timeout × (Retries+1), so it cannot hold a slot forever.
func TestGateForgetsUnstartedRequests(t *testing.T) {
	s, err := New(Config{MaxTransfers: 2, Timeout: 50 * time.Millisecond, Retries: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	g := newGate(s, conn)
	defer g.Close()
	defer g.release()
	add := func(port uint16, age time.Duration, started bool) {
		r, _, _, err := s.open("undionly.kpxe")
		if err != nil {
			t.Fatal(err)
		}
		g.peers[netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)] =
			&peer{r: r, since: time.Now().Add(-age), started: started}
	}
	add(1000, time.Second, true)          // a running transfer: kept
	add(1001, 10*time.Millisecond, false) // just admitted: kept
	if !g.full() {
		t.Fatal("2 of 2 admitted: not full")
	}
	time.Sleep(120 * time.Millisecond) // > 50 ms × 2
	if g.full() {
		t.Fatal("an unstarted request older than Timeout × (Retries+1) still holds a slot")
	}
	if len(g.peers) != 1 {
		t.Fatalf("%d requests left, want the running one", len(g.peers))
	}
}
