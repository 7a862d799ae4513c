package ipmilab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Errors of Start.
var (
	// ErrOptions: a required Options field is empty.
	ErrOptions = errors.New("ipmilab: bad options")
	// ErrNotReady: ipmi_sim did not answer ipmitool within the probe window.
	ErrNotReady = errors.New("ipmilab: ipmi_sim did not answer")
)

// Options of one lab BMC.
type Options struct {
	NetNS string // network namespace ipmi_sim runs in (exists already)
	// ProbeNetNS is where the readiness probe's ipmitool runs; "" means NetNS.
	ProbeNetNS string
	Name       string // BMC name in lan.conf; "" means "kiln-lab-bmc"
	Addr       string // IPv4 address ipmi_sim listens on, inside NetNS
	Port       int    // UDP port; 0 means 623
	User       string // the one admin user (user ID 2)
	Password   string
	StateDir   string   // lan.conf, qemu.args, logs, the chassis program's files (created)
	LabDir     string   // deploy/lab/ipmi: lan.conf.in, bmc.emu, sensors.emu.in, chassis.sh
	QEMUArgs   []string // the VM's command line, one argument a line in StateDir/qemu.args
	// DieWithParent kills ipmi_sim when the process that started it dies
	// (Pdeathsig), e.g. for tests; the lab demo leaves it running instead.
	DieWithParent bool
}

// BMC is a running ipmi_sim. StateDir holds ipmi_sim.log and the chassis
// program's chassis.log, boots.log, boot, serial-N.log and qmp-N.sock.
type BMC struct {
	Addr     string // IPv4 address
	Port     int    // UDP port
	StateDir string
	cmd      *exec.Cmd
	done     chan struct{} // closed when ipmi_sim has exited and its log is closed
}

// Start writes StateDir/qemu.args, StateDir/lan.conf, StateDir/bmc.emu (the lab's
// bmc.emu and sensors.emu.in) and StateDir/cpu-temp (NormalCPUTemp), starts ipmi_sim in
// o.NetNS (its persistent state in StateDir/sim, output in
// StateDir/ipmi_sim.log) and probes it with ipmitool (one try every ~200 ms,
// 50 tries) until it answers. On a failed probe it stops ipmi_sim and returns
// an error wrapping ErrNotReady; ctx bounds the probes only.
func Start(ctx context.Context, o Options) (*BMC, error) {
	if o.NetNS == "" || o.Addr == "" || o.User == "" || o.StateDir == "" || o.LabDir == "" || len(o.QEMUArgs) == 0 {
		return nil, fmt.Errorf("%w: NetNS, Addr, User, StateDir, LabDir and QEMUArgs are required", ErrOptions)
	}
	if o.ProbeNetNS == "" {
		o.ProbeNetNS = o.NetNS
	}
	if o.Name == "" {
		o.Name = "kiln-lab-bmc"
	}
	if o.Port == 0 {
		o.Port = 623
	}
	simState := filepath.Join(o.StateDir, "sim")
	if err := os.MkdirAll(simState, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.StateDir, "qemu.args"), []byte(strings.Join(o.QEMUArgs, "\n")+"\n"), 0o644); err != nil {
		return nil, err
	}
	tmpl, err := os.ReadFile(filepath.Join(o.LabDir, "lan.conf.in"))
	if err != nil {
		return nil, err
	}
	conf := strings.NewReplacer("@NAME@", o.Name, "@ADDR@", o.Addr, "@PORT@", strconv.Itoa(o.Port),
		"@USER@", o.User, "@PASSWORD@", o.Password, "@CHASSIS@", filepath.Join(o.LabDir, "chassis.sh"),
		"@STATEDIR@", o.StateDir).Replace(string(tmpl))
	// the command file: bmc.emu, then the sensors (sensors.emu.in with @STATEDIR@ filled),
	// whose CPU temperature reading ipmi_sim polls from StateDir/cpu-temp
	emu, err := os.ReadFile(filepath.Join(o.LabDir, "bmc.emu"))
	if err != nil {
		return nil, err
	}
	sensors, err := os.ReadFile(filepath.Join(o.LabDir, "sensors.emu.in"))
	if err != nil {
		return nil, err
	}
	emuPath := filepath.Join(o.StateDir, "bmc.emu")
	emu = append(append(emu, '\n'), strings.ReplaceAll(string(sensors), "@STATEDIR@", o.StateDir)...)
	if err := os.WriteFile(emuPath, emu, 0o644); err != nil {
		return nil, err
	}
	// ipmi_sim persists the main SDR repository (mc_add persist_sdr) under
	// sim/ipmi_sim/NAME; the command file adds the sensor's record at every start, so a
	// restart on the same StateDir drops the old copy first
	if err := os.Remove(filepath.Join(simState, "ipmi_sim", o.Name, "sdr.20.main")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	b0 := &BMC{StateDir: o.StateDir}
	if err := b0.SetCPUTemp(NormalCPUTemp); err != nil {
		return nil, err
	}
	confPath := filepath.Join(o.StateDir, "lan.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(o.StateDir, "ipmi_sim.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", "netns", "exec", o.NetNS, "ipmi_sim", "-c", confPath,
		"-f", emuPath, "-s", simState, "-n")
	cmd.Stdout, cmd.Stderr = logf, logf
	if o.DieWithParent {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	b := &BMC{Addr: o.Addr, Port: o.Port, StateDir: o.StateDir, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(b.done) }()
	for i := 0; i < 50; i++ {
		probe := exec.CommandContext(ctx, "ip", "netns", "exec", o.ProbeNetNS, "ipmitool", "-I", "lanplus", "-C", "3",
			"-H", o.Addr, "-p", strconv.Itoa(o.Port), "-U", o.User, "-P", o.Password, "-N", "1", "-R", "1",
			"chassis", "power", "status")
		if probe.Run() == nil {
			return b, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	b.Close()
	return nil, fmt.Errorf("%w on %s:%d (see %s)", ErrNotReady, o.Addr, o.Port, logPath)
}

// NormalCPUTemp is the lab BMC's CPU Temp reading at start (degrees C); its
// thresholds are 80 (upper non-critical) and 90 (upper critical), see
// deploy/lab/ipmi/sensors.emu.in.
const NormalCPUTemp = 40

// SetCPUTemp sets the reading of the BMC's "CPU Temp" sensor (sensor 1,
// degrees C, 0..255): ipmi_sim reads it from StateDir/cpu-temp within
// ~500 ms, and logs SEL threshold events when it crosses 80 or 90.
func (b *BMC) SetCPUTemp(c int) error {
	if c < 0 || c > 255 {
		return fmt.Errorf("%w: CPU temperature %d outside 0..255", ErrOptions, c)
	}
	p := filepath.Join(b.StateDir, "cpu-temp")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(c)+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// Close stops ipmi_sim (SIGKILL) and every VM the chassis program started
// (by the pids in boots.log). It leaves StateDir as it is.
func (b *BMC) Close() error {
	_ = b.cmd.Process.Kill()
	<-b.done
	for _, line := range b.Boots() {
		if fs := strings.Fields(line); len(fs) > 1 {
			if pid, err := strconv.Atoi(fs[1]); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	return nil
}

// Boots returns the chassis program's journal of VM starts (boots.log), one
// line per start: "N PID boot=DEV ARGS...".
func (b *BMC) Boots() []string {
	f, err := os.Open(filepath.Join(b.StateDir, "boots.log"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if s := strings.TrimSpace(sc.Text()); s != "" {
			out = append(out, s)
		}
	}
	return out
}
