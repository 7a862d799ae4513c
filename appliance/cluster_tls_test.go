package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kiln/bmc"
	"kiln/deploy/lab/vbmc/vbmc"
	"kiln/store"
)

// joinToken returns a config change that makes a node join through n with a
// fresh join token made on n.
func joinToken(t *testing.T, n *node) func(*Config) {
	t.Helper()
	tok, _, err := n.app.Store.CreateJoinToken(context.Background(), 10*time.Minute, store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return func(c *Config) { c.Raft.JoinToken = tok }
}

// joinConfig is a validated config of a node joining through n (not started).
func joinConfig(t *testing.T, id string, n *node, token string) Config {
	t.Helper()
	a := freeAddrs(t, 4)
	cfg := DefaultConfig()
	cfg.NodeID, cfg.DataDir = id, filepath.Join(t.TempDir(), id)
	cfg.API.Addr, cfg.Raft.Addr, cfg.Raft.ForwardAddr, cfg.Boot.HTTPAddr = a[0], a[1], a[2], a[3]
	cfg.Raft.Bootstrap, cfg.Raft.Join, cfg.Raft.JoinToken = false, []string{n.cfg.Raft.ForwardAddr}, token
	cfg.Raft.JoinTimeout = 10 * time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestOneSiteKeyAcrossNodes: a BMC credential sealed on the first node
// (its enrollment through the API) is opened by a node that joined later
// with a join token: the joiner received the site key over the
// authenticated enrollment, and holds byte-for-byte the same key file.
func TestOneSiteKeyAcrossNodes(t *testing.T) {
	a := startNode(t, "key-a", nil)
	a.waitReady(t)
	mID := enrollVBMC(t, a, "SN-KEY-1", "52:54:00:43:00:01", "Site-Key-7")

	b := startNode(t, "key-b", []string{a.cfg.Raft.ForwardAddr}, joinToken(t, a))
	b.waitReady(t)
	ka, _ := os.ReadFile(a.cfg.BMC.KeyFile)
	kb, err := os.ReadFile(b.cfg.BMC.KeyFile)
	if err != nil || len(ka) != 32 || !bytes.Equal(ka, kb) {
		t.Fatalf("site keys differ (a %d bytes, b %d bytes, %v)", len(ka), len(kb), err)
	}
	if st, _ := os.Stat(b.cfg.BMC.KeyFile); st.Mode().Perm() != 0o600 {
		t.Fatalf("joiner's site key mode %v", st.Mode().Perm())
	}
	if err := b.app.Store.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	tgt, err := b.app.bmc.target(mID)
	if err != nil || tgt.Password != "Site-Key-7" {
		t.Fatalf("node b opening node a's credential: %v (password opened: %v)", err, tgt.Password == "Site-Key-7")
	}
}

// TestJoinRefusedClearly: a second node started with a token already used,
// with no token, or with a token for another site's CA does not start, and
// says why; the cluster keeps its one member.
func TestJoinRefusedClearly(t *testing.T) {
	a := startNode(t, "ref-a", nil)
	a.waitReady(t)
	tok := joinToken(t, a)
	b := startNode(t, "ref-b", []string{a.cfg.Raft.ForwardAddr}, tok)
	b.waitReady(t)
	var used Config
	tok(&used)

	other := startNode(t, "ref-other", nil)
	other.waitReady(t)
	foreign, _, err := other.app.Store.CreateJoinToken(context.Background(), time.Hour, store.W{})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for name, c := range map[string]struct {
		cfg  Config
		want string
	}{
		"reused token":  {joinConfig(t, "ref-c", a, used.Raft.JoinToken), "already used by node ref-b"},
		"no token":      {joinConfig(t, "ref-d", a, ""), "raft.join_token is required"},
		"another CA":    {joinConfig(t, "ref-e", a, foreign), "does not present the site CA"},
		"garbled token": {func() Config { c := joinConfig(t, "ref-f", a, ""); c.Raft.JoinToken = "kiln1.x.y"; return c }(), "raft.join_token"},
	} {
		var err error
		if c.cfg.Raft.JoinToken == "kiln1.x.y" {
			err = c.cfg.Validate()
		} else {
			var app *Appliance
			app, err = New(c.cfg, "test", log)
			if app != nil {
				app.close()
			}
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, c.want)
			continue
		}
		t.Logf("%s: %v", name, err)
		if _, err := os.Stat(filepath.Join(c.cfg.Raft.TLSDir, "node.crt")); err == nil {
			t.Errorf("%s: a certificate was written", name)
		}
	}
	ms, err := a.app.Store.Members()
	if err != nil || len(ms) != 2 {
		t.Fatalf("members: %+v %v", ms, err)
	}
}

// TestClusterAPIAndAttack: over the REST API an admin creates a token,
// lists members and removes one; an unauthenticated join on the forward
// port (the attack of issue 12) changes nothing.
func TestClusterAPIAndAttack(t *testing.T) {
	a := startNode(t, "api-a", nil)
	a.waitReady(t)
	api := func(method, path string, body any, out any) int {
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		code, rb := httpDo(t, a.token, method, "http://"+a.cfg.API.Addr+path, "application/json", rd)
		if out != nil {
			if err := json.Unmarshal(rb, out); err != nil {
				t.Fatalf("%s %s: %d %s", method, path, code, rb)
			}
		}
		return code
	}
	var created struct {
		Token     string    `json:"token"`
		ID        string    `json:"id"`
		ExpiresAt time.Time `json:"expires_at"`
		CAHash    string    `json:"ca_hash"`
	}
	if code := api("POST", "/v1/cluster/tokens", map[string]string{"ttl": "30m"}, &created); code != http.StatusCreated {
		t.Fatalf("create token: %d", code)
	}
	if !strings.HasPrefix(created.Token, "kiln1.") || !strings.HasSuffix(created.Token, strings.TrimPrefix(created.CAHash, "sha256:")) ||
		time.Until(created.ExpiresAt) < 29*time.Minute {
		t.Fatalf("token answer %+v", created)
	}
	if code := api("POST", "/v1/cluster/tokens", map[string]string{"ttl": "9999h"}, nil); code != http.StatusBadRequest {
		t.Fatalf("ttl 9999h: %d, want 400", code)
	}

	// The attack: an unauthenticated join to the forward port.
	join, _ := json.Marshal(map[string]string{"id": "evil", "raft_addr": "127.0.0.1:1"})
	hc := &http.Client{Timeout: 5 * time.Second}
	if resp, err := hc.Post("http://"+a.cfg.Raft.ForwardAddr+"/raft/join", "application/json", bytes.NewReader(join)); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain-HTTP /raft/join answered 200")
		}
	}

	b := startNode(t, "api-b", []string{a.cfg.Raft.ForwardAddr}, func(c *Config) { c.Raft.JoinToken = created.Token })
	b.waitReady(t)
	var list struct {
		Items []struct {
			ID         string `json:"id"`
			Leader     bool   `json:"leader"`
			CertSerial string `json:"cert_serial"`
			TokenID    string `json:"token_id"`
		} `json:"items"`
	}
	if code := api("GET", "/v1/cluster/members", nil, &list); code != http.StatusOK || len(list.Items) != 2 {
		t.Fatalf("members: %d %+v", code, list)
	}
	for _, m := range list.Items {
		if m.ID == "evil" {
			t.Fatal("the unauthenticated join added a voter")
		}
		if m.ID == "api-b" && (m.CertSerial == "" || m.TokenID != created.ID) {
			t.Fatalf("api-b: %+v", m)
		}
	}
	if code := api("DELETE", "/v1/cluster/members/api-b", nil, nil); code != http.StatusNoContent {
		t.Fatalf("remove api-b: %d", code)
	}
	if code := api("GET", "/v1/cluster/members", nil, &list); code != http.StatusOK || len(list.Items) != 1 || list.Items[0].ID != "api-a" {
		t.Fatalf("members after remove: %d %+v", code, list)
	}
	if code := api("DELETE", "/v1/cluster/members/api-a", nil, nil); code != http.StatusBadRequest {
		t.Fatalf("removing the only voter: %d, want 400", code)
	}
	// The site still takes writes.
	if _, err := a.app.Store.PutMachine(context.Background(), store.Machine{Name: "after"}, store.W{}); err != nil {
		t.Fatal(err)
	}
}

// enrollVBMC starts a lab virtual BMC (Redfish) and enrolls it through n's
// API for a new machine with serial and mac; it returns the machine ID.
func enrollVBMC(t *testing.T, n *node, serial, mac, password string) string {
	t.Helper()
	v, err := vbmc.New(vbmc.Config{
		Listen: "127.0.0.1:0", Username: "admin", Password: password,
		QEMUArgs: []string{"/bin/sh", "-c", "exec sleep 5", "fake-vm"},
		StateDir: t.TempDir(), Serial: serial, MACs: []string{mac},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() { cancel(); <-done })
	for deadline := time.Now().Add(5 * time.Second); v.Addr() == "" && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	m, err := n.app.Store.PutMachine(context.Background(), store.Machine{Name: "m-" + strings.ToLower(serial),
		Intended: store.Hardware{Serial: serial, NICs: []store.NIC{{MAC: mac}}}}, store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.app.Store.Barrier(context.Background()); err != nil { // a follower's replica may lag its forwarded write
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"address": v.Addr(), "driver": "redfish", "username": "admin",
		"password": password, "ca_cert_pem": string(v.CACertPEM())})
	code, rb := httpDo(t, n.token, "POST", "http://"+n.cfg.API.Addr+"/v1/machines/"+m.ID+"/bmc", "application/json", bytes.NewReader(body))
	if code/100 != 2 {
		t.Fatalf("enroll BMC on %s: %d %s", n.cfg.NodeID, code, rb)
	}
	return m.ID
}

// TestRotateSiteKey: `kiln site rotate-key` through a follower re-seals
// every credential under a new key on every member. While it runs, both
// nodes keep opening both credentials and never fail; afterwards each
// blob names the new key, each node's key file holds only the new key,
// the old key opens nothing, and a node joining later opens them too.
func TestRotateSiteKey(t *testing.T) {
	a := startNode(t, "rot-a", nil)
	a.waitReady(t)
	m1 := enrollVBMC(t, a, "SN-ROT-1", "52:54:00:44:00:01", "Rot-One-1")
	b := startNode(t, "rot-b", []string{a.cfg.Raft.ForwardAddr}, joinToken(t, a))
	b.waitReady(t)
	m2 := enrollVBMC(t, b, "SN-ROT-2", "52:54:00:44:00:02", "Rot-Two-2")
	oldKey, _ := os.ReadFile(a.cfg.BMC.KeyFile)
	want := map[string]string{m1: "Rot-One-1", m2: "Rot-Two-2"}
	for _, n := range []*node{a, b} {
		if err := n.app.Store.Barrier(context.Background()); err != nil {
			t.Fatal(err)
		}
	}

	stop := make(chan struct{})
	var opens, failures atomic.Int64
	var firstFailure atomic.Value
	var wg sync.WaitGroup
	for _, n := range []*node{a, b} {
		wg.Add(1)
		go func(n *node) {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for id, pw := range want {
					tgt, err := n.app.bmc.target(id)
					opens.Add(1)
					if err != nil || tgt.Password != pw {
						failures.Add(1)
						firstFailure.CompareAndSwap(nil, fmt.Sprintf("%s on %s: %v", id, n.cfg.NodeID, err))
					}
				}
			}
		}(n)
	}
	var rot struct {
		KeyID     string   `json:"key_id"`
		OldKeyIDs []string `json:"old_key_ids"`
		Resealed  int      `json:"resealed"`
	}
	code, rb := httpDo(t, b.token, "POST", "http://"+b.cfg.API.Addr+"/v1/site/rotate-key", "application/json", nil)
	time.Sleep(100 * time.Millisecond) // opens after the rotation, on both nodes
	close(stop)
	wg.Wait()
	if code != http.StatusOK {
		t.Fatalf("rotate-key: %d %s", code, rb)
	}
	if err := json.Unmarshal(rb, &rot); err != nil || rot.Resealed != 2 || len(rot.OldKeyIDs) != 1 || rot.KeyID == rot.OldKeyIDs[0] {
		t.Fatalf("rotation answer %s (%v)", rb, err)
	}
	t.Logf("rotated to key %s: %d credentials re-sealed; %d opens during the rotation, %d failed", rot.KeyID, rot.Resealed, opens.Load(), failures.Load())
	if failures.Load() != 0 {
		t.Fatalf("%d of %d opens failed during the rotation; first: %v", failures.Load(), opens.Load(), firstFailure.Load())
	}
	oldSealer, _ := bmc.NewSealer(oldKey)
	for _, n := range []*node{a, b} {
		k, _ := os.ReadFile(n.cfg.BMC.KeyFile)
		if len(k) != bmc.KeySize || bmc.KeyID(k) != rot.KeyID {
			t.Fatalf("%s key file: %d bytes, id %s", n.cfg.NodeID, len(k), bmc.KeyID(k))
		}
		for id := range want {
			bm, _ := n.app.Store.GetMachine(id)
			rec, _ := n.app.Store.GetBMC(bm.BMC)
			blob, err := n.app.Store.Secret(rec.CredentialRef)
			if err != nil || bmc.SealedKeyID(blob) != rot.KeyID {
				t.Fatalf("%s: credential of %s under key %q (%v)", n.cfg.NodeID, id, bmc.SealedKeyID(blob), err)
			}
			if _, err := oldSealer.Open(blob); err == nil {
				t.Fatalf("the old key still opens %s's credential", id)
			}
		}
	}
	c := startNode(t, "rot-c", []string{a.cfg.Raft.ForwardAddr}, joinToken(t, a))
	c.waitReady(t)
	if err := c.app.Store.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	for id, pw := range want {
		if tgt, err := c.app.bmc.target(id); err != nil || tgt.Password != pw {
			t.Fatalf("node joined after the rotation opening %s: %v", id, err)
		}
	}
}
