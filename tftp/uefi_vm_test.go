package tftp

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"kiln/deploy/lab/qemuvm"
	"kiln/deploy/lab/testkit"
	"kiln/deploy/lab/testreq"
)

// TestUEFIPXEFetchesIPXE boots OVMF with EDK2's own PXE client (NIC
// romfile= empty, so not iPXE) under qemu/TCG. dnsmasq (DHCP only, netns
// kbt-u*, 10.72.6.0/24) names ipxe.efi on Kiln's TFTP server (10.72.6.1:69);
// the test passes when the real firmware has fetched it — including its
// tsize probe — and iPXE has started from it.
func TestUEFIPXEFetchesIPXE(t *testing.T) {
	testreq.Root(t, "network namespaces and a tap device", "ip", "qemu-system-x86_64", "dnsmasq")
	dir := t.TempDir()
	firmware := qemuvm.OVMF(t, filepath.Join(dir, "vars.fd"))

	id := testkit.ID()
	lan := qemuvm.NewNet(t, qemuvm.Net{NS: "kbt-u" + id, Host: "kbtuh" + id, Peer: "kbtuc" + id, Bridge: "kbtub" + id,
		Tap: "kbtut" + id, HostCIDR: "10.72.6.1/24", BridgeCIDR: "10.72.6.2/24"})

	_, reg := startServer(t, Config{}, "10.72.6.1:69")

	dm := exec.Command("ip", "netns", "exec", lan.NS, "dnsmasq", "-k", "--conf-file=/dev/null", "--port=0",
		"--bind-interfaces", "--interface="+lan.Bridge, "--dhcp-range=10.72.6.100,10.72.6.150,255.255.255.0,1h", "--no-ping",
		"--dhcp-boot=ipxe.efi,,10.72.6.1", "--dhcp-leasefile="+filepath.Join(dir, "leases"),
		"--user=root", "--group=root", "--pid-file="+filepath.Join(dir, "dnsmasq.pid"), "--log-facility="+filepath.Join(dir, "dnsmasq.log"))
	must(t, dm.Start())
	t.Cleanup(func() { dm.Process.Kill(); dm.Wait() })

	vm := qemuvm.Start(t, lan.NS, filepath.Join(dir, "serial.log"), append([]string{"-accel", "tcg", "-machine", "q35", "-m", "256",
		"-smp", "1", "-nodefaults", "-nographic", "-monitor", "none", "-no-reboot"}, append(firmware,
		"-netdev", "tap,id=n0,ifname="+lan.Tap+",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:72:06:01,romfile=,bootindex=1")...)...)

	start := time.Now()
	b, err := vm.Wait(150*time.Second, func(b []byte) bool {
		return bytes.Contains(b, []byte("iPXE initialising devices")) || bytes.Contains(b, []byte("Welcome to Neverland"))
	})
	if err != nil {
		lg, _ := os.ReadFile(filepath.Join(dir, "dnsmasq.log"))
		if errors.Is(err, qemuvm.ErrExited) {
			t.Fatalf("qemu exited before iPXE started:\n%s\nserial:\n%s\ndnsmasq:\n%s", vm.Output(), qemuvm.Tail(b, 3000), qemuvm.Tail(lg, 3000))
		}
		t.Fatalf("iPXE did not start within 150 s; serial:\n%s\ndnsmasq:\n%s", qemuvm.Tail(b, 3000), qemuvm.Tail(lg, 3000))
	}
	t.Logf("EDK2 PXE fetched ipxe.efi from Kiln TFTP and iPXE started after %s", time.Since(start).Round(time.Second))
	if n := testkit.Sample(t, reg, "kiln_tftp_transfers_total", "class", "ipxe", "result", "ok"); n < 1 {
		t.Errorf("ipxe transfers ok = %v", n)
	}
	t.Logf("aborted (tsize probes) = %v", testkit.Sample(t, reg, "kiln_tftp_errors_total", "class", "ipxe", "reason", "aborted"))
}
