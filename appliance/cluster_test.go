package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/store"
)

// node is one in-process appliance of a test cluster, on loopback.
type node struct {
	cfg    Config
	app    *Appliance
	cancel context.CancelFunc
	done   chan error
	token  string
}

// startNode runs an appliance on loopback; mutate, when given, changes its
// configuration before it is validated.
func startNode(t *testing.T, id string, join []string, mutate ...func(*Config)) *node {
	t.Helper()
	a := freeAddrs(t, 4)
	cfg := DefaultConfig()
	cfg.NodeID, cfg.DataDir = id, filepath.Join(t.TempDir(), id)
	cfg.API.Addr, cfg.Raft.Addr, cfg.Raft.ForwardAddr, cfg.Boot.HTTPAddr = a[0], a[1], a[2], a[3]
	if len(join) > 0 {
		cfg.Raft.Bootstrap, cfg.Raft.Join = false, join
	}
	for _, m := range mutate {
		m(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	app, err := New(cfg, "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{cfg: cfg, app: app, cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- app.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-n.done:
			if err != nil {
				t.Errorf("node %s: Run: %v", id, err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("node %s did not stop within 20 s", id)
		}
	})
	tok, err := os.ReadFile(cfg.API.AdminTokenFile)
	if err != nil {
		t.Fatal(err)
	}
	n.token = strings.TrimSpace(string(tok))
	return n
}

func (n *node) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + n.cfg.API.Addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("node %s not ready", n.cfg.NodeID)
}

// TestJoinAndWriteOnFollower: a second `kiln serve` node with raft.join set
// joins the first; a write sent to the follower's API is forwarded to the
// leader and is then read from both replicas.
func TestJoinAndWriteOnFollower(t *testing.T) {
	a := startNode(t, "kiln-a", nil)
	a.waitReady(t)
	b := startNode(t, "kiln-b", []string{a.cfg.Raft.ForwardAddr}, joinToken(t, a))
	b.waitReady(t)
	if b.app.Store.IsLeader() {
		t.Fatal("the joining node became leader")
	}

	body, _ := json.Marshal(map[string]any{"name": "via-follower", "intended": map[string]any{
		"nics": []map[string]string{{"mac": "02:00:00:00:0b:01"}}}})
	req, _ := http.NewRequest("POST", "http://"+b.cfg.API.Addr+"/v1/machines", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+b.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var m store.Machine
	_ = json.NewDecoder(resp.Body).Decode(&m)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || m.ID == "" {
		t.Fatalf("create on the follower: HTTP %d", resp.StatusCode)
	}
	// A consistent read on either node sees the acknowledged write at once.
	for _, n := range []*node{b, a} {
		req, _ := http.NewRequest("GET", "http://"+n.cfg.API.Addr+"/v1/machines/"+m.ID+"?consistent=true", nil)
		req.Header.Set("Authorization", "Bearer "+n.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("consistent read on %s: HTTP %d", n.cfg.NodeID, resp.StatusCode)
		}
	}
	req, _ = http.NewRequest("GET", "http://"+b.cfg.API.Addr+"/v1/machines?consistent=perhaps", nil)
	req.Header.Set("Authorization", "Bearer "+b.token)
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("consistent=perhaps: HTTP %d, want 400", resp.StatusCode)
	}
	for _, n := range []*node{a, b} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, err := n.app.Store.MachineByMAC("02:00:00:00:0b:01")
			if err == nil && got.ID == m.ID {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %s: machine %s not replicated: %v", n.cfg.NodeID, m.ID, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// The API never returns a machine's boot-token hash, and an update through the
// API (which read the machine redacted) keeps the stored hash.
func TestAPIRedactsBootTokenHash(t *testing.T) {
	n := startNode(t, "kiln-r", nil)
	n.waitReady(t)
	ctx := context.Background()
	m, err := n.app.Store.PutMachine(ctx, store.Machine{Name: "r1", Intended: store.Hardware{
		NICs: []store.NIC{{MAC: "02:00:00:00:0c:01"}}}}, store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + n.cfg.Boot.HTTPAddr + "/ipxe/02:00:00:00:0c:01") // issues a boot token
	if err != nil {
		t.Fatal(err)
	}
	script, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(script), "kiln.token=") {
		t.Fatalf("no agent script:\n%s", script)
	}
	stored, _ := n.app.Store.GetMachine(m.ID)
	if stored.BootTokenHash == "" {
		t.Fatal("no boot token hash stored")
	}
	api := func(method, path string, body any) (int, []byte) {
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		return httpDo(t, n.token, method, "http://"+n.cfg.API.Addr+path, "application/json", rd)
	}
	for _, path := range []string{"/v1/machines/" + m.ID, "/v1/machines"} {
		code, body := api("GET", path, nil)
		if code != http.StatusOK || strings.Contains(string(body), stored.BootTokenHash) || strings.Contains(string(body), "boot_token_hash") {
			t.Fatalf("GET %s: %d, token hash visible: %s", path, code, body)
		}
	}
	code, body := api("PATCH", "/v1/machines/"+m.ID, map[string]any{"resource_version": stored.ResourceVersion, "name": "r1-renamed"})
	if code != http.StatusOK {
		t.Fatalf("PATCH: %d %s", code, body)
	}
	after, _ := n.app.Store.GetMachine(m.ID)
	if after.Name != "r1-renamed" || after.BootTokenHash != stored.BootTokenHash {
		t.Fatalf("after PATCH: name %q, token hash kept: %v", after.Name, after.BootTokenHash == stored.BootTokenHash)
	}
}
