package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/cmd/kiln-agent/agent"
)

// fakeRoot writes the files inventory.Collect reads (meminfo, online CPUs,
// one NIC with mac) under a temp dir, so an in-process agent reports a
// machine that matches a record whose only intended field is that MAC.
func fakeRoot(t *testing.T, mac, cpusOnline string) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"proc/meminfo":                  "MemTotal:        4194304 kB\n",
		"sys/devices/system/cpu/online": cpusOnline + "\n",
		"sys/class/net/eth0/type":       "1\n",
		"sys/class/net/eth0/address":    mac + "\n",
		"sys/class/net/eth0/operstate":  "up\n",
	}
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "sys/block"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestServeReinspectRunningAgent (issue 11): `kiln serve` and the real
// kiln-agent code. The machine netboots (GET /ipxe/{mac} on the boot
// server gives its token), the agent registers and the machine is
// available; POST /v1/machines/{id}/inspect then reaches the running
// agent at its next poll, which collects its inventory again (CPUs 2 → 4
// here) and registers with it: the machine is available again with the new
// hardware, within seconds, not after the 15 min boot timeout.
func TestServeReinspectRunningAgent(t *testing.T) {
	n := newServeNode(t, "agent-1", nil)
	cfg, err := os.ReadFile(n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	bootAddr := regexp.MustCompile(`http_addr: (\S+)`).FindSubmatch(cfg)
	if bootAddr == nil {
		t.Fatalf("no boot http_addr in %s", cfg)
	}
	s := n.start(t)
	const mac = "02:00:00:00:e2:01"
	created, code, err := s.createMachine("reinspect-1", mac)
	if err != nil || code != http.StatusCreated {
		t.Fatalf("create machine: %d %v", code, err)
	}
	id := created.ID

	resp, err := http.Get("http://" + string(bootAddr[1]) + "/ipxe/" + mac)
	if err != nil {
		t.Fatal(err)
	}
	script, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	tok := regexp.MustCompile(agentapi.ArgToken + `=(\S+)`).FindSubmatch(script)
	if tok == nil || !strings.Contains(string(script), agentapi.ArgMachine+"="+id) {
		t.Fatalf("boot script for %s has no agent token:\n%s", id, script)
	}

	root := fakeRoot(t, mac, "0-1")
	a, err := agent.New(agent.Config{
		URL: s.api, MachineID: id, Token: string(tok[1]), Root: root, IPMIDevice: filepath.Join(root, "no-ipmi"),
		ListDisks: func() ([]agentapi.Disk, error) {
			return []agentapi.Disk{{Name: "vda", Path: "/dev/vda", SizeBytes: 20 << 30, Health: "ok"}}, nil
		},
		Reboot:    func(bool) error { return nil },
		RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() { cancel(); <-done })

	type machine struct {
		State      string `json:"state"`
		Reason     string `json:"reason"`
		Discovered *struct {
			CPUs int `json:"cpus"`
		} `json:"discovered"`
	}
	get := func() machine {
		var m machine
		if code, err := s.do("GET", "/v1/machines/"+id, nil, &m); err != nil || code != http.StatusOK {
			t.Fatalf("get machine: %d %v", code, err)
		}
		return m
	}
	waitAvailable := func(what string, cpus int) time.Duration {
		start := time.Now()
		var m machine
		if !waitFor(60*time.Second, func() bool {
			m = get()
			return m.State == "available" && m.Discovered != nil && m.Discovered.CPUs == cpus
		}) {
			t.Fatalf("%s: machine %s is %s (%s), discovered %+v; want available with %d CPUs\n%s", what, id, m.State, m.Reason, m.Discovered, cpus, tail(s.log.String(), 3000))
		}
		return time.Since(start)
	}
	waitAvailable("first registration", 2)

	// Two more CPUs come online; the agent keeps running.
	if err := os.WriteFile(filepath.Join(root, "sys/devices/system/cpu/online"), []byte("0-3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var after machine
	if code, err := s.do("POST", "/v1/machines/"+id+"/inspect", map[string]any{}, &after); err != nil || code != http.StatusAccepted || after.State != "inspecting" {
		t.Fatalf("inspect: %d %v, machine %+v", code, err, after)
	}
	took := waitAvailable("re-inspection", 4)
	if m := get(); m.Reason != "inspection_passed" {
		t.Fatalf("re-inspected: reason %q", m.Reason)
	}
	t.Logf("re-inspection by the running agent took %s", took.Round(time.Millisecond))
}
