package lifecycle

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/bmc"
	"kiln/store"
)

// ipmiAdapter is lifecycle.BMC over kiln/bmc and the store's sealed
// credential (the same shape as the appliance's adapter).
type ipmiAdapter struct {
	st     *store.Store
	sealer *bmc.Sealer
	ctl    *bmc.Controller
}

func (a *ipmiAdapter) target(id string) (bmc.Target, error) {
	m, err := a.st.GetMachine(id)
	if err != nil {
		return bmc.Target{}, err
	}
	rec, err := a.st.GetBMC(m.BMC)
	if err != nil {
		return bmc.Target{}, err
	}
	sealed, err := a.st.Secret(rec.CredentialRef)
	if err != nil {
		return bmc.Target{}, err
	}
	pw, err := a.sealer.Open(sealed)
	if err != nil {
		return bmc.Target{}, err
	}
	return bmc.Target{Address: rec.Address, Driver: rec.Driver, Username: rec.Username, Password: string(pw)}, nil
}

func (a *ipmiAdapter) PowerOn(ctx context.Context, id string) error {
	t, err := a.target(id)
	if err != nil {
		return err
	}
	return a.ctl.Power(ctx, t, bmc.ActionOn)
}

func (a *ipmiAdapter) PowerOff(ctx context.Context, id string) error {
	t, err := a.target(id)
	if err != nil {
		return err
	}
	return a.ctl.Power(ctx, t, bmc.ActionOff)
}

func (a *ipmiAdapter) PowerCycle(ctx context.Context, id string) error {
	t, err := a.target(id)
	if err != nil {
		return err
	}
	st, err := a.ctl.PowerState(ctx, t)
	if err != nil {
		return err
	}
	if st == bmc.PowerOff {
		return a.ctl.Power(ctx, t, bmc.ActionOn)
	}
	return a.ctl.Power(ctx, t, bmc.ActionCycle)
}

func (a *ipmiAdapter) SetNextBootPXE(ctx context.Context, id string, mode store.BootMode) error {
	t, err := a.target(id)
	if err != nil {
		return err
	}
	m := bmc.BootLegacy
	if mode == store.BootModeUEFI {
		m = bmc.BootUEFI
	}
	return a.ctl.SetNextBootPXE(ctx, t, m)
}

type sealerFunc func([]byte) []byte

func (f sealerFunc) Seal(p []byte) ([]byte, error) { return f(p), nil }

func needRootBins(t *testing.T, bins ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespace and ipmi_sim")
	}
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("needs %s: not installed", b)
		}
	}
}

func sh(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// TestIPMIAutoInspection: a registered machine whose BMC is a real
// OpenIPMI ipmi_sim (in its own network namespace "klc-PID", address on the
// namespace's loopback) is driven by the controller through kiln/bmc and
// ipmitool: the chassis program sees "next boot PXE" then "power on", and
// the machine goes inspecting with two succeeded jobs. The "server" the
// chassis program starts is a sleep process (the VM boot itself is covered
// by kiln/bmc's and the lab's qemu tests).
func TestIPMIAutoInspection(t *testing.T) {
	if testing.Short() {
		t.Skip("short: ipmi_sim")
	}
	needRootBins(t, "ip", "ipmi_sim", "ipmitool", "setsid")
	labDir, err := filepath.Abs("../../deploy/lab/ipmi")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(labDir, "lan.conf.in")); err != nil {
		t.Skipf("needs deploy/lab/ipmi: %v", err)
	}
	const user, pass, addr = "kilnlc", "Lc-Secret-75x", "10.75.1.2"
	ns := fmt.Sprintf("klc-%d", os.Getpid()%100000)
	state := t.TempDir()
	sh(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", ns).Run() })
	sh(t, "ip", "-n", ns, "link", "set", "lo", "up")
	sh(t, "ip", "-n", ns, "addr", "add", addr+"/24", "dev", "lo")
	// The chassis program appends -qmp/-serial/-boot arguments: sh -c ignores them.
	must(t, os.WriteFile(filepath.Join(state, "qemu.args"), []byte("/bin/sh\n-c\nexec sleep 120\nfake-server\n"), 0o600))
	tmpl, err := os.ReadFile(filepath.Join(labDir, "lan.conf.in"))
	must(t, err)
	conf := strings.NewReplacer("@NAME@", "klc", "@ADDR@", addr, "@PORT@", "623", "@USER@", user, "@PASSWORD@", pass,
		"@CHASSIS@", filepath.Join(labDir, "chassis.sh"), "@STATEDIR@", state).Replace(string(tmpl))
	confPath := filepath.Join(state, "lan.conf")
	must(t, os.WriteFile(confPath, []byte(conf), 0o600))
	simState := filepath.Join(state, "sim")
	must(t, os.MkdirAll(simState, 0o700))
	logf, err := os.Create(filepath.Join(state, "ipmi_sim.log"))
	must(t, err)
	sim := exec.Command("ip", "netns", "exec", ns, "ipmi_sim", "-c", confPath, "-f", filepath.Join(labDir, "bmc.emu"), "-s", simState, "-n")
	sim.Stdout, sim.Stderr = logf, logf
	sim.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	must(t, sim.Start())
	t.Cleanup(func() {
		_ = sim.Process.Kill()
		_ = sim.Wait()
		logf.Close()
		if f, err := os.Open(filepath.Join(state, "boots.log")); err == nil { // end the fake servers by pid
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if fs := strings.Fields(sc.Text()); len(fs) > 1 {
					if pid, err := strconv.Atoi(fs[1]); err == nil && pid > 1 {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
			f.Close()
		}
		if t.Failed() {
			for _, n := range []string{"ipmi_sim.log", "chassis.log", "boots.log"} {
				b, _ := os.ReadFile(filepath.Join(state, n))
				t.Logf("--- %s:\n%s", n, b)
			}
		}
	})
	ipPath, _ := exec.LookPath("ip")
	itPath, _ := exec.LookPath("ipmitool")
	wrapper := filepath.Join(state, "ipmitool-netns")
	must(t, os.WriteFile(wrapper, []byte(fmt.Sprintf("#!/bin/sh\nexec %s netns exec %s %s \"$@\"\n", ipPath, ns, itPath)), 0o700))

	ctl, err := bmc.New(bmc.Config{CallTimeout: 15 * time.Second, BackoffBase: 200 * time.Millisecond, IPMICipherSuite: "3",
		IpmitoolPath: wrapper, IPMIIgnoreValidBit: true}, prometheus.NewRegistry())
	must(t, err)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	sealer, err := bmc.NewSealer(key)
	must(t, err)
	st := openRealStore(t)
	clk := &clock{t: time.Now().UTC()}
	c, err := New(Config{ImageBaseURL: "http://10.99.0.1:8080", Interval: 100 * time.Millisecond, Now: clk.Now,
		Sealer: sealerFunc(sealer.Seal)}, st, &ipmiAdapter{st: st, sealer: sealer, ctl: ctl}, prometheus.NewRegistry())
	must(t, err)
	res, err := c.Import(bg, strings.NewReader("name,macs,boot_mode\nipmi-1,52:54:00:75:01:02,legacy\n"), "csv", store.W{Actor: "test"})
	must(t, err)
	id := res.IDs[0]
	_, err = c.EnrollBMC(bg, id, store.BMC{Address: addr, Driver: "ipmi", Username: user}, pass, store.W{Actor: "test"})
	must(t, err)

	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, nil) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(60 * time.Second)
	var m store.Machine
	for {
		m, err = st.GetMachine(id)
		must(t, err)
		if m.State == store.StateInspecting || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if m.State != store.StateInspecting || m.Reason != ReasonInspectionStarted {
		jobs, _ := st.ListJobs(id)
		t.Fatalf("machine %s reason %q %q; jobs %+v", m.State, m.Reason, m.Message, jobs)
	}
	boots, _ := os.ReadFile(filepath.Join(state, "boots.log"))
	if lines := strings.Split(strings.TrimSpace(string(boots)), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "boot=pxe") {
		t.Fatalf("chassis starts %q: want one start with boot=pxe", boots)
	}
	jobs, err := st.ListJobs(id)
	must(t, err)
	kinds := map[string]string{}
	for _, j := range jobs {
		kinds[j.Kind] = j.State
	}
	if len(jobs) != 2 || kinds[JobBootPXE] != JobSucceeded || kinds[JobPowerCycle] != JobSucceeded {
		t.Fatalf("jobs %+v", jobs)
	}
}
