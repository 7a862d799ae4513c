package testkit

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// IP runs ip(8) (iproute2) with args and fails t with the command and its
// output if it exits non-zero.
func IP(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// Netns creates the network namespace name with its loopback up and deletes
// it at cleanup, with every interface inside it. A namespace of that name
// left by a killed run is deleted first. It returns name.
func Netns(t testing.TB, name string) string {
	t.Helper()
	_ = exec.Command("ip", "netns", "del", name).Run() // leftovers of a killed run
	IP(t, "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	IP(t, "-n", name, "link", "set", "lo", "up")
	return name
}

// VethEnd is one end of a veth pair: the interface Name (at most 15 bytes,
// IFNAMSIZ), the namespace NS it is placed in ("" for the test process's
// own), and its address in CIDR form, "10.72.1.1/24" ("" for none).
type VethEnd struct {
	NS, Name, Addr string
}

// Veth creates the veth pair a–b with the given MTU in bytes (0: the
// kernel's default, 1500), places each end in its namespace, adds the
// addresses and sets both ends up. The pair is deleted at cleanup (deleting
// one end deletes both; a namespace's deletion deletes the ends inside it).
func Veth(t testing.TB, a, b VethEnd, mtu int) {
	t.Helper()
	end := func(e VethEnd) []string {
		args := []string{e.Name}
		if mtu > 0 {
			args = append(args, "mtu", strconv.Itoa(mtu))
		}
		if e.NS != "" {
			args = append(args, "netns", e.NS)
		}
		return args
	}
	args := append([]string{"link", "add"}, end(a)...)
	args = append(args, "type", "veth", "peer", "name")
	args = append(args, end(b)...)
	IP(t, args...)
	t.Cleanup(func() { _ = exec.Command("ip", nsArgs(a.NS, "link", "del", a.Name)...).Run() })
	for _, e := range []VethEnd{a, b} {
		if e.Addr != "" {
			IP(t, nsArgs(e.NS, "addr", "add", e.Addr, "dev", e.Name)...)
		}
		IP(t, nsArgs(e.NS, "link", "set", e.Name, "up")...)
	}
}

func nsArgs(ns string, args ...string) []string {
	if ns == "" {
		return args
	}
	return append([]string{"-n", ns}, args...)
}

// Link is a network namespace joined to the test process's own by a veth
// pair: the usual setting of a protocol test, whose server listens on HostIP
// in the test process and whose real client runs inside NS (Exec).
type Link struct {
	NS     string // namespace name
	HostIf string // the veth end in the test process's namespace
	NSIf   string // the veth end inside NS
	HostIP string // HostIf's address (no prefix length)
	NSIP   string // NSIf's address (no prefix length)
}

var idSeq atomic.Int32

// ID returns a short decimal suffix for the names of namespaces and
// interfaces a test creates: unique within the process (a counter) and, by
// the process ID modulo 10000 in it, across test processes running at once.
func ID() string { return fmt.Sprintf("%d%d", os.Getpid()%10000, idSeq.Add(1)) }

// NewLink creates a Link: namespace tag+ID() ("kbt-t" gives "kbt-t41231"),
// veth ends named from tag without its '-' plus "h"+ID (host) and "c"+ID
// (namespace); addresses subnet's .1 (host) and .2
// (namespace), both with subnet's prefix length; MTU mtu (0: 1500).
// Everything is removed at cleanup. tag is at most 5 bytes, so the names fit
// IFNAMSIZ. It fails t when subnet is not an IPv4 prefix with room for two
// hosts.
func NewLink(t testing.TB, tag string, subnet netip.Prefix, mtu int) Link {
	t.Helper()
	if !subnet.IsValid() || !subnet.Addr().Is4() || subnet.Bits() > 30 || len(tag) > 5 {
		t.Fatalf("testkit.NewLink: tag %q (at most 5 bytes), subnet %v (an IPv4 prefix of at most /30)", tag, subnet)
	}
	id := ID()
	base := strings.ReplaceAll(tag, "-", "")
	host := subnet.Masked().Addr().Next()
	l := Link{NS: tag + id, HostIf: base + "h" + id, NSIf: base + "c" + id, HostIP: host.String(), NSIP: host.Next().String()}
	Netns(t, l.NS)
	bits := "/" + strconv.Itoa(subnet.Bits())
	Veth(t, VethEnd{Name: l.HostIf, Addr: l.HostIP + bits}, VethEnd{NS: l.NS, Name: l.NSIf, Addr: l.NSIP + bits}, mtu)
	return l
}

// Exec runs program name with args inside l's namespace (ip netns exec), in
// directory dir ("" for the test's working directory), killed after timeout
// (timeout(1)). It returns the combined stdout and stderr.
func (l Link) Exec(timeout time.Duration, dir, name string, args ...string) (string, error) {
	secs := strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64)
	cmd := exec.Command("timeout", append([]string{secs, "ip", "netns", "exec", l.NS, name}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}
