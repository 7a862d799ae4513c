package testkit

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Port picking for tests that must write a port into a config before the
// process that binds it starts (a `kiln serve` config, a join list).
//
// A port from "127.0.0.1:0" is an ephemeral port: after the probe listener
// closes, the kernel may hand the same number to any outgoing connection
// as its source port, and the later bind fails with "address already in
// use" (seen in CI: a three-node `kiln serve` test lost its raft port to a
// client connection of a test running in parallel). FreePorts therefore
// picks ports below the ephemeral range (net.ipv4.ip_local_port_range),
// where the kernel never assigns source ports, and checks each by binding
// it on TCP and UDP.

// portFloor is the lowest port FreePorts picks.
const portFloor = 20000

var (
	portMu    sync.Mutex
	portsUsed = map[int]bool{} // handed out in this process
)

// ephemeralLow is the first port of the kernel's ephemeral range (32768
// when /proc cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= portFloor+1000 {
		return 32768
	}
	return n
}

// FreePorts returns n distinct ports on 127.0.0.1 that were free on TCP
// and UDP when checked, below the ephemeral range and never returned twice
// in one test process. It fails t if none can be found.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ps, err := freePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// FreeAddrs is FreePorts as "127.0.0.1:PORT" addresses.
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	var out []string
	for _, p := range FreePorts(t, n) {
		out = append(out, fmt.Sprintf("127.0.0.1:%d", p))
	}
	return out
}

func freePorts(n int) ([]int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	hi := ephemeralLow()
	var out []int
	for tries := 0; len(out) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("testkit: no free port in %d..%d after %d tries", portFloor, hi-1, tries)
		}
		p := portFloor + rand.IntN(hi-portFloor)
		if portsUsed[p] || !bindable(p) {
			continue
		}
		portsUsed[p] = true
		out = append(out, p)
	}
	return out, nil
}

func bindable(p int) bool {
	addr := fmt.Sprintf("127.0.0.1:%d", p)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	l.Close()
	c, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
