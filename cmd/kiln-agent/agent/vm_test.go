package agent

import (
	"context"
	"fmt"
	"kiln/deploy/lab/testkit"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/deploy/lab/benchline"
	"kiln/deploy/lab/testreq"
)

// repoRoot walks up from the test's directory to go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	d, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		p := filepath.Dir(d)
		if p == d {
			t.Fatal("go.mod not found")
		}
		d = p
	}
}

// envFiles returns vmlinuz and initramfs of the in-RAM environment (testreq.Env): from
// $KILN_ENV_DIR when set (e.g. after `make env`; missing files fail), else freshly built by
// deploy/env/build.sh into a temporary directory so the VM always runs the agent code under
// test (the kernel .deb is cached in build/cache; a rebuild takes ~15 s; a failed build fails).
func envFiles(t *testing.T) (kernel, initrd string) {
	t.Helper()
	return testreq.Env(t)
}

type vmResult struct {
	fa       *fakeAppliance
	img      []byte
	diskFile string
	peerFile string
	nvmeFile string
	sataFile string
	bmc      bool // an ipmi_sim BMC (LAN address bmcTestAddr) is wired in-band
	serial   string
	elapsed  time.Duration
}

// bootVM boots the built environment under TCG with a virtio disk (serial KILNVM01) and user
// networking; the fake appliance on the host's loopback is reached at 10.0.2.2. The agent
// first gets an inspect task (fast-track: it keeps polling), then provision.
// With bench, a second virtio disk receives `busybox wget | dd` of the same image first.
func bootVM(t *testing.T, imgMiB int, bench bool) vmResult {
	t.Helper()
	testreq.Commands(t, "qemu-system-x86_64", "sfdisk", "mkfs.ext4", "mdir", "mcopy", "fsck.fat", "ipmi_sim", "ipmitool")
	kernel, initrd := envFiles(t)
	img := buildImage(t, "gpt", imgMiB, "kiln-vm-marker")
	fa := newFakeAppliance(t)
	fa.images["img"] = img
	fa.publicImages = bench
	u, _ := url.Parse(fa.srv.URL)
	guestURL := "http://10.0.2.2:" + u.Port()
	task := provisionTask(fa, "img", img, "raw")
	task.Image.URL = guestURL + "/images/img"
	task.Disk = agentapi.DiskRule{Serial: "KILNVM01"}
	task.Heartbeat = 2 * time.Second
	task.Wipe = false
	fa.tasks = []agentapi.Task{{Action: agentapi.ActionInspect, PollAfter: 300 * time.Millisecond}, task}

	dir := t.TempDir()
	res := vmResult{fa: fa, img: img, diskFile: filepath.Join(dir, "disk.raw"), peerFile: filepath.Join(dir, "peer.raw"), nvmeFile: filepath.Join(dir, "nvme.raw"), sataFile: filepath.Join(dir, "sata.raw")}
	for _, f := range []string{res.diskFile, res.peerFile, res.nvmeFile, res.sataFile} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(f, int64(imgMiB+64)<<20); err != nil {
			t.Fatal(err)
		}
	}
	serial := filepath.Join(dir, "serial.log")
	appendArgs := fmt.Sprintf("console=ttyS0,115200 quiet %s=%s %s=vm-1 %s=%s", agentapi.ArgURL, guestURL, agentapi.ArgMachine, agentapi.ArgToken, testToken)
	args := []string{"-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "2", "-nodefaults", "-nographic", "-monitor", "none",
		"-serial", "file:" + serial, "-no-reboot", "-kernel", kernel, "-initrd", initrd,
		"-drive", "file=" + res.diskFile + ",format=raw,if=none,id=d0,cache=unsafe",
		"-device", "virtio-blk-pci,drive=d0,serial=KILNVM01",
		// An NVMe disk (smaller, so the serial rule, not size, picks vda) reports SMART health.
		"-drive", "file=" + res.nvmeFile + ",format=raw,if=none,id=d2,cache=unsafe",
		"-device", "nvme,drive=d2,serial=NVME0001",
		// A SATA disk on AHCI answers SMART RETURN STATUS through libata's SAT layer.
		"-device", "ahci,id=ahci0",
		"-drive", "file=" + res.sataFile + ",format=raw,if=none,id=d3,cache=unsafe",
		"-device", "ide-hd,drive=d3,bus=ahci0.0,serial=SATA0001",
		"-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0"}
	if bench {
		appendArgs += " kiln.bench_peer=" + guestURL + "/images/img kiln.bench_dev=/dev/vdb"
		args = append(args, "-drive", "file="+res.peerFile+",format=raw,if=none,id=d1,cache=unsafe",
			"-device", "virtio-blk-pci,drive=d1,serial=PEER0001")
	}
	if bmcArgs := startIPMISim(t, dir); bmcArgs != nil {
		args = append(args, bmcArgs...)
		res.bmc = true
	}
	args = append(args, "-append", appendArgs)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	res.elapsed = time.Since(start)
	b, _ := os.ReadFile(serial)
	res.serial = string(b)
	t.Logf("qemu exited after %s (err %v) %s\nserial log:\n%s", res.elapsed.Round(time.Second), err, out, tail(res.serial, 60))
	if ctx.Err() != nil {
		t.Fatal("VM timed out")
	}
	return res
}

// bmcTestAddr is set on the simulated BMC's LAN channel (inside this suite's 10.73/16; no
// traffic goes to it).
const bmcTestAddr = "10.73.9.9"

// freePort is testkit.FreePorts (free on TCP and UDP, below the ephemeral range).
func freePort(t *testing.T, network string) int { t.Helper(); return testkit.FreePorts(t, 1)[0] }

// startIPMISim starts OpenIPMI's ipmi_sim on loopback (LAN 127.0.0.1:UDP, VM codec on a TCP
// port qemu connects to) and returns the qemu arguments for an in-band BT interface
// (bootVM requires ipmi_sim and ipmitool).
func startIPMISim(t *testing.T, dir string) []string {
	t.Helper()
	lan, vmPort := freePort(t, "udp"), freePort(t, "tcp")
	conf := filepath.Join(dir, "lan.conf")
	emu := filepath.Join(dir, "bmc.emu")
	os.WriteFile(emu, []byte("mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nmc_enable 0x20\n"), 0o644)
	os.WriteFile(conf, []byte(fmt.Sprintf(`name "kag-bmc"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 %d
    priv_limit admin
    allowed_auths_admin none md5
    guid a123456789abcdefa123456789abcd01
  endlan
  serial 15 127.0.0.1 %d codec VM
  user 2 true  "admin" "password" admin  10 none md5
`, lan, vmPort)), 0o644)
	state := filepath.Join(dir, "bmc-state")
	os.MkdirAll(state, 0o755)
	cmd := exec.Command("ipmi_sim", "-c", conf, "-f", emu, "-s", state, "-n")
	logf, _ := os.Create(filepath.Join(dir, "ipmi_sim.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("ipmi_sim: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); logf.Close() })
	// Wait until the VM-codec port listens (read /proc/net/tcp: a probe connection would
	// take ipmi_sim's single VM slot).
	want := fmt.Sprintf(":%04X 00000000:0000 0A", vmPort)
	for i := 0; i < 50; i++ {
		if b, _ := os.ReadFile("/proc/net/tcp"); strings.Contains(string(b), want) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Give the BMC a LAN address over RMCP+ (as a site would), to be read back in-band.
	var setErr error
	for i := 0; i < 20; i++ {
		out, err := exec.Command("ipmitool", "-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p", strconv.Itoa(lan),
			"-U", "admin", "-P", "password", "lan", "set", "1", "ipaddr", bmcTestAddr).CombinedOutput()
		if setErr = err; err == nil {
			break
		}
		setErr = fmt.Errorf("%v: %s", err, out)
		time.Sleep(200 * time.Millisecond)
	}
	if setErr != nil {
		t.Fatalf("ipmitool lan set: %v", setErr)
	}
	return []string{"-chardev", fmt.Sprintf("socket,id=ipmi0,host=127.0.0.1,port=%d,reconnect=10", vmPort),
		"-device", "ipmi-bmc-extern,chardev=ipmi0,id=bmc0", "-device", "isa-ipmi-bt,bmc=bmc0"}
}

func tail(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// TestVMProvision: the built kernel+initramfs boots, DHCPs, registers, gets inspect then
// provision, writes the image to the virtio disk, stages cidata and reboots (qemu exits).
func TestVMProvision(t *testing.T) {
	if testing.Short() {
		t.Skip("VM test skipped in -short mode")
	}
	res := bootVM(t, 32, false)
	checkVMResult(t, res)
}

func checkVMResult(t *testing.T, res vmResult) map[string]string {
	t.Helper()
	fin, ok := res.fa.final(agentapi.StepFinalize)
	if !ok || fin.State != agentapi.StateSucceeded {
		t.Fatalf("finalize: %+v\nreports: %+v", fin, res.fa.Reports())
	}
	if fin.Written["disk"] != "/dev/vda" {
		t.Errorf("disk chosen: %v", fin.Written["disk"])
	}
	if res.fa.reg == nil || len(res.fa.reg.Inventory.NICs) == 0 || len(res.fa.reg.Inventory.Disks) == 0 || res.fa.reg.Inventory.Vendor != "QEMU" {
		t.Errorf("inventory: %+v", res.fa.reg)
	}
	for _, want := range []string{"kiln-init: eth0 configured", "kiln-agent: step verify done", "kiln-agent: provisioned /dev/vda"} {
		if !strings.Contains(res.serial, want) {
			t.Errorf("serial log lacks %q", want)
		}
	}
	// Issue 15's inspection fields, from the guest's sysfs/procfs: the virtio-blk function
	// (1af4, class 01 mass storage), the CPU flags, no TPM (none attached).
	virtio := false
	for _, p := range res.fa.reg.Inventory.PCI {
		virtio = virtio || (p.VendorID == 0x1af4 && p.Class>>16 == 0x01)
	}
	if !virtio || !slices.Contains(res.fa.reg.Inventory.CPUFlags, "sse2") || res.fa.reg.Inventory.TPM != nil {
		t.Errorf("inspection: PCI %+v, %d CPU flags, TPM %+v", res.fa.reg.Inventory.PCI, len(res.fa.reg.Inventory.CPUFlags), res.fa.reg.Inventory.TPM)
	}
	if res.bmc && res.fa.reg.Inventory.BMCAddress != bmcTestAddr {
		t.Errorf("BMC address seen in-band: %q, want %s", res.fa.reg.Inventory.BMCAddress, bmcTestAddr)
	}
	health := map[string]string{}
	for _, d := range res.fa.reg.Inventory.Disks {
		health[d.Serial] = d.Health
	}
	if health["NVME0001"] != HealthOK || health["SATA0001"] != HealthOK || health["KILNVM01"] != "not_reported" {
		t.Errorf("disk health: %v (inventory %+v)", health, res.fa.reg.Inventory.Disks)
	}
	if !regexp.MustCompile(`kiln-agent: step write [0-9]+%`).MatchString(res.serial) {
		t.Error("serial log lacks write progress lines")
	}
	heartbeats := 0
	for _, r := range res.fa.Reports() {
		if r.State == agentapi.StateRunning {
			heartbeats++
		}
	}
	t.Logf("written: %v; %d running reports", fin.Written, heartbeats)
	checkImageRange(t, res.diskFile, res.img, fin.Written)
	checkCidata(t, res.diskFile, fin.Written, "node-07")
	return fin.Written
}

var pipeLine = regexp.MustCompile(`write pipeline: ([0-9.]+) s; busy: fetch\+decode ([0-9.]+) s, crc32c ([0-9.]+) s, device ([0-9.]+) s`)

var peerLine = regexp.MustCompile(`kiln-init: bench peer wget\|dd t0=([0-9.]+) t1=([0-9.]+)`)

// TestBenchAgentWrite (KILN_BENCH=1): in one VM boot, busybox `wget -O - | dd bs=4M
// conv=fsync` of the image into a second virtio disk, then the agent's write step into the
// first; both include the final flush. Prints a bench: line.
func TestBenchAgentWrite(t *testing.T) {
	benchline.Need(t, false, "qemu-system-x86_64", "sfdisk", "mkfs.ext4", "mdir", "mcopy")
	res := bootVM(t, 96, true)
	w := checkVMResult(t, res)
	m := peerLine.FindStringSubmatch(res.serial)
	if m == nil {
		t.Fatal("no peer line in the serial log")
	}
	t0, _ := strconv.ParseFloat(m[1], 64)
	t1, _ := strconv.ParseFloat(m[2], 64)
	peerBps := float64(len(res.img)) / (t1 - t0)
	peerDisk, _ := os.ReadFile(res.peerFile)
	if sha(peerDisk[:len(res.img)]) != sha(res.img) {
		t.Error("peer disk does not hold the image")
	}
	kiln, _ := strconv.ParseFloat(w["write_bytes_per_s"], 64)
	l := benchline.Line{Name: "agent_write_bytes_per_s", Unit: "bytes/s", Kiln: kiln, Peer: &benchline.Peer{What: "busybox-wget|dd", Value: peerBps}}
	// Each stage's busy time (the agent's "write pipeline" line): the slowest
	// bounds the write (under TCG the stream's SHA-256 did, 10.3 of 10.6 s,
	// before the write checksummed with CRC-32C and left SHA-256 to verify).
	if p := pipeLine.FindStringSubmatch(res.serial); p != nil {
		l.Fields = append(l.Fields, benchline.Field{Key: "busy_s", Value: fmt.Sprintf("total:%s,fetch:%s,crc32c:%s,device:%s", p[1], p[2], p[3], p[4])})
	} else {
		t.Error("no write pipeline line in the serial log")
	}
	benchline.Print(t, l)
}
