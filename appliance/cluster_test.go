package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
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

func loopbackAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l.Addr().String())
		defer l.Close()
	}
	return out
}

func startNode(t *testing.T, id string, join []string) *node {
	t.Helper()
	a := loopbackAddrs(t, 4)
	cfg := DefaultConfig()
	cfg.NodeID, cfg.DataDir = id, filepath.Join(t.TempDir(), id)
	cfg.API.Addr, cfg.Raft.Addr, cfg.Raft.ForwardAddr, cfg.Boot.HTTPAddr = a[0], a[1], a[2], a[3]
	if len(join) > 0 {
		cfg.Raft.Bootstrap, cfg.Raft.Join = false, join
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
		case <-n.done:
		case <-time.After(10 * time.Second):
			t.Errorf("node %s did not stop", id)
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
	b := startNode(t, "kiln-b", []string{a.cfg.Raft.ForwardAddr})
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
