// Package storetest gives tests real stores: NewLocal, a local store (the
// real apply path over a temporary bbolt file, no raft; store.OpenLocal), and
// NewCluster, in-process raft clusters of n nodes on 127.0.0.1 with short
// raft timeouts, each in its own t.TempDir, with helpers to stop, restart and
// find the leader. Set KILN_STORE_LOG=1 to see the stores' logs on stderr.
package storetest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"kiln/store"
	"kiln/store/pki"
)

// Short raft timing for tests (loopback, -race, 2 CPUs).
const (
	HeartbeatTimeout   = 300 * time.Millisecond
	ElectionTimeout    = 300 * time.Millisecond
	LeaderLeaseTimeout = 200 * time.Millisecond
	CommitTimeout      = 5 * time.Millisecond
	ApplyTimeout       = 5 * time.Second
)

// Config returns a store.Config for node id in dir on 127.0.0.1 (ports
// chosen by the kernel) with the short timeouts above and a certificate for
// id from the test site CA (Site).
func Config(id, dir string) store.Config {
	return store.Config{NodeID: id, DataDir: dir, RaftAddr: "127.0.0.1:0", ForwardAddr: "127.0.0.1:0",
		HeartbeatTimeout: HeartbeatTimeout, ElectionTimeout: ElectionTimeout,
		LeaderLeaseTimeout: LeaderLeaseTimeout, CommitTimeout: CommitTimeout, ApplyTimeout: ApplyTimeout,
		Identity: Identity(id)}
}

var (
	siteOnce sync.Once
	site     *pki.Identity
)

// Site is the test process's site CA (made once, on first use, as the
// identity of a node "storetest-ca"): every Config of one test binary
// trusts it, as the nodes of one site do.
func Site() *pki.Identity {
	siteOnce.Do(func() {
		var err error
		if site, err = pki.NewSite("storetest-ca", time.Now()); err != nil {
			panic("storetest: site CA: " + err.Error())
		}
	})
	return site
}

// Identity returns a fresh key and a certificate for node id signed by Site.
func Identity(id string) *pki.Identity {
	return IdentityFrom(Site(), id)
}

// IdentityFrom returns a fresh key and a certificate for node id signed by
// the CA of ca (which must hold the CA key); the identity carries that CA
// and its key, as an enrolled node's does.
func IdentityFrom(ca *pki.Identity, id string) *pki.Identity {
	key, err := pki.NewKey()
	if err != nil {
		panic("storetest: key: " + err.Error())
	}
	csr, err := pki.NewCSR(key, id)
	if err != nil {
		panic("storetest: csr: " + err.Error())
	}
	cert, err := ca.Sign(csr, id, time.Now())
	if err != nil {
		panic("storetest: sign: " + err.Error())
	}
	return &pki.Identity{CA: ca.CA, CAKey: ca.CAKey, Cert: cert, Key: key}
}

// Logger returns a discard logger, or a stderr text logger when
// KILN_STORE_LOG is set.
func Logger() *slog.Logger {
	if os.Getenv("KILN_STORE_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Node is one cluster member. Store is nil while the node is stopped.
type Node struct {
	ID    string
	Cfg   store.Config // RaftAddr/ForwardAddr hold the resolved addresses after the first start
	Store *store.Store

	cancel  context.CancelFunc
	runDone chan error
}

// Cluster is a set of nodes; Close (registered with t.Cleanup) stops all.
type Cluster struct {
	t     testing.TB
	Nodes []*Node
}

// NewCluster starts n nodes: node 0 bootstraps, the others join through
// node 0. It returns when every node knows the leader. mod, if given,
// edits each node's Config before the first start.
func NewCluster(t testing.TB, n int, mod ...func(*store.Config)) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	t.Cleanup(c.Close)
	for i := 0; i < n; i++ {
		cfg := Config(fmt.Sprintf("n%d", i), t.TempDir())
		cfg.Bootstrap = i == 0
		for _, m := range mod {
			m(&cfg)
		}
		nd := &Node{ID: cfg.NodeID, Cfg: cfg}
		c.Nodes = append(c.Nodes, nd)
		if err := c.start(nd); err != nil {
			t.Fatalf("start %s: %v", nd.ID, err)
		}
		if i == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := nd.Store.WaitLeader(ctx)
			cancel()
			if err != nil {
				t.Fatalf("%s: no leader after bootstrap: %v", nd.ID, err)
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.Nodes[0].Store.Join(ctx, nd.ID, nd.Cfg.RaftAddr, nd.Cfg.ForwardAddr)
		cancel()
		if err != nil {
			t.Fatalf("join %s: %v", nd.ID, err)
		}
	}
	for _, nd := range c.Nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := nd.Store.WaitLeader(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: no leader: %v", nd.ID, err)
		}
	}
	c.waitVersions()
	return c
}

// waitVersions waits until the leader's replica holds every node's version
// record (each node registers it within a second of knowing the leader;
// until then the leader writes no command type newer than
// store.BaselineCommand, see store/DESIGN.md "Mixed versions").
func (c *Cluster) waitVersions() {
	c.t.Helper()
	leader := c.Nodes[c.Leader()].Store
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		vs, err := leader.NodeVersions()
		if err != nil {
			c.t.Fatalf("version records: %v", err)
		}
		n := 0
		for _, nd := range c.Nodes {
			if vs[nd.ID].MaxCommand != 0 {
				n++
			}
		}
		if n == len(c.Nodes) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("only %d of %d nodes registered their version within 10 s", n, len(c.Nodes))
		}
	}
}

func (c *Cluster) start(nd *Node) error {
	s, err := store.Open(nd.Cfg, Logger(), nil)
	if err != nil {
		return err
	}
	nd.Cfg.RaftAddr, nd.Cfg.ForwardAddr = s.RaftAddr(), s.ForwardAddr()
	ctx, cancel := context.WithCancel(context.Background())
	nd.Store, nd.cancel, nd.runDone = s, cancel, make(chan error, 1)
	go func() { nd.runDone <- s.Run(ctx, Logger()) }()
	return nil
}

// Stop ends node i's Run and closes its store (a clean shutdown; the data
// directory stays). Stopping a stopped node does nothing.
func (c *Cluster) Stop(i int) {
	nd := c.Nodes[i]
	if nd.Store == nil {
		return
	}
	nd.cancel()
	if err := <-nd.runDone; err != nil {
		c.t.Errorf("%s Run: %v", nd.ID, err)
	}
	if err := nd.Store.Close(); err != nil {
		c.t.Errorf("%s Close: %v", nd.ID, err)
	}
	nd.Store = nil
}

// Restart reopens a stopped node i on its data directory and addresses.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	nd := c.Nodes[i]
	if nd.Store != nil {
		c.t.Fatalf("%s is running", nd.ID)
	}
	if err := c.start(nd); err != nil {
		c.t.Fatalf("restart %s: %v", nd.ID, err)
	}
}

// Leader waits up to 10 s until exactly one running node is leader, and
// its forward address is registered, and returns its index.
func (c *Cluster) Leader() int {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		idx, count := -1, 0
		for i, nd := range c.Nodes {
			if nd.Store != nil && nd.Store.IsLeader() {
				idx, count = i, count+1
			}
		}
		if count == 1 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := c.Nodes[idx].Store.WaitLeader(ctx)
			cancel()
			if err == nil {
				return idx
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("no single leader within 10s")
	return -1
}

// Follower returns the index of a running non-leader node, or -1.
func (c *Cluster) Follower() int {
	for i, nd := range c.Nodes {
		if nd.Store != nil && !nd.Store.IsLeader() {
			return i
		}
	}
	return -1
}

// Close stops every running node.
func (c *Cluster) Close() {
	for i := range c.Nodes {
		c.Stop(i)
	}
}
