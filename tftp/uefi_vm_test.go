package tftp

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestUEFIPXEFetchesIPXE boots OVMF with EDK2's own PXE client (NIC
// romfile= empty, so not iPXE) under qemu/TCG. dnsmasq (DHCP only, netns
// kbt-u*, 10.72.6.0/24) names ipxe.efi on Kiln's TFTP server (10.72.6.1:69);
// the test passes when the real firmware has fetched it — including its
// tsize probe — and iPXE has started from it.
func TestUEFIPXEFetchesIPXE(t *testing.T) {
	needRoot(t, "qemu-system-x86_64", "dnsmasq")
	code, vars := "/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"
	for _, f := range []string{code, vars} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("needs OVMF (package ovmf): %v", err)
		}
	}
	dir := t.TempDir()
	varsCopy := filepath.Join(dir, "vars.fd")
	vb, err := os.ReadFile(vars)
	must(t, err)
	must(t, os.WriteFile(varsCopy, vb, 0o644))

	id := fmt.Sprintf("%d%d", os.Getpid()%10000, nsSeq.Add(1))
	ns, vh, vc, br, tap := "kbt-u"+id, "kbtuh"+id, "kbtuc"+id, "kbtub"+id, "kbtut"+id
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run(t, "ip", "link", "add", vh, "type", "veth", "peer", "name", vc)
	t.Cleanup(func() { exec.Command("ip", "link", "del", vh).Run() })
	run(t, "ip", "link", "set", vc, "netns", ns)
	run(t, "ip", "addr", "add", "10.72.6.1/24", "dev", vh)
	run(t, "ip", "link", "set", vh, "up")
	run(t, "ip", "-n", ns, "link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0")
	run(t, "ip", "-n", ns, "addr", "add", "10.72.6.2/24", "dev", br)
	run(t, "ip", "-n", ns, "link", "set", vc, "master", br)
	run(t, "ip", "-n", ns, "tuntap", "add", "dev", tap, "mode", "tap")
	run(t, "ip", "-n", ns, "link", "set", tap, "master", br)
	for _, l := range []string{vc, tap, br, "lo"} {
		run(t, "ip", "-n", ns, "link", "set", l, "up")
	}

	_, reg := startServer(t, Config{}, "10.72.6.1:69")

	dm := exec.Command("ip", "netns", "exec", ns, "dnsmasq", "-k", "--conf-file=/dev/null", "--port=0",
		"--bind-interfaces", "--interface="+br, "--dhcp-range=10.72.6.100,10.72.6.150,255.255.255.0,1h", "--no-ping",
		"--dhcp-boot=ipxe.efi,,10.72.6.1", "--dhcp-leasefile="+filepath.Join(dir, "leases"),
		"--user=root", "--group=root", "--pid-file="+filepath.Join(dir, "dnsmasq.pid"), "--log-facility="+filepath.Join(dir, "dnsmasq.log"))
	must(t, dm.Start())
	t.Cleanup(func() { dm.Process.Kill(); dm.Wait() })

	serial := filepath.Join(dir, "serial.log")
	q := exec.Command("ip", "netns", "exec", ns, "qemu-system-x86_64", "-accel", "tcg", "-machine", "q35", "-m", "256",
		"-smp", "1", "-nodefaults", "-nographic", "-monitor", "none", "-serial", "file:"+serial, "-no-reboot",
		"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+code,
		"-drive", "if=pflash,format=raw,unit=1,file="+varsCopy,
		"-netdev", "tap,id=n0,ifname="+tap+",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:72:06:01,romfile=,bootindex=1")
	var qout bytes.Buffer
	q.Stdout, q.Stderr = &qout, &qout
	must(t, q.Start())
	exited := make(chan struct{})
	go func() { q.Wait(); close(exited) }()
	t.Cleanup(func() { q.Process.Kill(); <-exited })

	start := time.Now()
	deadline := time.After(150 * time.Second)
	gone := false
	for {
		b, _ := os.ReadFile(serial)
		if bytes.Contains(b, []byte("iPXE initialising devices")) || bytes.Contains(b, []byte("Welcome to Neverland")) {
			t.Logf("EDK2 PXE fetched ipxe.efi from Kiln TFTP and iPXE started after %s", time.Since(start).Round(time.Second))
			if n := sample(t, reg, "kiln_tftp_transfers_total", map[string]string{"class": "ipxe", "result": "ok"}); n < 1 {
				t.Errorf("ipxe transfers ok = %v", n)
			}
			t.Logf("aborted (tsize probes) = %v", sample(t, reg, "kiln_tftp_errors_total", map[string]string{"class": "ipxe", "reason": "aborted"}))
			return
		}
		if gone {
			lg, _ := os.ReadFile(filepath.Join(dir, "dnsmasq.log"))
			t.Fatalf("qemu exited before iPXE started:\n%s\nserial:\n%s\ndnsmasq:\n%s", qout.String(), tailB(b), tailB(lg))
		}
		select {
		case <-exited:
			gone = true
		case <-deadline:
			lg, _ := os.ReadFile(filepath.Join(dir, "dnsmasq.log"))
			t.Fatalf("iPXE did not start within 150 s; serial:\n%s\ndnsmasq:\n%s", tailB(b), tailB(lg))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func tailB(b []byte) string {
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}
