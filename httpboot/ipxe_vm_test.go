package httpboot

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/deploy/lab/qemuvm"
	"kiln/deploy/lab/testkit"
	"kiln/deploy/lab/testreq"
)

// TestIPXEBootsRenderedScript boots two qemu VMs in turn (TCG): "bios" is
// SeaBIOS + qemu's own iPXE NIC ROM; "uefi-http" is OVMF's HTTP boot
// (HttpBootDxe, PXE disabled), which fetches /ipxe.efi from Kiln and runs
// that iPXE. Each VM's DHCP answer (dnsmasq in netns kbt-q*, 10.72.5.0/24) points
// at Kiln's /ipxe/{mac}; the real iPXE runs the rendered agent script,
// fetches kernel and initramfs from Kiln and boots them. The initramfs /init
// prints a marker and /proc/cmdline, so the test sees that the kernel
// arguments (kiln.url, kiln.machine, kiln.token) arrived intact.
//
// Needs root, qemu-system-x86_64, dnsmasq, cpio, /bin/busybox (busybox-static)
// and a kernel: $KILN_TEST_KERNEL, else the in-RAM environment's (testreq.Env:
// $KILN_ENV_DIR as `make unit` sets it, or built by deploy/env/build.sh).
func TestIPXEBootsRenderedScript(t *testing.T) {
	testreq.Root(t, "network namespaces and a tap device", "ip", "qemu-system-x86_64", "dnsmasq", "cpio", "/bin/busybox")
	kernel := os.Getenv("KILN_TEST_KERNEL")
	if kernel == "" {
		kernel, _ = testreq.Env(t)
	}
	if _, err := os.Stat(kernel); err != nil {
		t.Fatalf("KILN_TEST_KERNEL: %v", err)
	}
	dir := t.TempDir()

	// initramfs: busybox + an /init that prints the marker and the command line.
	rootfs := filepath.Join(dir, "rootfs")
	must(t, os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755))
	bb, err := os.ReadFile("/bin/busybox")
	must(t, err)
	must(t, os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), bb, 0o755))
	must(t, os.WriteFile(filepath.Join(rootfs, "init"), []byte("#!/bin/busybox sh\n"+
		"/bin/busybox mkdir -p /proc /dev\n/bin/busybox mount -t proc proc /proc\n"+
		"/bin/busybox mount -t devtmpfs dev /dev\nexec >/dev/ttyS0 2>&1\n"+
		"/bin/busybox echo KILN-VM-INIT-UP\n/bin/busybox echo CMDLINE: $(/bin/busybox cat /proc/cmdline)\n"+
		"/bin/busybox poweroff -f\n"), 0o755))
	env := filepath.Join(dir, "env")
	must(t, os.MkdirAll(env, 0o755))
	cp := exec.Command("sh", "-c", "find . | cpio -o -H newc --quiet > "+filepath.Join(env, EnvInitramfs))
	cp.Dir = rootfs
	if out, err := cp.CombinedOutput(); err != nil {
		t.Fatalf("cpio: %v %s", err, out)
	}
	kb, err := os.ReadFile(kernel)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(env, EnvKernel), kb, 0o644))

	// Network: host veth 10.72.5.1 (Kiln) — bridge in kbt-q* (dnsmasq 10.72.5.2) — tap (VM).
	id := testkit.ID()
	lan := qemuvm.NewNet(t, qemuvm.Net{NS: "kbt-q" + id, Host: "kbtqh" + id, Peer: "kbtqc" + id, Bridge: "kbtqb" + id,
		Tap: "kbtqt" + id, HostCIDR: "10.72.5.1/24", BridgeCIDR: "10.72.5.2/24"})

	vms := []struct{ name, mac, id string }{
		{"bios", "52:54:00:72:05:01", "m-vm-1"},
		{"uefi-http", "52:54:00:72:05:02", "m-vm-2"},
	}
	e := startHTTP(t, "10.72.5.1:0", func(c *Config) {
		c.EnvDir = env
		c.KernelArgs = []string{"console=ttyS0", "panic=-1"}
		c.AgentURL = "http://10.72.5.1:9090"
	})
	dargs := []string{"netns", "exec", lan.NS, "dnsmasq", "-k", "--conf-file=/dev/null", "--port=0",
		"--bind-interfaces", "--interface=" + lan.Bridge, "--dhcp-range=10.72.5.100,10.72.5.150,255.255.255.0,1h", "--no-ping",
		"--dhcp-match=set:ipxe,175", "--dhcp-match=set:efihttp,option:client-arch,16",
		"--dhcp-option-force=tag:efihttp,60,HTTPClient", "--dhcp-boot=tag:efihttp,tag:!ipxe," + e.base + "/ipxe.efi",
		"--dhcp-leasefile=" + filepath.Join(dir, "leases"), "--user=root", "--group=root",
		"--pid-file=" + filepath.Join(dir, "dnsmasq.pid"), "--log-facility=" + filepath.Join(dir, "dnsmasq.log")}
	e.backend.mu.Lock()
	for _, vm := range vms {
		e.backend.boots[vm.mac] = Boot{Action: ActionAgent, MachineID: vm.id, Token: "tok-" + vm.id, Hostname: vm.name}
		dargs = append(dargs, "--dhcp-host="+vm.mac+",set:"+vm.name, "--dhcp-boot=tag:ipxe,tag:"+vm.name+","+e.base+"/ipxe/"+vm.mac)
	}
	e.backend.mu.Unlock()
	dm := exec.Command("ip", dargs...)
	must(t, dm.Start())
	t.Cleanup(func() { dm.Process.Kill(); dm.Wait() })

	for _, vm := range vms {
		t.Run(vm.name, func(t *testing.T) {
			bootVM(t, lan.NS, lan.Tap, dir, vm.name, vm.mac, []string{"kiln.url=http://10.72.5.1:9090", "kiln.machine=" + vm.id,
				"kiln.token=tok-" + vm.id, "console=ttyS0"})
		})
	}
	if n := testkit.Sample(t, e.reg, "kiln_httpboot_transfers_total", "class", "env", "result", "ok"); n < 4 {
		t.Errorf("env transfers metric %v, want >= 4", n)
	}
	if n := testkit.Sample(t, e.reg, "kiln_httpboot_transfers_total", "class", "ipxe", "result", "ok"); n < 1 {
		t.Errorf("ipxe.efi over HTTP: transfers %v, want >= 1", n)
	}
}

// bootVM boots one VM (fw "bios" or "uefi-http") on tap in ns and waits for
// the initramfs to print a command line holding every want.
func bootVM(t *testing.T, ns, tap, dir, fw, mac string, want []string) {
	var fwargs []string
	switch fw {
	case "bios":
		fwargs = []string{"-machine", "pc", "-device", "virtio-net-pci,netdev=n0,mac=" + mac + ",bootindex=1"}
	case "uefi-http":
		fwargs = append(qemuvm.OVMF(t, filepath.Join(dir, fw+"-vars.fd")), "-machine", "q35",
			"-fw_cfg", "name=opt/org.tianocore/IPv4PXESupport,string=n", "-fw_cfg", "name=opt/org.tianocore/IPv6PXESupport,string=n",
			"-device", "virtio-net-pci,netdev=n0,mac="+mac+",romfile=,bootindex=1")
	}

	vm := qemuvm.Start(t, ns, filepath.Join(dir, fw+"-serial.log"), append([]string{"-accel", "tcg", "-m", "256",
		"-smp", "1", "-nodefaults", "-nographic", "-monitor", "none", "-no-reboot",
		"-netdev", "tap,id=n0,ifname=" + tap + ",script=no,downscript=no"}, fwargs...)...)

	start := time.Now()
	b, err := vm.Wait(180*time.Second, func(b []byte) bool { return bytes.Contains(b, []byte("CMDLINE:")) })
	if errors.Is(err, qemuvm.ErrExited) {
		t.Fatalf("qemu exited before the marker:\n%s\nserial:\n%s", vm.Output(), qemuvm.Tail(b, 4000))
	} else if err != nil {
		t.Fatalf("no marker after 180 s; serial:\n%s", qemuvm.Tail(b, 4000))
	}
	line := string(b[bytes.Index(b, []byte("CMDLINE:")):])
	line, _, _ = strings.Cut(line, "\n")
	for _, w := range want {
		if !strings.Contains(line, w) {
			t.Fatalf("kernel command line lacks %s: %s", w, line)
		}
	}
	t.Logf("%s VM booted the agent environment via Kiln's iPXE script in %s", fw, time.Since(start).Round(time.Second))
}
