package bmc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/deploy/lab/benchline"
	"kiln/deploy/lab/ipmilab"
	"kiln/deploy/lab/testkit"
	"kiln/deploy/lab/testreq"
)

// ipmiLab is one ipmi_sim BMC in its own network namespace (kbm-*), whose chassis program
// (deploy/lab/ipmi/chassis.sh) starts and stops a qemu VM.
type ipmiLab struct {
	ns, addr, state, wrapper string
	bmc                      *ipmilab.BMC
}

func startIPMILab(t *testing.T, user, pass string, qemuArgs []string) *ipmiLab {
	t.Helper()
	labDir, err := filepath.Abs("../deploy/lab/ipmi")
	if err != nil {
		t.Fatal(err)
	}
	l := &ipmiLab{ns: fmt.Sprintf("kbm-%d", os.Getpid()%100000), addr: "10.74.1.2", state: t.TempDir()}
	testkit.Netns(t, l.ns)
	testkit.IP(t, "-n", l.ns, "addr", "add", l.addr+"/24", "dev", "lo")

	logs := func() {
		for _, n := range []string{"ipmi_sim.log", "chassis.log", "boots.log", "qemu.log"} {
			b, _ := os.ReadFile(filepath.Join(l.state, n))
			t.Logf("--- %s:\n%s", n, b)
		}
	}
	l.bmc, err = ipmilab.Start(context.Background(), ipmilab.Options{NetNS: l.ns, Name: "kbm", Addr: l.addr,
		User: user, Password: pass, StateDir: l.state, LabDir: labDir, QEMUArgs: qemuArgs, DieWithParent: true})
	if err != nil {
		logs()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.bmc.Close()
		if t.Failed() {
			logs()
		}
	})
	// ipmitool must run inside the namespace: a wrapper bmclib can exec (it passes only
	// IPMITOOL_PASSWORD in the environment, so absolute paths)
	ipPath, _ := exec.LookPath("ip")
	itPath, _ := exec.LookPath("ipmitool")
	l.wrapper = filepath.Join(l.state, "ipmitool-netns")
	script := fmt.Sprintf("#!/bin/sh\nexec %s netns exec %s %s \"$@\"\n", ipPath, l.ns, itPath)
	if err := os.WriteFile(l.wrapper, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *ipmiLab) chassisLog() string {
	b, _ := os.ReadFile(filepath.Join(l.state, "chassis.log"))
	return string(b)
}

// boots returns the chassis program's journal of VM starts.
func (l *ipmiLab) boots() []string { return l.bmc.Boots() }

func TestIPMIEndToEndQEMU(t *testing.T) {
	testreq.Root(t, "a network namespace and ipmi_sim", "ip", "ipmi_sim", "ipmitool", "qemu-system-x86_64", "setsid")
	const user, pass = "kilnadmin", "Ipmi-Secret-74x"
	q, _ := exec.LookPath("qemu-system-x86_64")
	lab := startIPMILab(t, user, pass, []string{q, "-accel", "tcg", "-machine", "pc", "-m", "64", "-nodefaults",
		"-nographic", "-monitor", "none", "-netdev", "user,id=n0,restrict=on",
		"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:74:01:02"})
	c, err := New(Config{CallTimeout: 15 * time.Second, BackoffBase: 200 * time.Millisecond, IPMICipherSuite: "3",
		IpmitoolPath: lab.wrapper}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	tg := Target{Address: lab.addr, Driver: DriverIPMI, Username: user, Password: pass}
	ctx := context.Background()

	var st PowerState
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err = c.PowerState(ctx, tg)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil || st != PowerOff {
		t.Fatalf("initial PowerState = %q, %v", st, err)
	}
	// ipmi_sim keeps only the boot device selector, not the "valid" bit: a strict read-back
	// reports it
	if err := c.SetNextBootPXE(ctx, tg, BootLegacy); !errors.Is(err, ErrBootNotApplied) || !strings.Contains(err.Error(), "valid=false") {
		t.Fatalf("strict read-back against ipmi_sim: %v, want boot_not_applied for the missing valid bit", err)
	}
	c, err = New(Config{CallTimeout: 15 * time.Second, BackoffBase: 200 * time.Millisecond, IPMICipherSuite: "3",
		IpmitoolPath: lab.wrapper, IPMIIgnoreValidBit: true}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	// next boot: network, legacy; read back through Get System Boot Options
	if err := c.SetNextBootPXE(ctx, tg, BootLegacy); err != nil {
		t.Fatalf("SetNextBootPXE: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(lab.state, "boot")); strings.TrimSpace(string(b)) != "pxe" {
		t.Fatalf("chassis program's pending boot device = %q, want pxe", b)
	}
	if err := c.Power(ctx, tg, ActionOn); err != nil {
		t.Fatalf("power on: %v", err)
	}
	boots := lab.boots()
	if len(boots) != 1 || !strings.Contains(boots[0], "boot=pxe") || !strings.Contains(boots[0], "-boot once=n") {
		t.Fatalf("VM starts = %q, want one start with -boot once=n", boots)
	}
	sock1 := filepath.Join(lab.state, "qmp-1.sock")
	waitUntil(t, "QMP query-status running", 20*time.Second, func() bool {
		s, err := qmpQueryStatus(ctx, sock1)
		return err == nil && s == "running"
	})
	serial1 := filepath.Join(lab.state, "serial-1.log")
	waitUntil(t, "the VM to boot from the network (iPXE runs first)", 60*time.Second, func() bool {
		b, _ := os.ReadFile(serial1)
		return strings.Contains(string(b), "iPXE (PCI 00:02.0) starting execution")
	})
	if b, _ := os.ReadFile(serial1); strings.Index(string(b), "Booting from ROM") > strings.Index(string(b)+"Booting from Hard Disk", "Booting from Hard Disk") {
		t.Fatalf("the VM tried the disk before the network")
	}
	if st, err := c.PowerState(ctx, tg); err != nil || st != PowerOn {
		t.Fatalf("PowerState after on = %q, %v", st, err)
	}
	if err := c.Power(ctx, tg, ActionOn); err != nil || len(lab.boots()) != 1 {
		t.Fatalf("on when on: %v, starts %d", err, len(lab.boots()))
	}
	// cycle: the chassis program stops the VM and starts a new one, without the one-time override
	if err := c.Power(ctx, tg, ActionCycle); err != nil {
		t.Fatalf("cycle: %v", err)
	}
	waitUntil(t, "a second VM start after cycle", 15*time.Second, func() bool { return len(lab.boots()) >= 2 })
	boots = lab.boots()
	if len(boots) != 2 || strings.Contains(boots[1], "-boot once=n") {
		t.Fatalf("VM starts after cycle = %q (one new start, no PXE override)", boots)
	}
	pid1 := strings.Fields(boots[0])[1]
	waitUntil(t, "the first VM process to end", 10*time.Second, func() bool {
		_, err := os.Stat("/proc/" + pid1)
		b, _ := os.ReadFile("/proc/" + pid1 + "/stat")
		return err != nil || strings.Contains(string(b), ") Z ")
	})
	waitUntil(t, "QMP of the new VM", 20*time.Second, func() bool {
		s, err := qmpQueryStatus(ctx, filepath.Join(lab.state, "qmp-2.sock"))
		return err == nil && s == "running"
	})
	if err := c.Power(ctx, tg, ActionOff); err != nil {
		t.Fatalf("off: %v", err)
	}
	if st, err := c.PowerState(ctx, tg); err != nil || st != PowerOff {
		t.Fatalf("PowerState after off = %q, %v", st, err)
	}
	waitUntil(t, "QMP to go away after off", 10*time.Second, func() bool {
		_, err := qmpQueryStatus(ctx, filepath.Join(lab.state, "qmp-2.sock"))
		return err != nil
	})
	if err := c.Power(ctx, tg, ActionOff); err != nil {
		t.Fatalf("off when off: %v", err)
	}
	// UEFI: ipmitool sends the EFI bit, ipmi_sim cannot keep it, and the read-back catches that
	if err := c.SetNextBootPXE(ctx, tg, BootUEFI); !errors.Is(err, ErrBootNotApplied) || !strings.Contains(err.Error(), "efi=false") {
		t.Fatalf("SetNextBootPXE(uefi) on ipmi_sim: %v, want boot_not_applied (EFI bit not kept)", err)
	}
	// wrong password: an error with reason auth, never a power state
	bad := tg
	bad.Password = "not-the-password"
	if st, err := c.PowerState(ctx, bad); !errors.Is(err, ErrAuth) || st != "" {
		t.Fatalf("wrong password: %q, %v (reason %q)", st, err, Reason(err))
	}
	if _, err := c.PowerState(ctx, bad); strings.Contains(err.Error(), bad.Password) || strings.Contains(err.Error(), pass) {
		t.Fatalf("password in error: %v", err)
	}
	// nothing answering (UDP: no refusal, ipmitool retransmits): timeout or unreachable, never auth
	gone := tg
	gone.Address = "10.74.1.3"
	fast, _ := New(Config{CallTimeout: 3 * time.Second, NoRetries: true, IPMICipherSuite: "3", IpmitoolPath: lab.wrapper}, nil)
	if _, err := fast.PowerState(ctx, gone); !errors.Is(err, ErrUnreachable) && !errors.Is(err, ErrTimeout) {
		t.Fatalf("absent BMC: %v (reason %q), want timeout or unreachable", err, Reason(err))
	}
	if _, err := c.Inventory(ctx, tg); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("IPMI inventory: %v, want ErrUnsupported", err)
	}
	t.Logf("chassis program calls:\n%s", lab.chassisLog())
}

func waitUntil(t *testing.T, what string, d time.Duration, f func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if f() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s", d, what)
}

// TestBenchIPMIPowerState compares one Controller.PowerState (bmclib ipmitool provider:
// session open + status, strict parse, locking, metrics) with one bare
// "ipmitool chassis power status" against the same ipmi_sim. Kiln's path runs
// ipmitool itself, so the ratio is Kiln's cost on top of the tool
// (note=kiln-runs-ipmitool).
func TestBenchIPMIPowerState(t *testing.T) {
	benchline.Need(t, true, "ip", "ipmi_sim", "ipmitool")
	const user, pass = "benchuser", "Bench-Pass-74"
	lab := startIPMILab(t, user, pass, []string{"/bin/true"})
	c, err := New(Config{IPMICipherSuite: "3", IpmitoolPath: lab.wrapper, NoRetries: true}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	tg := Target{Address: lab.addr, Driver: DriverIPMI, Username: user, Password: pass}
	ctx := context.Background()
	waitUntil(t, "ipmi_sim to answer", 10*time.Second, func() bool { _, err := c.PowerState(ctx, tg); return err == nil })
	const n = 20
	t0 := time.Now()
	for i := 0; i < n; i++ {
		if _, err := c.PowerState(ctx, tg); err != nil {
			t.Fatal(err)
		}
	}
	kiln := time.Since(t0).Seconds() / n
	t0 = time.Now()
	for i := 0; i < n; i++ {
		cmd := exec.Command(lab.wrapper, "-I", "lanplus", "-C", "3", "-H", lab.addr, "-U", user, "-E", "chassis", "power", "status")
		cmd.Env = []string{"IPMITOOL_PASSWORD=" + pass}
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "Chassis Power is") {
			t.Fatalf("ipmitool: %v %s", err, out)
		}
	}
	peer := time.Since(t0).Seconds() / n
	benchline.Print(t, benchline.Line{Name: "ipmi_power_state_seconds", Unit: "s", Kiln: kiln, Peer: &benchline.Peer{What: "ipmitool", Value: peer},
		Fields: []benchline.Field{{Key: "note", Value: "kiln-runs-ipmitool"}}})
}
