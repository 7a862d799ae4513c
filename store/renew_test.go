package store_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kiln/store"
	"kiln/store/pki"
	"kiln/store/storetest"
)

// shortIdentity is a fresh key and a certificate for id from the test site
// CA that lives for validity.
func shortIdentity(t *testing.T, id string, validity time.Duration) *pki.Identity {
	t.Helper()
	ca := storetest.Site()
	key, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, id)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.SignWith(csr, id, pki.SignOptions{Now: time.Now(), Validity: validity})
	if err != nil {
		t.Fatal(err)
	}
	return &pki.Identity{CA: ca.CA, CAKey: ca.CAKey, Cert: cert, Key: key}
}

// saved records the identities a node stores (Config.OnIdentity).
type saved struct {
	mu  sync.Mutex
	ids map[string][]*pki.Identity
}

func (s *saved) hook(node string) func(*pki.Identity) error {
	return func(id *pki.Identity) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.ids[node] = append(s.ids[node], id)
		return nil
	}
}

func (s *saved) count(node string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids[node])
}

// writer writes sites through every running node of c until stop is
// closed, counting successes and remembering failures.
func writer(t *testing.T, c *storetest.Cluster, stop chan struct{}) (ok *atomic.Int64, fails func() []error) {
	ok = &atomic.Int64{}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for i, nd := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := nd.Store.PutSite(ctx, store.Site{Meta: store.Meta{ID: fmt.Sprintf("w%d-%d", i, n)}}, store.W{Actor: "test"})
				cancel()
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("via %s: %w", nd.ID, err))
					mu.Unlock()
				} else {
					ok.Add(1)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	t.Cleanup(wg.Wait)
	return ok, func() []error { wg.Wait(); mu.Lock(); defer mu.Unlock(); return errs }
}

// TestClusterCertRenewal: three nodes whose certificates live 3 s renew
// them (at half their lifetime) over the forward RPC's mutual TLS, with no
// restart, while writes go on through every node. Well after every first
// certificate has expired, connections made anew (pools closed) work on the
// raft and forward ports; the member records hold the current serials.
func TestClusterCertRenewal(t *testing.T) {
	const life = 3 * time.Second
	sv := &saved{ids: map[string][]*pki.Identity{}}
	c := storetest.NewCluster(t, 3, func(cfg *store.Config) {
		cfg.Identity = shortIdentity(t, cfg.NodeID, life)
		cfg.CertLifetime, cfg.RenewFraction = life, 0.5
		cfg.OnIdentity = sv.hook(cfg.NodeID)
	})
	first := map[string]*x509.Certificate{}
	for _, nd := range c.Nodes {
		first[nd.ID] = nd.Cfg.Identity.Cert
	}
	stop := make(chan struct{})
	ok, fails := writer(t, c, stop)
	latest := first[c.Nodes[0].ID].NotAfter
	for _, cert := range first {
		if cert.NotAfter.After(latest) {
			latest = cert.NotAfter
		}
	}
	time.Sleep(time.Until(latest) + time.Second) // every first certificate has expired
	for _, nd := range c.Nodes {
		nd.Store.CloseConns()
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	if errs := fails(); len(errs) > 0 {
		t.Fatalf("%d writes failed while certificates were renewed (%d succeeded); first: %v", len(errs), ok.Load(), errs[0])
	}
	ctx := ctxT(t)
	for _, nd := range c.Nodes {
		cur := nd.Store.Identity().Cert
		if pki.Serial(cur) == pki.Serial(first[nd.ID]) || !time.Now().Before(cur.NotAfter) {
			t.Fatalf("%s: certificate %s (expires %s) not renewed", nd.ID, pki.Serial(cur), cur.NotAfter)
		}
		if n := sv.count(nd.ID); n < 2 {
			t.Fatalf("%s stored %d renewed identities, want ≥ 2", nd.ID, n)
		}
		// A write through this node after every first certificate expired
		// and every pool was closed: new handshakes with renewed certs.
		if _, err := nd.Store.PutSite(ctx, store.Site{Meta: store.Meta{ID: "after-" + nd.ID}}, store.W{Actor: "test"}); err != nil {
			t.Fatalf("write via %s after expiry of the first certificates: %v", nd.ID, err)
		}
		if err := nd.Store.Barrier(ctx); err != nil {
			t.Fatalf("barrier on %s: %v", nd.ID, err)
		}
	}
	t.Logf("%d writes during renewal, 0 failed; renewals stored: n0=%d n1=%d n2=%d", ok.Load(),
		sv.count("n0"), sv.count("n1"), sv.count("n2"))
	recs, err := c.Nodes[c.Leader()].Store.MemberRecords()
	if err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.Nodes {
		r := recs[nd.ID]
		cur := pki.Serial(nd.Store.Identity().Cert)
		if r.CertSerial != cur && r.PrevSerial != cur {
			t.Fatalf("%s: member record %+v does not hold its current serial %s", nd.ID, r, cur)
		}
		if r.CAHash != storetest.Site().CAHash() || r.CertNotAfter.IsZero() {
			t.Fatalf("%s: member record %+v", nd.ID, r)
		}
	}
}

// TestClusterRotateCA: the site CA is replaced on three nodes, through a
// follower, while writes go on through every node with none failing (no
// moment where two nodes refuse each other). Afterwards every node's
// signing CA is the new one, alone in its trust, and its certificate is
// the new CA's; a node with a certificate of the old CA is refused with a
// clear error, and new connections among the members work.
func TestClusterRotateCA(t *testing.T) {
	sv := &saved{ids: map[string][]*pki.Identity{}}
	c := storetest.NewCluster(t, 3, func(cfg *store.Config) { cfg.OnIdentity = sv.hook(cfg.NodeID) })
	oldCA := storetest.Site()
	stop := make(chan struct{})
	ok, fails := writer(t, c, stop)
	time.Sleep(200 * time.Millisecond)
	f := c.Follower()
	start := time.Now()
	rep, err := c.Nodes[f].Store.RotateCA(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	time.Sleep(300 * time.Millisecond)
	for _, nd := range c.Nodes {
		nd.Store.CloseConns()
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	if errs := fails(); len(errs) > 0 {
		t.Fatalf("%d writes failed during the CA rotation (%d succeeded); first: %v", len(errs), ok.Load(), errs[0])
	}
	t.Logf("CA rotated in %s (old sha256:%.12s, new sha256:%.12s); %d writes during it, 0 failed", took.Round(time.Millisecond),
		rep.OldCA, rep.NewCA, ok.Load())
	if rep.OldCA != oldCA.CAHash() || rep.NewCA == rep.OldCA || len(rep.Members) != 3 {
		t.Fatalf("rotation report %+v", rep)
	}
	for _, nd := range c.Nodes {
		id := nd.Store.Identity()
		if id.CAHash() != rep.NewCA || len(id.Trust) != 0 || id.Cert.CheckSignatureFrom(id.CA) != nil || id.CAKey == nil {
			t.Fatalf("%s after rotation: CA %s, %d more trusted, cert from new CA: %v", nd.ID, id.CAHash(), len(id.Trust),
				id.Cert.CheckSignatureFrom(id.CA) == nil)
		}
		if rep.Members[nd.ID] != pki.Serial(id.Cert) {
			t.Fatalf("%s: report says %s, holds %s", nd.ID, rep.Members[nd.ID], pki.Serial(id.Cert))
		}
		if n := sv.count(nd.ID); n != 4 {
			t.Fatalf("%s stored %d identities, want 4 (trust, switch, renew, drop)", nd.ID, n)
		}
		if _, err := nd.Store.PutSite(ctxT(t), store.Site{Meta: store.Meta{ID: "post-" + nd.ID}}, store.W{Actor: "test"}); err != nil {
			t.Fatalf("write via %s after rotation: %v", nd.ID, err)
		}
	}
	// New join tokens carry the new CA.
	tok, _, err := c.Nodes[0].Store.CreateJoinToken(ctxT(t), time.Hour, store.W{Actor: "test"})
	if err != nil || !strings.HasSuffix(tok, rep.NewCA) {
		t.Fatalf("join token after rotation: %q %v", tok, err)
	}
	// A certificate of the old CA is refused now, on the forward port.
	stale := storetest.IdentityFrom(oldCA, "stale")
	_, _, err = forwardPost(t, c.Nodes[0].Store.ForwardAddr(), "/raft/barrier", nil, presenting(stale))
	if err == nil || !strings.Contains(err.Error(), "unknown certificate authority") {
		t.Fatalf("old-CA certificate after rotation: %v", err)
	}
	t.Logf("old-CA certificate after rotation: %v", err)
}

// TestExpiredOrForeignCertificateRefused: a node certificate past its
// NotAfter, or one from another site CA, gets no RPC: the handshake fails
// and the error says why. A store will not open with an expired
// certificate of its own, and says what to do.
func TestExpiredOrForeignCertificateRefused(t *testing.T) {
	c := storetest.NewCluster(t, 1)
	addr := c.Nodes[0].Store.ForwardAddr()
	ca := storetest.Site()
	key, _ := pki.NewKey()
	csr, _ := pki.NewCSR(key, "late")
	cert, err := ca.SignWith(csr, "late", pki.SignOptions{Now: time.Now().Add(-time.Hour), Validity: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	expired := &pki.Identity{CA: ca.CA, CAKey: ca.CAKey, Cert: cert, Key: key}
	_, _, err = forwardPost(t, addr, "/raft/barrier", nil, presenting(expired))
	if err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired certificate: %v", err)
	}
	t.Logf("expired client certificate: %v", err)
	foreign, _ := pki.NewSite("x", time.Now())
	_, _, err = forwardPost(t, addr, "/raft/barrier", nil, presenting(storetest.IdentityFrom(foreign, "x1")))
	if err == nil || !strings.Contains(err.Error(), "unknown certificate authority") {
		t.Fatalf("foreign-CA certificate: %v", err)
	}
	t.Logf("foreign-CA client certificate: %v", err)
	// As a client, a node refuses a server with a foreign certificate too.
	fc := storetest.IdentityFrom(foreign, "x2")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", fc.ServerTLS(tls.RequireAnyClientCert, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if conn, err := ln.Accept(); err == nil {
			_ = conn.(*tls.Conn).Handshake()
			conn.Close()
		}
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), pki.ClientTLSFrom(func() *pki.Identity { return ca }, nil))
	if err == nil {
		conn.Close()
		t.Fatal("a server with a foreign-CA certificate was accepted")
	}
	t.Logf("foreign-CA server: %v", err)
	if !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("foreign-CA server: %v", err)
	}

	cfg := storetest.Config("late", t.TempDir())
	cfg.Identity = expired
	if _, err := store.Open(cfg, storetest.Logger(), nil); !errors.Is(err, store.ErrInvalid) || !errors.Is(err, pki.ErrExpired) ||
		!strings.Contains(err.Error(), "join again") {
		t.Fatalf("open with an expired certificate: %v", err)
	}
}

// presenting is a client TLS configuration that presents id's certificate
// and does not check the server, so that what is tested is the server's
// verdict on the client's certificate.
func presenting(id *pki.Identity) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true,
		Certificates: []tls.Certificate{{Certificate: [][]byte{id.Cert.Raw}, PrivateKey: id.Key, Leaf: id.Cert}}}
}
