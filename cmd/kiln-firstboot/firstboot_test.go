package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/deploy/lab/testreq"
)

// nodeLayer writes a node layer (hostname, a fresh ed25519 host key made by
// ssh-keygen, firstboot.json) into a new directory and returns it with the
// fingerprint `ssh-keygen -l` prints for the key.
func nodeLayer(t *testing.T, urls []string) (dir, fp string) {
	t.Helper()
	testreq.Commands(t, "ssh-keygen")
	dir = t.TempDir()
	for _, d := range []string{"etc/ssh", "etc/kiln"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	key := filepath.Join(dir, "etc/ssh/ssh_host_ed25519_key")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "root@node-7", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	out, err := exec.Command("ssh-keygen", "-l", "-E", "sha256", "-f", key+".pub").Output()
	if err != nil {
		t.Fatal(err)
	}
	fp = strings.Fields(string(out))[1]
	if err := os.WriteFile(filepath.Join(dir, "etc/hostname"), []byte("node-7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(agentapi.FirstBootFile{URLs: urls, MachineID: "m-7", Token: "tok-secret-123456"})
	if err := os.WriteFile(filepath.Join(dir, "etc/kiln/firstboot.json"), cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, fp
}

func TestFingerprintMatchesSSHKeygen(t *testing.T) {
	dir, want := nodeLayer(t, []string{"http://127.0.0.1:1"})
	pub, err := os.ReadFile(filepath.Join(dir, hostKeyPub))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Fingerprint(pub)
	if err != nil || got != want {
		t.Fatalf("Fingerprint = %q, %v; ssh-keygen -l says %q", got, err, want)
	}
	for _, bad := range []string{"", "ssh-ed25519", "ssh-ed25519 !!!", "ssh-rsa " + strings.Fields(string(pub))[1]} {
		if _, err := Fingerprint([]byte(bad)); err == nil {
			t.Errorf("Fingerprint(%q) accepted", bad)
		}
	}
}

func TestFindPartitionByName(t *testing.T) {
	sys := t.TempDir()
	for dev, ue := range map[string]string{
		"vda":  "MAJOR=254\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk\n",
		"vda1": "MAJOR=254\nMINOR=1\nDEVNAME=vda1\nDEVTYPE=partition\nPARTN=1\nPARTNAME=kiln-esp\n",
		"vda4": "MAJOR=254\nMINOR=4\nDEVNAME=vda4\nDEVTYPE=partition\nPARTN=4\nPARTNAME=kiln-node\n",
	} {
		d := filepath.Join(sys, "class/block", dev)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "uevent"), []byte(ue), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := FindPartition(sys, "/dev", "kiln-node"); err != nil || got != "/dev/vda4" {
		t.Fatalf("FindPartition = %q, %v", got, err)
	}
	if _, err := FindPartition(sys, "/dev", "kiln-root"); err == nil {
		t.Fatal("a missing partition was found")
	}
	d := filepath.Join(sys, "class/block/sdb2")
	_ = os.MkdirAll(d, 0o755)
	_ = os.WriteFile(filepath.Join(d, "uevent"), []byte("DEVNAME=sdb2\nPARTNAME=kiln-node\n"), 0o644)
	if _, err := FindPartition(sys, "/dev", "kiln-node"); err == nil || !strings.Contains(err.Error(), "2 partitions") {
		t.Fatalf("two kiln-node partitions: %v", err)
	}
}

// TestReportRetriesUntilAcknowledged: a 503 and a dead URL are retried, the
// report carries what the node layer holds, with the bearer token.
func TestReportRetriesUntilAcknowledged(t *testing.T) {
	var mu sync.Mutex
	var got []agentapi.FirstBootReport
	var calls int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if r.URL.Path != agentapi.EndpointFirstBoot || r.Header.Get("Authorization") != "Bearer tok-secret-123456" {
			http.Error(w, "bad request path or token", http.StatusUnauthorized)
			return
		}
		if calls == 1 {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		var rep agentapi.FirstBootReport
		if err := json.NewDecoder(r.Body).Decode(&rep); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		got = append(got, rep)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	dir, fp := nodeLayer(t, []string{"http://127.0.0.1:1", srv.URL})
	var console bytes.Buffer
	bootID := filepath.Join(t.TempDir(), "boot_id")
	_ = os.WriteFile(bootID, []byte("1b4e28ba-2fa1-11d2-883f-0016d3cca427\n"), 0o644)
	r := Reporter{Dir: dir, Console: &console, MaxBackoff: 50 * time.Millisecond, BootIDPath: bootID}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatalf("Run: %v\n%s", err, console.String())
	}
	if len(got) != 1 {
		t.Fatalf("%d reports received, want 1", len(got))
	}
	rep := got[0]
	if rep.Hostname != "node-7" || rep.SSHHostKeyFingerprint != fp || rep.MachineID != "m-7" ||
		rep.Outcome != agentapi.OutcomeSucceeded || rep.Phase != agentapi.PhaseNodeLayer ||
		rep.BootID != "1b4e28ba-2fa1-11d2-883f-0016d3cca427" {
		t.Fatalf("report %+v, want hostname node-7 fp %s", rep, fp)
	}
	if err := rep.Validate(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(console.String(), "kiln-firstboot: reported hostname=node-7 fp="+fp) {
		t.Fatalf("console: %s", console.String())
	}
	if strings.Contains(console.String(), "tok-secret") {
		t.Fatalf("the token reached the console: %s", console.String())
	}
}

// TestIncompleteNodeLayerReportsFailure: no host key → failed, first_boot_node_layer,
// and a 4xx answer ends the run with an error (no retry loop).
func TestIncompleteNodeLayerReportsFailure(t *testing.T) {
	var got agentapi.FirstBootReport
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&got)
		http.Error(w, "machine not expecting a first boot", http.StatusConflict)
	}))
	defer srv.Close()
	dir, _ := nodeLayer(t, []string{srv.URL})
	if err := os.Remove(filepath.Join(dir, hostKeyPub)); err != nil {
		t.Fatal(err)
	}
	var console bytes.Buffer
	r := Reporter{Dir: dir, Console: &console, MaxBackoff: 50 * time.Millisecond}
	err := r.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("Run = %v, want the 409 refusal", err)
	}
	if got.Outcome != agentapi.OutcomeFailed || got.Reason != agentapi.ReasonFirstBootNodeLayer ||
		!strings.Contains(got.Message, "ssh_host_ed25519_key.pub") {
		t.Fatalf("report %+v", got)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidateAndSanitize(t *testing.T) {
	ok := agentapi.FirstBootReport{MachineID: "m", Phase: agentapi.PhaseJoin, Outcome: agentapi.OutcomeSucceeded}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []agentapi.FirstBootReport{
		{MachineID: "m", Phase: "boot", Outcome: agentapi.OutcomeSucceeded},
		{MachineID: "m", Phase: agentapi.PhaseJoin, Outcome: "maybe"},
		{MachineID: "m", Phase: agentapi.PhaseJoin, Outcome: agentapi.OutcomeFailed, Reason: agentapi.ReasonDiskNotFound},
		{MachineID: "m", Phase: agentapi.PhaseJoin, Outcome: agentapi.OutcomeSucceeded, Reason: agentapi.ReasonFirstBootJoin},
		{MachineID: "m", Phase: agentapi.PhaseJoin, Outcome: agentapi.OutcomeFailed, Reason: agentapi.ReasonFirstBootJoin, Message: "a\nb"},
		{MachineID: "m", Phase: agentapi.PhaseJoin, Outcome: agentapi.OutcomeFailed, Reason: agentapi.ReasonFirstBootJoin, Message: strings.Repeat("x", 257)},
		{Phase: agentapi.PhaseJoin, Outcome: agentapi.OutcomeSucceeded},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("Validate accepted %+v", bad)
		}
	}
	if s := agentapi.SanitizeMessage("é\x1b[31mred\n"+strings.Repeat("y", 300), 256); len(s) != 256 || strings.ContainsAny(s, "\n\x1b") {
		t.Fatalf("SanitizeMessage: %q", s)
	}
}
