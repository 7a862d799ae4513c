package store_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"kiln/store"
	"kiln/store/pki"
	"kiln/store/storetest"
)

// forwardPost sends body to path on a node's forward port with the given
// TLS client configuration and returns the status and the error code of
// the answer ("" when none).
func forwardPost(t *testing.T, addr, path string, body []byte, tc *tls.Config) (int, string, error) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Post("https://"+addr+path, "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var res struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &res)
	code := ""
	if res.Error != nil {
		code = res.Error.Code
	}
	return resp.StatusCode, code, nil
}

// TestForwardRPCRefusesWithoutSiteCertificate is the attack of issue 12: an
// unauthenticated POST /raft/join to the forward port once added a voter
// (and broke a one-node site for good), /raft/apply replaced a machine's
// boot-token hash. Now: plain HTTP is not spoken; HTTPS without a client
// certificate, or with one from another CA, is refused; the membership
// and the record are unchanged and the node still takes writes.
func TestForwardRPCRefusesWithoutSiteCertificate(t *testing.T) {
	c := storetest.NewCluster(t, 1)
	s := c.Nodes[0].Store
	m, err := s.PutMachine(ctxT(t), store.Machine{Meta: store.Meta{ID: "victim"}, BootTokenHash: "genuine"}, store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	join, _ := json.Marshal(map[string]string{"id": "evil", "raft_addr": "127.0.0.1:1", "forward_addr": "127.0.0.1:2"})
	remove, _ := json.Marshal(map[string]string{"id": s.NodeID()})
	forged := append([]byte{byte(store.CmdPutMachinesV2)},
		[]byte(`{"machines":[{"id":"victim","boot_token_hash":"attacker"}],"w":{"actor":"api:admin"}}`)...)
	calls := []struct {
		path string
		body []byte
	}{{"/raft/join", join}, {"/raft/apply", forged}, {"/raft/remove", remove}, {"/raft/barrier", nil}}

	// Plain HTTP to the TLS port gets no RPC at all.
	resp, err := http.Post("http://"+s.ForwardAddr()+"/raft/join", "application/json", bytes.NewReader(join))
	if err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTPS") {
			t.Fatalf("plain HTTP /raft/join: HTTP %d %s", resp.StatusCode, body)
		}
	}
	// TLS with no client certificate: 401 unauthenticated on every route.
	for _, call := range calls {
		status, code, err := forwardPost(t, s.ForwardAddr(), call.path, call.body, &tls.Config{InsecureSkipVerify: true})
		if err != nil || status != http.StatusUnauthorized || code != "unauthenticated" {
			t.Fatalf("%s without a certificate: HTTP %d code %q err %v, want 401 unauthenticated", call.path, status, code, err)
		}
	}
	// A certificate of another CA: the handshake fails.
	foreign, err := pki.NewSite("evil", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, call := range calls {
		tc := foreign.ClientTLS(nil)
		tc.InsecureSkipVerify = true
		if status, code, err := forwardPost(t, s.ForwardAddr(), call.path, call.body, tc); err == nil {
			t.Fatalf("%s with a foreign certificate answered HTTP %d %q", call.path, status, code)
		}
	}
	// Raft port: a peer with no or a foreign certificate is cut off in the handshake.
	for name, tc := range map[string]*tls.Config{
		"no certificate":      {InsecureSkipVerify: true},
		"foreign certificate": func() *tls.Config { tc := foreign.ClientTLS(nil); tc.InsecureSkipVerify = true; return tc }(),
	} {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", s.RaftAddr(), tc)
		if err == nil {
			_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
			_, err = conn.Read(make([]byte, 1)) // TLS 1.3: the server's refusal arrives after the client's Finished
			conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("raft port with %s: %v, want a certificate error", name, err)
		}
	}

	ms, err := s.Members()
	if err != nil || len(ms) != 1 || ms[0].ID != s.NodeID() {
		t.Fatalf("members after the attack: %+v %v", ms, err)
	}
	got, err := s.GetMachine("victim")
	if err != nil || got.BootTokenHash != "genuine" || got.ResourceVersion != m.ResourceVersion {
		t.Fatalf("victim after the attack: %+v %v", got, err)
	}
	if _, err := s.PutMachine(ctxT(t), store.Machine{Meta: store.Meta{ID: "after"}}, store.W{}); err != nil {
		t.Fatalf("the node no longer takes writes: %v", err)
	}
}

// TestEnrollJoinsOverMTLS: a node with a join token gets a certificate from
// the cluster (its key stays here), joins over mutual TLS and replicates;
// the token then is spent, a wrong CA hash never reaches the token check,
// an expired or unknown token is refused with the reason, and a removed
// member's certificate is refused on both ports.
func TestEnrollJoinsOverMTLS(t *testing.T) {
	c := storetest.NewCluster(t, 2)
	leader := c.Nodes[c.Leader()].Store
	follower := c.Nodes[c.Follower()].Store
	ctx := ctxT(t)

	// The token is created on the follower (forwarded), used via the follower.
	tok, rec, err := follower.CreateJoinToken(ctx, 10*time.Minute, store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Expires.After(time.Now().Add(9*time.Minute)) || strings.Contains(rec.Hash, strings.Split(tok, ".")[1]) {
		t.Fatalf("token record %+v", rec)
	}
	// A token naming another CA: the joiner refuses the peer before sending the secret.
	parsed, _ := pki.ParseToken(tok)
	wrong := pki.Token{Secret: parsed.Secret, CAHash: strings.Repeat("0", 64)}.String()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, _, err = store.Enroll(wctx, []string{follower.ForwardAddr()}, wrong, "n9")
	cancel()
	if !errors.Is(err, pki.ErrWrongCA) {
		t.Fatalf("wrong CA: %v", err)
	}
	id, secrets, err := store.Enroll(ctx, []string{follower.ForwardAddr()}, tok, "n9")
	if err != nil {
		t.Fatal(err)
	}
	if id.NodeID() != "n9" || id.CAHash() != parsed.CAHash || secrets != nil {
		t.Fatalf("identity for %s, CA %s, secrets %v", id.NodeID(), id.CAHash(), secrets)
	}
	// Reused: refused, naming the node that used it.
	_, _, err = store.Enroll(ctx, []string{leader.ForwardAddr()}, tok, "n10")
	if !errors.Is(err, store.ErrEnrollRefused) || !strings.Contains(err.Error(), "already used by node n9") {
		t.Fatalf("reused token: %v", err)
	}
	// Expired.
	short, err := leader.CreateJoinTokenTTL(ctx, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	_, _, err = store.Enroll(ctx, []string{leader.ForwardAddr()}, short, "n10")
	if !errors.Is(err, store.ErrEnrollRefused) || !strings.Contains(err.Error(), "expired at") {
		t.Fatalf("expired token: %v", err)
	}
	// Unknown (a well-formed token this cluster never made).
	_, _, err = store.Enroll(ctx, []string{follower.ForwardAddr()}, pki.NewToken(parsed.CAHash).String(), "n10")
	if !errors.Is(err, store.ErrEnrollRefused) || !strings.Contains(err.Error(), "unknown to this cluster") {
		t.Fatalf("unknown token: %v", err)
	}

	// The enrolled node joins and replicates over mutual TLS.
	cfg := storetest.Config("n9", t.TempDir())
	cfg.Identity = id
	n9, err := store.Open(cfg, storetest.Logger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- n9.Run(runCtx, nil) }()
	t.Cleanup(func() {
		stop()
		<-runDone
		n9.Close()
	})
	if err := n9.JoinVia(ctx, []string{follower.ForwardAddr(), leader.ForwardAddr()}); err != nil {
		t.Fatal(err)
	}
	putN(t, n9, "via-n9", 0, 3)
	waitMachines(t, leader, 3)
	waitMachines(t, n9, 3)
	ms, err := leader.Members()
	if err != nil || len(ms) != 3 {
		t.Fatalf("members: %+v %v", ms, err)
	}
	for _, m := range ms {
		if m.ID == "n9" && (m.Record.CertSerial != pki.Serial(id.Cert) || m.Record.TokenID != rec.ID()) {
			t.Fatalf("n9's record: %+v", m.Record)
		}
	}

	// Removed: out of the configuration, and its certificate refused.
	if err := follower.RemoveMember(ctx, "n9", store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := follower.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	ms, _ = follower.Members()
	if len(ms) != 2 {
		t.Fatalf("members after removal: %+v", ms)
	}
	status, code, err := forwardPost(t, follower.ForwardAddr(), "/raft/barrier", nil, id.ClientTLS(nil))
	if err == nil {
		t.Fatalf("removed member's certificate accepted on the forward port: HTTP %d %q", status, code)
	}
	t.Logf("removed member on the forward port: %v", err)
	conn, err := tls.Dial("tcp", leader.RaftAddr(), id.ClientTLS(nil))
	if err == nil {
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		conn.Close()
	}
	if err == nil {
		t.Fatalf("removed member's certificate accepted on the raft port")
	}
	t.Logf("removed member on the raft port: %v", err)
	if err := leader.RemoveMember(ctx, "nope", store.W{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("remove unknown: %v", err)
	}
}

// TestForeignCANodeCannotJoin: a node whose certificate comes from another
// site CA cannot reach the forward RPC to join, even through Join's own
// client path.
func TestForeignCANodeCannotJoin(t *testing.T) {
	c := storetest.NewCluster(t, 1)
	foreign, err := pki.NewSite("x", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cfg := storetest.Config("x1", t.TempDir())
	cfg.Identity = storetest.IdentityFrom(foreign, "x1")
	s, err := store.Open(cfg, storetest.Logger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = s.JoinVia(ctx, []string{c.Nodes[0].Store.ForwardAddr()})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("foreign-CA join: %v", err)
	}
	if ms, _ := c.Nodes[0].Store.Members(); len(ms) != 1 {
		t.Fatalf("members: %+v", ms)
	}
}

// A local store (OpenLocal) has no cluster: the cluster operations say so
// instead of panicking.
func TestLocalStoreHasNoCluster(t *testing.T) {
	s := storetest.NewLocal(t)
	if _, _, err := s.CreateJoinToken(context.Background(), time.Hour, store.W{}); !errors.Is(err, store.ErrNoRaft) {
		t.Fatalf("CreateJoinToken: %v", err)
	}
	if _, err := s.Members(); !errors.Is(err, store.ErrNoRaft) {
		t.Fatalf("Members: %v", err)
	}
	if err := s.RemoveMember(context.Background(), "x", store.W{}); !errors.Is(err, store.ErrNoRaft) {
		t.Fatalf("RemoveMember: %v", err)
	}
	if err := s.PushSecrets(context.Background(), nil); !errors.Is(err, store.ErrNoRaft) {
		t.Fatalf("PushSecrets: %v", err)
	}
}
