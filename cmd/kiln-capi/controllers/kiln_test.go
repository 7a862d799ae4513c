package controllers

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/api"
	"kiln/api/agentapi"
	kclient "kiln/api/client"
	"kiln/appliance"
	"kiln/deploy/lab/vbmc/vbmc"
	"kiln/store"
)

// testKiln is a real Kiln appliance in this process, on loopback (the
// embedded default configuration with no provisioning interface, as
// kiln/appliance's own tests run it), with an admin client.
type testKiln struct {
	api, boot string
	token     string
	cl        *kclient.Client
	image     api.Image
	imageBody []byte
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func startKiln(t *testing.T) *testKiln {
	t.Helper()
	cfg := appliance.DefaultConfig()
	cfg.NodeID, cfg.DataDir = "kiln-capi-test", filepath.Join(t.TempDir(), "kiln")
	cfg.API.Addr, cfg.Raft.Addr, cfg.Raft.ForwardAddr, cfg.Boot.HTTPAddr = freePort(t), freePort(t), freePort(t), freePort(t)
	cfg.Lifecycle.AgentPollAfter = 200 * time.Millisecond
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	app, err := appliance.New(cfg, "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("kiln: Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("kiln did not stop within 20 s")
		}
	})
	tok, err := os.ReadFile(cfg.API.AdminTokenFile)
	if err != nil {
		t.Fatal(err)
	}
	k := &testKiln{api: "http://" + cfg.API.Addr, boot: "http://" + cfg.Boot.HTTPAddr, token: strings.TrimSpace(string(tok))}
	if k.cl, err = kclient.New(kclient.Config{Server: k.api, Token: k.token}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := k.cl.Ready(context.Background()); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("kiln not ready within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A plain image: 1 MiB the simulated agents download and hash.
	k.imageBody = bytes.Repeat([]byte("kiln capi test image\n"), 50000)
	sum := sha256.Sum256(k.imageBody)
	k.image, err = k.cl.UploadImage(context.Background(), kclient.ImageMeta{Name: "capi-test", Version: "1",
		SHA256: hex.EncodeToString(sum[:])}, bytes.NewReader(k.imageBody), int64(len(k.imageBody)))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// simMachine is one server of the test site: a Kiln machine record, a
// Redfish BMC (deploy/lab/vbmc, the virtual BMC the fleet simulator uses)
// through which Kiln powers it on and off, and an in-RAM agent that
// speaks the real boot and agent protocols (the iPXE script from
// httpboot, then /v1/agent/register, task, report) the way
// cmd/kiln-agent does, with a disk that is only hashed. Each power-on
// netboots: Kiln's script says run the agent, or boot the local disk
// (then it idles, as an installed OS, until powered off).
type simMachine struct {
	k      *testKiln
	t      *testing.T
	id     string
	mac    string
	serial string

	mu       sync.Mutex
	on       bool
	cancel   context.CancelFunc
	userData string // the user-data of the last stage step's task
	boots    int
	erased   int
}

const bmcUser, bmcPass = "admin", "capi-test-bmc-pass"

// addMachine creates Kiln machine i with labels and enrolls its BMC (a
// vbmc on loopback); Kiln inspects it through the BMC (power on, netboot).
func (k *testKiln) addMachine(t *testing.T, ctx context.Context, i int, labels map[string]string, rack string) *simMachine {
	t.Helper()
	m := &simMachine{k: k, t: t, mac: fmt.Sprintf("02:00:00:ca:00:%02x", i), serial: fmt.Sprintf("CAPI%04d", i)}
	vb, err := vbmc.New(vbmc.Config{Listen: "127.0.0.1:0", Username: bmcUser, Password: bmcPass, NoRequestLog: true,
		Systems: []vbmc.SystemConfig{{ID: "1", Serial: m.serial, Manufacturer: "QEMU", Model: "capi-sim", MACs: []string{m.mac}, Power: m}}})
	if err != nil {
		t.Fatal(err)
	}
	vctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = vb.Run(vctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() { cancel(); <-done; _ = m.PowerOff() })
	rec, err := k.cl.CreateMachine(ctx, api.MachineSpec{Name: fmt.Sprintf("srv-%02d", i), Labels: labels, Rack: rack,
		Intended: store.Hardware{Serial: m.serial, NICs: []store.NIC{{Name: "eth0", MAC: m.mac}}},
		RootDisk: store.DiskRule{MinSizeBytes: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	m.id = rec.ID
	if _, err := k.cl.EnrollBMC(ctx, m.id, api.BMCEnrollRequest{Address: vb.Addr(), Driver: "redfish", Username: bmcUser,
		Password: bmcPass, InsecureTLS: true}); err != nil {
		t.Fatal(err)
	}
	return m
}

// PowerOn starts a boot (vbmc.Power).
func (m *simMachine) PowerOn(override, mode string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.on {
		return nil
	}
	m.on = true
	m.boots++
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go m.run(ctx)
	return nil
}

// PowerOff ends the running boot at once (vbmc.Power).
func (m *simMachine) PowerOff() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cancel != nil {
		m.cancel()
	}
	m.on = false
	return nil
}

// PoweredOn reports the power state (vbmc.Power).
func (m *simMachine) PoweredOn() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.on
}

// run is one power-on: netboot; run the agent Kiln's script names; a build
// ends in a reboot (netboot again); told to boot the local disk, the
// installed OS runs until the power goes.
func (m *simMachine) run(ctx context.Context) {
	for ctx.Err() == nil {
		act, err := m.script(ctx)
		if err != nil {
			if ctx.Err() == nil {
				m.t.Logf("machine %s: %v", m.id, err)
			}
			sleep(ctx, time.Second)
			continue
		}
		switch act.action {
		case "agent", "discover":
			off, err := m.agent(ctx, act)
			if err != nil && ctx.Err() == nil {
				m.t.Logf("machine %s: agent: %v", m.id, err)
				sleep(ctx, time.Second)
			}
			if off {
				_ = m.PowerOff()
				return
			}
		case "local":
			<-ctx.Done()
			return
		default: // retry
			sleep(ctx, time.Second)
		}
	}
}

type bootAct struct{ action, url, token string }

func (m *simMachine) script(ctx context.Context) (bootAct, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", m.k.boot+"/ipxe/"+m.mac, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return bootAct{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != 200 {
		return bootAct{}, fmt.Errorf("ipxe script: HTTP %d", resp.StatusCode)
	}
	var a bootAct
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 3 && f[0] == "#" && f[1] == "kiln:":
			a.action = strings.TrimPrefix(f[2], "action=")
		case len(f) > 0 && f[0] == "kernel":
			for _, w := range f[1:] {
				if v, ok := strings.CutPrefix(w, agentapi.ArgURL+"="); ok {
					a.url = v
				}
				if v, ok := strings.CutPrefix(w, agentapi.ArgToken+"="); ok {
					a.token = v
				}
			}
		}
	}
	if a.action == "" {
		return a, fmt.Errorf("ipxe script without an action:\n%s", b)
	}
	return a, nil
}

func (m *simMachine) call(ctx context.Context, a bootAct, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(a.url, "/")+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set(agentapi.HeaderMachine, m.id)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(rb))
	}
	if out != nil {
		return json.Unmarshal(rb, out)
	}
	return nil
}

const simDisk = 64 << 30

// agent is one boot's agent: register with the inventory, then poll and
// run tasks until a build reboots the machine, or a poweroff task (off).
func (m *simMachine) agent(ctx context.Context, a bootAct) (off bool, err error) {
	inv := agentapi.Inventory{Vendor: "QEMU", Product: "capi-sim", Serial: m.serial, CPUs: 4, MemoryBytes: 8 << 30,
		Disks: []agentapi.Disk{{Name: "sda", Path: "/dev/sda", Serial: "D" + m.serial, Model: "SIM", SizeBytes: simDisk, Health: "ok"}},
		NICs:  []agentapi.NIC{{Name: "eth0", MAC: m.mac, LinkUp: true}}}
	var task agentapi.Task
	if err := m.call(ctx, a, "POST", "/v1/agent/register", agentapi.Registration{MachineID: m.id, AgentVersion: "capi-sim", Inventory: inv}, &task); err != nil {
		return false, err
	}
	report := func(r agentapi.Report) error {
		r.MachineID, r.Attempt = m.id, task.Attempt
		return m.call(ctx, a, "POST", "/v1/agent/report", r, nil)
	}
	registered := true // the task answers a registration that has just sent the inventory
	for ctx.Err() == nil {
		switch task.Action {
		case agentapi.ActionInspect:
			if !registered { // inspected again (after an erase): the inventory once more
				var next agentapi.Task
				if err := m.call(ctx, a, "POST", "/v1/agent/register", agentapi.Registration{MachineID: m.id, AgentVersion: "capi-sim", Inventory: inv}, &next); err != nil {
					return false, err
				}
				task, registered = next, true
				continue
			}
		case agentapi.ActionProvision:
			return false, m.build(ctx, a, &task, report)
		case agentapi.ActionErase:
			now := time.Now().UTC()
			_ = report(agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateStarted})
			if err := report(agentapi.Report{Step: agentapi.StepErase, State: agentapi.StateSucceeded, Progress: 1, Message: "1 of 1 disks erased",
				Erase: []agentapi.DiskErase{{Name: "sda", Path: "/dev/sda", Serial: "D" + m.serial, Model: "SIM", SizeBytes: simDisk,
					Transport: "ata", Method: agentapi.EraseATASecurityEnhanced, Outcome: agentapi.EraseErased,
					Verification: "sample: 1024 blocks of 4 KiB read zeros", Verified: true, Coverage: 1024 * 4096 / float64(simDisk),
					Started: now, Ended: now, Attempts: []agentapi.EraseAttempt{{Method: agentapi.EraseATASecurityEnhanced, Outcome: agentapi.EraseErased}}}}}); err != nil {
				return false, err
			}
			m.mu.Lock()
			m.erased++
			m.mu.Unlock()
		case agentapi.ActionPowerOff:
			return true, nil
		}
		registered = false
		sleep(ctx, 200*time.Millisecond)
		var next agentapi.Task
		if err := m.call(ctx, a, "GET", "/v1/agent/task", nil, &next); err != nil {
			return false, err
		}
		task = next
	}
	return false, ctx.Err()
}

// build runs a provision task's steps: check, write (the image fetched
// and hashed against the task's digest), verify, stage (the claim's
// user-data kept, as the real agent writes it to the cidata partition),
// finalize, reboot.
func (m *simMachine) build(ctx context.Context, a bootAct, task *agentapi.Task, report func(agentapi.Report) error) error {
	img := task.Image
	if img == nil {
		return fmt.Errorf("provision task without an image")
	}
	step := func(name string, fn func() (string, error)) error {
		if err := report(agentapi.Report{Step: name, State: agentapi.StateStarted}); err != nil {
			return err
		}
		msg, err := fn()
		if err != nil {
			_ = report(agentapi.Report{Step: name, State: agentapi.StateFailed, Reason: agentapi.ReasonInternal, Message: err.Error()})
			return err
		}
		return report(agentapi.Report{Step: name, State: agentapi.StateSucceeded, Progress: 1, Message: msg})
	}
	steps := []struct {
		name string
		fn   func() (string, error)
	}{
		{agentapi.StepCheck, func() (string, error) { return "disk /dev/sda ok", nil }},
		{agentapi.StepWrite, func() (string, error) {
			req, _ := http.NewRequestWithContext(ctx, "GET", img.URL, nil)
			req.Header.Set("Authorization", "Bearer "+a.token)
			req.Header.Set(agentapi.HeaderMachine, m.id)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return "", err
			}
			defer resp.Body.Close()
			h := sha256.New()
			n, err := io.Copy(h, resp.Body)
			if err != nil || resp.StatusCode != 200 {
				return "", fmt.Errorf("image fetch: HTTP %d: %v", resp.StatusCode, err)
			}
			if got := hex.EncodeToString(h.Sum(nil)); got != strings.ToLower(img.SHA256) {
				return "", fmt.Errorf("image sha256 %s, want %s", got, img.SHA256)
			}
			return fmt.Sprintf("%d bytes", n), nil
		}},
		{agentapi.StepVerify, func() (string, error) { return "sha256 " + img.SHA256, nil }},
	}
	if task.Stage != nil {
		steps = append(steps, struct {
			name string
			fn   func() (string, error)
		}{agentapi.StepStage, func() (string, error) {
			m.mu.Lock()
			m.userData = task.Stage.UserData
			m.mu.Unlock()
			return "cidata partition 2", nil
		}})
	}
	for _, s := range steps {
		if err := step(s.name, s.fn); err != nil {
			return err
		}
	}
	if err := report(agentapi.Report{Step: agentapi.StepFinalize, State: agentapi.StateStarted}); err != nil {
		return err
	}
	written := map[string]string{"disk": "/dev/sda", "disk_name": "sda", "bytes": fmt.Sprint(img.Size), "sha256": strings.ToLower(img.SHA256), "sector_size": "512"}
	if err := report(agentapi.Report{Step: agentapi.StepFinalize, State: agentapi.StateSucceeded, Progress: 1, Written: written}); err != nil {
		return err
	}
	return report(agentapi.Report{Step: agentapi.StepReboot, State: agentapi.StateStarted})
}

func (m *simMachine) staged() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.userData
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
