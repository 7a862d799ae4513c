package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/cmd/kiln-agent/agent"
	"kiln/deploy/lab/testreq"
)

// burnInConfig is the `burn_in:` section of the test: required, every
// test, seconds each (the e2e runs use the same order of magnitude).
const burnInConfig = `burn_in:
  mode: required
  default:
    tests: [cpu, memory, disk, nic]
    cpu_time: 1s
    memory_fraction: 0.5
    memory_max_bytes: 67108864
    memory_time: 1s
    disk_bytes: 16777216
    disk_regions: 8
    disk_time: 10s
    nics: provisioning
    nic_wait: 5s
`

// burnInLoop attaches a loop device of 64 MiB. faulty: its backing file
// lies in a tmpfs of 4 MiB, so the kernel fails every write past what the
// tmpfs holds — a disk that fails the write test over most of itself.
func burnInLoop(t *testing.T, faulty bool) string {
	t.Helper()
	dir := t.TempDir()
	if faulty {
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4194304", "kiln-burnin-serve", dir).CombinedOutput(); err != nil {
			t.Fatalf("mount tmpfs: %v\n%s", err, out)
		}
		t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	}
	file := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 64<<20); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-f", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v\n%s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		// Only while it is still ours: loop numbers are shared with other suites.
		if b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop/backing_file")); err == nil && strings.TrimSpace(string(b)) == file {
			_ = exec.Command("losetup", "-d", dev).Run()
		}
	})
	return dev
}

// TestServeBurnInDiskFault (issue 17, root): `kiln serve` with burn-in
// required and the real kiln-agent code on two machines, each with a real
// loop device as its only disk. The healthy one runs CPU, memory, disk
// and NIC tests and becomes available with a passing Machine.BurnIn; the
// one whose disk fails writes (an injected fault: its loop device's
// backing file cannot grow past 4 MiB) ends quarantined with reason
// burnin_disk_failed, its record naming the failed write, and never
// becomes available.
func TestServeBurnInDiskFault(t *testing.T) {
	testreq.Root(t, "loop devices and a tmpfs mount", "losetup", "mount", "umount")
	n := newServeNode(t, "burnin-1", nil)
	f, err := os.OpenFile(n.cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(burnInConfig); err != nil {
		t.Fatal(err)
	}
	f.Close()
	cfg, err := os.ReadFile(n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	bootAddr := regexp.MustCompile(`http_addr: (\S+)`).FindSubmatch(cfg)
	s := n.start(t)

	type machine struct {
		State   string `json:"state"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
		BurnIn  *struct {
			Passed bool   `json:"passed"`
			Reason string `json:"reason"`
			Policy string `json:"policy"`
			Tests  []struct {
				Name    string `json:"name"`
				Passed  bool   `json:"passed"`
				Skipped bool   `json:"skipped"`
				Bytes   uint64 `json:"bytes"`
				Error   string `json:"error"`
			} `json:"tests"`
		} `json:"burn_in"`
	}
	start := func(name, mac string, faulty bool) string {
		created, code, err := s.createMachine(name, mac)
		if err != nil || code != http.StatusCreated {
			t.Fatalf("create machine: %d %v", code, err)
		}
		resp, err := http.Get("http://" + string(bootAddr[1]) + "/ipxe/" + mac)
		if err != nil {
			t.Fatal(err)
		}
		script, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		tok := regexp.MustCompile(agentapi.ArgToken + `=(\S+)`).FindSubmatch(script)
		if tok == nil {
			t.Fatalf("boot script for %s has no agent token:\n%s", created.ID, script)
		}
		root := fakeRoot(t, mac, "0-1")
		if err := os.WriteFile(filepath.Join(root, "proc/meminfo"), []byte("MemTotal: 4194304 kB\nMemAvailable: 3145728 kB\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		dev := burnInLoop(t, faulty)
		var console strings.Builder
		a, err := agent.New(agent.Config{
			URL: s.api, MachineID: created.ID, Token: string(tok[1]), Root: root, IPMIDevice: filepath.Join(root, "no-ipmi"),
			ListDisks: func() ([]agentapi.Disk, error) {
				return []agentapi.Disk{{Name: filepath.Base(dev), Path: dev, Serial: "LOOP-" + name, SizeBytes: 64 << 20, Health: "ok"}}, nil
			},
			Console:   &syncBuilder{b: &console},
			Reboot:    func(bool) error { return nil },
			RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
		t.Cleanup(func() { cancel(); <-done; t.Logf("%s console:\n%s", name, console.String()) })
		return created.ID
	}
	t0 := time.Now()
	good := start("burnin-good", "02:00:00:00:b2:01", false)
	bad := start("burnin-bad", "02:00:00:00:b2:02", true)
	get := func(id string) machine {
		var m machine
		if code, err := s.do("GET", "/v1/machines/"+id, nil, &m); err != nil || code != http.StatusOK {
			t.Fatalf("get machine: %d %v", code, err)
		}
		return m
	}
	var g, b machine
	sawAvailable := false
	if !waitFor(90*time.Second, func() bool {
		g, b = get(good), get(bad)
		sawAvailable = sawAvailable || b.State == "available"
		return (g.State == "available" || g.State == "quarantined" || g.State == "failed") &&
			(b.State == "quarantined" || b.State == "available" || b.State == "failed")
	}) {
		t.Fatalf("after 90s: good %s (%s), bad %s (%s)\n%s", g.State, g.Reason, b.State, b.Reason, tail(s.log.String(), 3000))
	}
	took := time.Since(t0)
	if g.State != "available" || g.BurnIn == nil || !g.BurnIn.Passed || len(g.BurnIn.Tests) != 4 || g.BurnIn.Tests[2].Name != "disk" ||
		g.BurnIn.Tests[2].Bytes != 16<<20 || g.BurnIn.Tests[1].Bytes != 64<<20 {
		t.Fatalf("healthy machine: %s (%s %q), burn-in %+v", g.State, g.Reason, g.Message, g.BurnIn)
	}
	if b.State != "quarantined" || b.Reason != string(agentapi.ReasonBurnInDisk) || sawAvailable || b.BurnIn == nil || b.BurnIn.Passed ||
		b.BurnIn.Reason != string(agentapi.ReasonBurnInDisk) || len(b.BurnIn.Tests) != 4 || b.BurnIn.Tests[2].Passed ||
		!strings.Contains(b.BurnIn.Tests[2].Error, "write /dev/loop") || !b.BurnIn.Tests[3].Skipped || !b.BurnIn.Tests[0].Passed {
		t.Fatalf("faulty machine: %s (%s %q), burn-in %+v", b.State, b.Reason, b.Message, b.BurnIn)
	}
	// The failure is in the machine's event history.
	var evs struct {
		Events []struct {
			Subject string `json:"subject"`
			Kind    string `json:"kind"`
			To      string `json:"to"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"events"`
	}
	if code, err := s.do("GET", "/v1/events?after=0&limit=1000", nil, &evs); err != nil || code != http.StatusOK {
		t.Fatalf("events: %d %v", code, err)
	}
	var trail []string
	for _, ev := range evs.Events {
		if ev.Subject == "machine/"+bad && ev.Reason == string(agentapi.ReasonBurnInDisk) {
			trail = append(trail, ev.Kind+" "+ev.To)
		}
	}
	if !strings.Contains(strings.Join(trail, ","), "step failed") || !strings.Contains(strings.Join(trail, ","), "quarantined") {
		t.Fatalf("events with burnin_disk_failed: %v (all: %+v)", trail, evs.Events)
	}
	t.Logf("both decided in %s: good available (%s); bad quarantined: %s", took.Round(time.Millisecond), g.Message, b.Message)
}

type syncBuilder struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
