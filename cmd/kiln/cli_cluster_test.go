package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"kiln/store"
)

// kilnCLI runs the kiln binary as a client of s (--server, --token) and
// returns its stdout; a non-zero exit fails the test unless wantErr.
func kilnCLI(t *testing.T, bin string, s *served, wantErr bool, args ...string) (string, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--server", s.api, "--token", s.token}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if (err != nil) != wantErr {
		t.Fatalf("kiln %s: %v (want error: %v)\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, wantErr, out.String(), errb.String())
	}
	return out.String(), errb.String()
}

// joinToken creates a join token on s with `kiln cluster token create -o json`.
func joinToken(t *testing.T, bin string, s *served) string {
	t.Helper()
	out, _ := kilnCLI(t, bin, s, false, "cluster", "token", "create", "--ttl", "15m", "-o", "json")
	var tok struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal([]byte(out), &tok); err != nil || !strings.HasPrefix(tok.Token, "kiln1.") {
		t.Fatalf("token create -o json: %q (%v)", out, err)
	}
	return tok.Token
}

// setJoinToken adds raft.join_token to n's config file.
func (n *serveNode) setJoinToken(t *testing.T, token string) {
	t.Helper()
	b, err := os.ReadFile(n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), "\nboot:\n", "\n  join_token: "+token+"\nboot:\n", 1)
	if err := os.WriteFile(n.cfg, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestCLIClusterMembersAndRemove: `kiln cluster members` (table and -o
// json) lists a bootstrap node and a node joined with a token from
// `kiln cluster token create`; `kiln cluster remove` removes it; a second
// use of the token is refused and the node says why.
func TestCLIClusterMembersAndRemove(t *testing.T) {
	a := newServeNode(t, "cli-a", nil)
	b := newServeNode(t, "cli-b", []string{a.fwd})
	c := newServeNode(t, "cli-c", []string{a.fwd})
	pa := a.start(t)
	tok := joinToken(t, a.bin, pa)
	b.setJoinToken(t, tok)
	b.start(t)

	out, _ := kilnCLI(t, a.bin, pa, false, "cluster", "members")
	if !strings.Contains(out, "cli-a") || !strings.Contains(out, "cli-b") || !strings.Contains(out, "leader") ||
		!strings.Contains(out, "CERT SERIAL") || !strings.Contains(out, "bootstrap") {
		t.Fatalf("members table:\n%s", out)
	}
	out, _ = kilnCLI(t, a.bin, pa, false, "cluster", "members", "-o", "json")
	var list struct {
		Items []struct {
			ID         string `json:"id"`
			CertSerial string `json:"cert_serial"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Items) != 2 {
		t.Fatalf("members -o json: %s (%v)", out, err)
	}
	// Each node reports its version (it registers within a second of start).
	var vers struct {
		Items []struct {
			ID         string `json:"id"`
			Version    string `json:"version"`
			MaxCommand int    `json:"max_command"`
		} `json:"items"`
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, _ = kilnCLI(t, a.bin, pa, false, "cluster", "members", "-o", "json")
		if err := json.Unmarshal([]byte(out), &vers); err != nil {
			t.Fatalf("members -o json: %s (%v)", out, err)
		}
		n := 0
		for _, m := range vers.Items {
			if m.Version != "" && m.MaxCommand == int(store.MaxCommand) {
				n++
			}
		}
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("members do not report version and max_command %d: %s", store.MaxCommand, out)
		}
	}
	if out, _ = kilnCLI(t, a.bin, pa, false, "cluster", "members"); !strings.Contains(out, "VERSION") || !strings.Contains(out, fmt.Sprintf("≤%d", store.MaxCommand)) {
		t.Fatalf("members table without versions:\n%s", out)
	}

	// The same token again: the third node does not start, and says why.
	c.setJoinToken(t, tok)
	cmd := exec.Command(c.bin, "serve", "--config", c.cfg)
	msg, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(msg), "already used by node cli-b") {
		t.Fatalf("second use of the token: %v\n%s", err, msg)
	}

	out, _ = kilnCLI(t, a.bin, pa, false, "cluster", "remove", "cli-b")
	if !strings.Contains(out, "removed cli-b") {
		t.Fatalf("remove: %q", out)
	}
	out, _ = kilnCLI(t, a.bin, pa, false, "cluster", "members", "-o", "json")
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Items) != 1 || list.Items[0].ID != "cli-a" {
		t.Fatalf("members after remove: %s (%v)", out, err)
	}
	_, stderr := kilnCLI(t, a.bin, pa, true, "cluster", "remove", "cli-a")
	if !strings.Contains(stderr, "only voter") {
		t.Fatalf("removing the only voter: %s", stderr)
	}
}

// TestCLIRotateCA: `kiln cluster rotate-ca` on two `kiln serve` processes
// re-issues both members under a new site CA; `kiln cluster members` shows
// it; a member restarted afterwards starts from the rotated credentials it
// saved in its raft.tls_dir and rejoins the cluster, and writes go through
// it.
func TestCLIRotateCA(t *testing.T) {
	a := newServeNode(t, "rot-a", nil)
	b := newServeNode(t, "rot-b", []string{a.fwd})
	pa := a.start(t)
	b.setJoinToken(t, joinToken(t, a.bin, pa))
	pb := b.start(t)

	out, _ := kilnCLI(t, a.bin, pb, false, "cluster", "rotate-ca", "-o", "json")
	var rot struct {
		OldCA   string            `json:"old_ca"`
		NewCA   string            `json:"new_ca"`
		Members map[string]string `json:"members"`
	}
	if err := json.Unmarshal([]byte(out), &rot); err != nil || rot.NewCA == rot.OldCA || len(rot.Members) != 2 {
		t.Fatalf("rotate-ca -o json: %s (%v)", out, err)
	}
	var list struct {
		Items []struct {
			ID         string `json:"id"`
			CertSerial string `json:"cert_serial"`
			CAHash     string `json:"ca_hash"`
		} `json:"items"`
	}
	out, _ = kilnCLI(t, a.bin, pa, false, "cluster", "members", "-o", "json")
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Items) != 2 {
		t.Fatalf("members -o json: %s (%v)", out, err)
	}
	for _, m := range list.Items {
		if m.CAHash != rot.NewCA || m.CertSerial != rot.Members[m.ID] {
			t.Fatalf("member %s after rotation: %+v, want CA %s serial %s", m.ID, m, rot.NewCA, rot.Members[m.ID])
		}
	}
	if out, _ = kilnCLI(t, a.bin, pa, false, "cluster", "members"); !strings.Contains(out, "CERT EXPIRES") {
		t.Fatalf("members table:\n%s", out)
	}

	// b restarts from the credentials it saved during the rotation.
	if err := pb.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_ = pb.cmd.Wait()
	ca, err := os.ReadFile(b.data + "/tls/ca.crt")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.data + "/tls/trust.crt"); !os.IsNotExist(err) {
		t.Fatalf("trust.crt left after the rotation: %v", err)
	}
	pb = b.start(t)
	body := `{"name":"rotated-1","intended":{"nics":[{"mac":"02:00:00:00:7a:01"}]}}`
	req, _ := http.NewRequest("POST", pb.api+"/v1/machines", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+pb.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create through the restarted member: HTTP %d", resp.StatusCode)
	}
	t.Logf("rotated: %s -> %s; b restarted with ca.crt of %d bytes", rot.OldCA, rot.NewCA, len(ca))
}
