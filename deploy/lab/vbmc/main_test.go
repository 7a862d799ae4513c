package main

import (
	"context"
	"kiln/deploy/lab/testkit"
	"kiln/deploy/lab/testreq"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBinaryWithCurl builds the vbmc command, runs it on loopback and talks to it with
// curl (a real Redfish-agnostic HTTPS client): unauthenticated service root, 401 without
// credentials, the system with Basic auth, the health knob, a power-on that fails cleanly
// because the VM command is /bin/false, and a clean exit on SIGTERM.
func TestBinaryWithCurl(t *testing.T) {
	testreq.Commands(t, "curl")
	curl, _ := exec.LookPath("curl")
	dir := t.TempDir()
	bin := filepath.Join(dir, "vbmc")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	pw := filepath.Join(dir, "pw")
	args := filepath.Join(dir, "vm.args")
	_ = os.WriteFile(pw, []byte("curl-Secret-1\n"), 0o600)
	_ = os.WriteFile(args, []byte("# no VM here\n/bin/false\n"), 0o600)
	addr := testkit.FreeAddrs(t, 1)[0] // below the ephemeral range: no client takes it first
	cmd := exec.Command(bin, "--listen", addr, "--password-file", pw, "--qemu-args-file", args,
		"--state-dir", filepath.Join(dir, "state"), "--quirk", "reject-mode", "--mac", "52:54:00:74:00:09")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	get := func(extra ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a := append([]string{"-sk", "-w", "\n%{http_code}"}, extra...)
		out, _ := exec.CommandContext(ctx, curl, a...).Output()
		return string(out)
	}
	base := "https://" + addr
	var root string
	for i := 0; i < 50 && !strings.Contains(root, "RedfishVersion"); i++ {
		time.Sleep(100 * time.Millisecond)
		root = get(base + "/redfish/v1/")
	}
	if !strings.HasSuffix(root, "200") || !strings.Contains(root, `"RedfishVersion"`) {
		t.Fatalf("service root: %q\nstderr: %s", root, stderr.String())
	}
	if out := get(base + "/redfish/v1/Systems/1"); !strings.HasSuffix(out, "401") {
		t.Fatalf("no credentials: %q", out)
	}
	out := get("-u", "admin:curl-Secret-1", base+"/redfish/v1/Systems/1")
	if !strings.HasSuffix(out, "200") || !strings.Contains(out, `"PowerState":"Off"`) {
		t.Fatalf("system: %q", out)
	}
	out = get("-u", "admin:curl-Secret-1", "-X", "PATCH", "-H", "Content-Type: application/json",
		"-d", `{"Boot":{"BootSourceOverrideMode":"UEFI"}}`, base+"/redfish/v1/Systems/1")
	if !strings.HasSuffix(out, "400") || !strings.Contains(out, "PropertyNotWritable") {
		t.Fatalf("reject-mode quirk: %q", out)
	}
	// the health knob, as a lab script drives it
	out = get("-u", "admin:curl-Secret-1", "-X", "POST", "-d", `{"system":"Critical","chassis":"OK","event":"CPU1 IERR"}`,
		base+"/vbmc/control/systems/1/health")
	if !strings.HasSuffix(out, "200") || !strings.Contains(out, `"system":"Critical"`) {
		t.Fatalf("health knob: %q", out)
	}
	out = get("-u", "admin:curl-Secret-1", base+"/redfish/v1/Systems/1")
	if !strings.Contains(out, `"Health":"Critical"`) {
		t.Fatalf("system after the knob: %q", out)
	}
	out = get("-u", "admin:curl-Secret-1", base+"/redfish/v1/Systems/1/LogServices/SEL/Entries")
	if !strings.HasSuffix(out, "200") || !strings.Contains(out, `"Message":"CPU1 IERR"`) || !strings.Contains(out, `"Severity":"Critical"`) {
		t.Fatalf("SEL entries: %q", out)
	}
	out = get("-u", "admin:curl-Secret-1", "-X", "POST", "-d", `{"ResetType":"On"}`,
		base+"/redfish/v1/Systems/1/Actions/ComputerSystem.Reset")
	if !strings.HasSuffix(out, "500") {
		t.Fatalf("power on with a VM command that exits: %q", out)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("vbmc did not exit on SIGTERM")
	}
	if strings.Contains(stderr.String(), "curl-Secret-1") {
		t.Fatal("password in vbmc's log")
	}
}
