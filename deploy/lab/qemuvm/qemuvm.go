package qemuvm

import (
	"bytes"
	"errors"
	"kiln/deploy/lab/testreq"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"kiln/deploy/lab/testkit"
)

// Errors of VM.Wait.
var (
	// ErrExited: qemu ended before the marker appeared on the serial console.
	ErrExited = errors.New("qemuvm: qemu exited before the marker")
	// ErrTimeout: the marker did not appear in time.
	ErrTimeout = errors.New("qemuvm: no marker in time")
)

// Net names one lab network: host veth Host (address HostCIDR) paired with
// Peer inside namespace NS, where Peer and Tap are ports of bridge Bridge
// (address BridgeCIDR). Interface names are at most 15 bytes.
type Net struct {
	NS, Host, Peer, Bridge, Tap string
	HostCIDR, BridgeCIDR        string // e.g. "10.72.5.1/24", "10.72.5.2/24"
}

// NewNet creates n (namespace, veth pair, bridge without STP and forward
// delay, tap, all up) and removes it in t.Cleanup. It fails t on any ip error.
func NewNet(t testing.TB, n Net) Net {
	t.Helper()
	testkit.Netns(t, n.NS)
	testkit.Veth(t, testkit.VethEnd{Name: n.Host, Addr: n.HostCIDR}, testkit.VethEnd{NS: n.NS, Name: n.Peer}, 0)
	testkit.IP(t, "-n", n.NS, "link", "add", n.Bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0")
	testkit.IP(t, "-n", n.NS, "addr", "add", n.BridgeCIDR, "dev", n.Bridge)
	testkit.IP(t, "-n", n.NS, "link", "set", n.Peer, "master", n.Bridge)
	testkit.IP(t, "-n", n.NS, "tuntap", "add", "dev", n.Tap, "mode", "tap")
	testkit.IP(t, "-n", n.NS, "link", "set", n.Tap, "master", n.Bridge)
	for _, l := range []string{n.Tap, n.Bridge} {
		testkit.IP(t, "-n", n.NS, "link", "set", l, "up")
	}
	return n
}

// OVMF firmware files (Debian package ovmf).
const (
	OVMFCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	OVMFVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// OVMF copies the OVMF variable store to varsCopy and returns the qemu
// arguments for the two pflash drives (code read-only, the copy writable).
// OVMF not installed is a circumstantial requirement (testreq.HostFile).
func OVMF(t testing.TB, varsCopy string) []string {
	t.Helper()
	testreq.HostFile(t, OVMFCode, "ovmf")
	testreq.HostFile(t, OVMFVars, "ovmf")
	vb, err := os.ReadFile(OVMFVars)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(varsCopy, vb, 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + OVMFCode,
		"-drive", "if=pflash,format=raw,unit=1,file=" + varsCopy}
}

// VM is one running qemu-system-x86_64.
type VM struct {
	Serial string // file holding the serial console
	mu     sync.Mutex
	out    bytes.Buffer // qemu's stdout and stderr
	exited chan struct{}
	cmd    *exec.Cmd
}

// Start runs `ip netns exec ns qemu-system-x86_64 -serial file:SERIAL ARGS...`
// and kills it in t.Cleanup. args are the machine, firmware, network and
// devices; the serial console goes to serial.
func Start(t testing.TB, ns, serial string, args ...string) *VM {
	t.Helper()
	return start(t, serial, exec.Command("ip", append([]string{"netns", "exec", ns, "qemu-system-x86_64", "-serial", "file:" + serial}, args...)...))
}

// StartHost is Start without a network namespace (a VM with qemu's user
// networking, which reaches the host's loopback as 10.0.2.2).
func StartHost(t testing.TB, serial string, args ...string) *VM {
	t.Helper()
	return start(t, serial, exec.Command("qemu-system-x86_64", append([]string{"-serial", "file:" + serial}, args...)...))
}

// Kill stops the VM now (also done in t.Cleanup).
func (v *VM) Kill() {
	_ = v.cmd.Process.Kill()
	<-v.exited
}

func start(t testing.TB, serial string, q *exec.Cmd) *VM {
	t.Helper()
	v := &VM{Serial: serial, exited: make(chan struct{}), cmd: q}
	q.Stdout, q.Stderr = (*lockedWriter)(v), (*lockedWriter)(v)
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = q.Wait(); close(v.exited) }()
	t.Cleanup(func() {
		_ = q.Process.Kill()
		<-v.exited
	})
	return v
}

type lockedWriter VM

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.Write(p)
}

// Output is what qemu has printed on stdout and stderr so far.
func (v *VM) Output() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.out.String()
}

// Wait reads the serial console every 500 ms until found(console) is true
// and returns the console then. When qemu ends first (read once more after
// it ended) the error is ErrExited, when d passes ErrTimeout; the console as
// last read is returned with either.
func (v *VM) Wait(d time.Duration, found func(console []byte) bool) ([]byte, error) {
	deadline := time.After(d)
	gone := false
	for {
		b, _ := os.ReadFile(v.Serial)
		if found(b) {
			return b, nil
		}
		if gone {
			return b, ErrExited
		}
		select {
		case <-v.exited:
			gone = true // read the serial log once more
		case <-deadline:
			return b, ErrTimeout
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Tail is the last max bytes of b, for failure messages.
func Tail(b []byte, max int) string {
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}
