package store

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/bbolt"

	"kiln/store/pki"
)

// Defaults used when a Config duration or count is zero.
const (
	DefaultApplyTimeout      = 10 * time.Second
	DefaultSnapshotThreshold = 8192
	DefaultSnapshotInterval  = 2 * time.Minute
	DefaultTrailingLogs      = 10240
	snapshotsRetained        = 2
	transportPool            = 3
	transportTimeout         = 10 * time.Second
	maxForwardBody           = 64 << 20 // bytes; a 2,000-machine intake is a few MiB
)

// File names inside Config.DataDir.
const (
	RaftDBFile = "raft.db" // raft log + stable store (raft-boltdb/v2, bbolt)
	FSMDBFile  = "fsm.db"  // FSM state (bbolt), rebuilt from snapshot + log on start
	// Snapshots live in DataDir/snapshots/ (raft.FileSnapshotStore).
)

// Config configures one store node. NodeID, DataDir, RaftAddr and
// ForwardAddr are required; zero durations and counts take the raft
// defaults (raft.DefaultConfig) or the Default* constants above.
type Config struct {
	NodeID      string // raft server ID, stable across restarts
	DataDir     string // holds raft.db, fsm.db, snapshots/
	RaftAddr    string // host:port the raft TCP transport binds and advertises; port 0 picks one
	ForwardAddr string // host:port of the forward RPC (HTTP); port 0 picks one
	Bootstrap   bool   // bootstrap a single-voter cluster if DataDir holds no raft state

	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout, CommitTimeout time.Duration

	SnapshotThreshold uint64        // log entries between snapshots
	SnapshotInterval  time.Duration // how often to check SnapshotThreshold
	ApplyTimeout      time.Duration // bound on one write (enqueue + forward retries)

	// TrailingLogs is how many log entries are kept after a snapshot
	// (0 = DefaultTrailingLogs). A follower further behind gets the snapshot.
	TrailingLogs uint64
	// RaftLogLevel is the hclog level of raft's own log lines ("" = "WARN").
	RaftLogLevel string

	// Identity is this node's site certificate and key and the site CA
	// (package pki). Required: raft runs over mutual TLS with it and the
	// forward RPC is HTTPS requiring a client certificate of the CA. A
	// bootstrap node makes one with pki.NewSite; a joining node gets one
	// from Enroll.
	Identity *pki.Identity
	// JoinSecrets, when set, gives the site secrets (name → bytes) this
	// node hands a node it admits (the appliance passes the site key).
	JoinSecrets func() (map[string][]byte, error)
	// OnSecrets, when set, stores site secrets a member pushes to this node
	// (PushSecrets: a rotated site keyring); an error refuses them.
	OnSecrets func(map[string][]byte) error
	// Version is this node's binary version as `kiln version` prints it
	// ("" = "dev"), reported in its version record (versions.go).
	Version string
	// Env, when set, gives this node's in-RAM environment digests (file
	// name → lower-case hex SHA-256) for its version record (NodeVersion.Env);
	// called every registerInterval, so it must be cheap (cached). nil or an
	// empty map reports none.
	Env func() map[string]string
	// CertLifetime is the lifetime of the node certificates this node
	// issues (enrollment, renewal; 0 = pki.NodeValidity, 10 years).
	CertLifetime time.Duration
	// RenewFraction: this node renews its certificate once this fraction of
	// its lifetime has passed (0 = DefaultRenewFraction; 0 < f < 1).
	RenewFraction float64
	// OnIdentity, when set, stores a new identity of this node (a renewed
	// certificate, a CA rotation step) before it is used; an error keeps
	// the old one. The appliance saves it to raft.tls_dir.
	OnIdentity func(*pki.Identity) error
	// PeerFiles, when set, serves GET /peer/... on the forward RPC to other
	// members only (a client certificate of the site CA; see PeerGet). The
	// appliance serves its image catalog here (appliance/imagesync.go).
	PeerFiles http.Handler
}

// Validate reports a missing required field.
func (c *Config) Validate() error {
	switch {
	case c.NodeID == "":
		return fmt.Errorf("%w: Config.NodeID is empty", ErrInvalid)
	case c.DataDir == "":
		return fmt.Errorf("%w: Config.DataDir is empty", ErrInvalid)
	case c.RaftAddr == "":
		return fmt.Errorf("%w: Config.RaftAddr is empty", ErrInvalid)
	case c.ForwardAddr == "":
		return fmt.Errorf("%w: Config.ForwardAddr is empty", ErrInvalid)
	case c.Identity == nil:
		return fmt.Errorf("%w: Config.Identity is nil: raft and the forward RPC run only over mutual TLS "+
			"with a site certificate (pki.NewSite at bootstrap, Enroll when joining)", ErrInvalid)
	case c.Identity.NodeID() != c.NodeID:
		return fmt.Errorf("%w: the site certificate names node %q, Config.NodeID is %q", ErrInvalid, c.Identity.NodeID(), c.NodeID)
	case time.Now().After(c.Identity.Cert.NotAfter):
		return fmt.Errorf("%w: %w", ErrInvalid, c.Identity.Check())
	case c.RenewFraction < 0 || c.RenewFraction >= 1:
		return fmt.Errorf("%w: Config.RenewFraction %v: want 0 < f < 1 (0 = %v)", ErrInvalid, c.RenewFraction, DefaultRenewFraction)
	}
	return nil
}

// Store is one node of the replicated store. Writes go through raft (a
// follower forwards them to the leader); reads use the local replica.
type Store struct {
	cfg   Config
	log   *slog.Logger
	cons  consensus  // raftConsensus (Open) or *localLog (OpenLocal)
	raft  *raft.Raft // nil on a local store
	fsm   *fsm
	logDB *raftboltdb.BoltStore
	trans *raft.NetworkTransport
	fwdLn net.Listener
	http  *http.Client
	m     *metrics

	enrollSem chan struct{} // bounds concurrent /cluster/enroll

	ident   atomic.Pointer[pki.Identity] // current identity (renewal, CA rotation: renew.go)
	renewMu sync.Mutex                   // one renewal or rotation step at a time

	gate     versionGate   // leader's view of what the servers understand (versions.go)
	claimMax atomic.Uint32 // test hook: play a binary understanding only up to this type

	leaderCh  chan bool
	done      chan struct{}
	baseCtx   context.Context // cancelled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closed    atomic.Bool
	runOnce   atomic.Bool

	hadState bool // raft state existed at Open

	readyMu     sync.Mutex
	readyTarget uint64 // commit index seen when a leader was first known; 0 = not yet
	ready       bool
}

// Open opens (or creates) the node's data directory, validates raft.db and
// fsm.db (a corrupt or truncated file is an error wrapping ErrCorrupt that
// names the file), starts raft and binds the raft and forward listeners.
// Call Run to serve forwarded writes and Close to stop. reg may be nil.
func Open(cfg Config, log *slog.Logger, reg *prometheus.Registry) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	log = log.With("component", "store", "node", cfg.NodeID)
	if cfg.ApplyTimeout == 0 {
		cfg.ApplyTimeout = DefaultApplyTimeout
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("store: data dir: %w", err)
	}
	s := &Store{cfg: cfg, log: log, leaderCh: make(chan bool, 16), done: make(chan struct{}),
		enrollSem: make(chan struct{}, maxEnrollInFlight)}
	s.ident.Store(cfg.Identity)
	s.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second,
		TLSClientConfig: pki.ClientTLSFrom(s.Identity, s.peerCheck), TLSHandshakeTimeout: handshakeTimeout}}
	s.baseCtx, s.cancel = context.WithCancel(context.Background())
	ok := false
	defer func() {
		if !ok {
			s.cancel()
			if s.raft != nil {
				_ = s.raft.Shutdown().Error()
			}
			s.closeParts()
		}
	}()

	level := cfg.RaftLogLevel
	if level == "" {
		level = "WARN"
	}
	hlog := hclog.New(&hclog.LoggerOptions{Name: "raft", Level: hclog.LevelFromString(level),
		Output: &slogWriter{log: log.With("sub", "raft")}, DisableTime: true})

	raftPath := filepath.Join(cfg.DataDir, RaftDBFile)
	// Check the files against each other before anything is created or
	// replaced: a refused directory is left exactly as it was.
	dirState, err := readDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if err := dirState.check(); err != nil {
		return nil, err
	}
	logDB, err := raftboltdb.New(raftboltdb.Options{Path: raftPath, BoltOptions: &bbolt.Options{Timeout: boltTimeout}})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, raftPath, err)
	}
	s.logDB = logDB
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, snapshotsRetained, hlog)
	if err != nil {
		return nil, fmt.Errorf("store: snapshot store in %s: %w", cfg.DataDir, err)
	}
	if s.fsm, err = newFSM(filepath.Join(cfg.DataDir, FSMDBFile), log); err != nil {
		return nil, err
	}
	s.m = newMetrics()
	s.fsm.onApplyError = func(code string) { s.m.applyErrors.WithLabelValues(code).Inc() }

	stream, err := newTLSStream(cfg.RaftAddr, pki.ServerTLSFrom(s.Identity, tls.RequireAndVerifyClientCert, s.peerCheck),
		pki.ClientTLSFrom(s.Identity, s.peerCheck))
	if err != nil {
		return nil, fmt.Errorf("store: raft transport on %s: %w", cfg.RaftAddr, err)
	}
	s.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: stream,
		MaxPool: transportPool, Timeout: transportTimeout, Logger: hlog})
	fwdLn, err := net.Listen("tcp", cfg.ForwardAddr)
	if err != nil {
		return nil, fmt.Errorf("store: forward listener on %s: %w", cfg.ForwardAddr, err)
	}
	s.fwdLn = tls.NewListener(fwdLn, pki.ServerTLSFrom(s.Identity, tls.VerifyClientCertIfGiven, s.peerCheck))

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = hlog
	rc.NotifyCh = s.leaderCh
	rc.BatchApplyCh = true
	rc.NoLegacyTelemetry = true
	setDur(&rc.HeartbeatTimeout, cfg.HeartbeatTimeout)
	setDur(&rc.ElectionTimeout, cfg.ElectionTimeout)
	setDur(&rc.LeaderLeaseTimeout, cfg.LeaderLeaseTimeout)
	setDur(&rc.CommitTimeout, cfg.CommitTimeout)
	rc.SnapshotThreshold = orU64(cfg.SnapshotThreshold, DefaultSnapshotThreshold)
	rc.TrailingLogs = orU64(cfg.TrailingLogs, DefaultTrailingLogs)
	rc.SnapshotInterval = DefaultSnapshotInterval
	setDur(&rc.SnapshotInterval, cfg.SnapshotInterval)
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("%w: raft config: %v", ErrInvalid, err)
	}

	has, err := raft.HasExistingState(logDB, logDB, snaps)
	if err != nil {
		return nil, fmt.Errorf("store: read raft state in %s: %w", raftPath, err)
	}
	s.raft, err = raft.NewRaft(rc, s.fsm, logDB, logDB, snaps, s.trans)
	if err != nil {
		return nil, fmt.Errorf("%w: start raft from %s (snapshots in %s): %v", ErrCorrupt, raftPath,
			filepath.Join(cfg.DataDir, "snapshots"), err)
	}
	s.cons = raftConsensus{s}
	s.hadState = has
	if !has && cfg.Bootstrap {
		conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter,
			ID: rc.LocalID, Address: s.trans.LocalAddr()}}}
		if err := s.raft.BootstrapCluster(conf).Error(); err != nil {
			return nil, fmt.Errorf("store: bootstrap: %w", err)
		}
		log.Info("bootstrapped single-node cluster", "raft_addr", s.trans.LocalAddr())
	}
	if err := s.m.register(s, reg); err != nil {
		return nil, fmt.Errorf("store: metrics: %w", err)
	}
	s.wg.Add(3)
	go s.watchLeadership()
	go s.registerVersions()
	go s.renewLoop()
	ok = true
	log.Info("store open", "data_dir", cfg.DataDir, "raft_addr", s.RaftAddr(), "forward_addr", s.ForwardAddr(),
		"existing_state", has)
	return s, nil
}

func setDur(dst *time.Duration, v time.Duration) {
	if v > 0 {
		*dst = v
	}
}

func orU64(v, def uint64) uint64 {
	if v == 0 {
		return def
	}
	return v
}

// slogWriter turns hclog's text lines into slog records.
type slogWriter struct{ log *slog.Logger }

func (w *slogWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	switch {
	case strings.Contains(line, "[ERROR]"):
		w.log.Error(line)
	case strings.Contains(line, "[WARN]"):
		w.log.Warn(line)
	default:
		w.log.Info(line)
	}
	return len(p), nil
}

// RaftAddr is the address the raft transport listens on (resolved when
// Config.RaftAddr had port 0); "" on a local store (OpenLocal).
func (s *Store) RaftAddr() string {
	if s.trans == nil {
		return ""
	}
	return string(s.trans.LocalAddr())
}

// ForwardAddr is the address the forward RPC listens on; "" on a local
// store (OpenLocal).
func (s *Store) ForwardAddr() string {
	if s.fwdLn == nil {
		return ""
	}
	return s.fwdLn.Addr().String()
}

// NodeID is Config.NodeID.
func (s *Store) NodeID() string { return s.cfg.NodeID }

// watchLeadership registers this node's forward address in the FSM each
// time it becomes leader (so followers can find it), until Close.
func (s *Store) watchLeadership() {
	defer s.wg.Done()
	for {
		select {
		case <-s.done:
			return
		case isLeader := <-s.leaderCh:
			if !isLeader {
				s.log.Info("lost leadership")
				continue
			}
			s.log.Info("became leader")
			s.gate.invalidate()
			if s.registered() {
				continue
			}
			ctx, cancel := context.WithTimeout(s.baseCtx, s.cfg.ApplyTimeout)
			c := &command{Type: CmdRegisterNode, W: W{Actor: "store:" + s.cfg.NodeID, Reason: "leader_elected"},
				Node: s.selfInfo()}
			if _, _, err := s.applyLocal(ctx, c); err != nil {
				s.log.Warn("register forward address", "err", err)
			}
			cancel()
		}
	}
}

// forwardAddrOf returns the forward address registered for raft server id.
func (s *Store) forwardAddrOf(id string) (string, error) {
	var addr string
	err := s.fsm.view(func(tx *bbolt.Tx) error {
		v := tx.Bucket(bNodes).Get([]byte(id))
		if v == nil {
			return fmt.Errorf("%w: node %s", ErrNotFound, id)
		}
		addr = string(v)
		return nil
	})
	return addr, err
}

// Run serves the forward RPC on ForwardAddr until ctx ends, then shuts the
// HTTP server down. It does not close the store (call Close). On a local
// store (OpenLocal) there is nothing to serve: Run waits for ctx or Close
// and returns nil.
func (s *Store) Run(ctx context.Context, log *slog.Logger) error {
	if !s.runOnce.CompareAndSwap(false, true) {
		return errors.New("store: Run called twice")
	}
	if s.raft == nil {
		select {
		case <-ctx.Done():
		case <-s.done:
		}
		return nil
	}
	if log == nil {
		log = s.log
	} else {
		log = log.With("component", "store")
	}
	srv := &http.Server{Handler: s.forwardHandler(), ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)} // TLS handshake refusals land here
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(s.fwdLn) }()
	log.Info("forward RPC serving", "addr", s.ForwardAddr())
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-errc
		return nil
	case err := <-errc:
		if s.closed.Load() {
			return nil
		}
		return fmt.Errorf("store: forward RPC: %w", err)
	}
}

// Close stops raft (or the local log) and closes every file and listener.
// Safe to call twice.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.done)
		s.cancel()
		if e := s.cons.stop(); e != nil {
			err = errors.Join(err, e)
		}
		s.wg.Wait()
		err = errors.Join(err, s.closeParts())
		s.log.Info("store closed")
	})
	return err
}

func (s *Store) closeParts() error {
	var err error
	if s.fwdLn != nil {
		_ = s.fwdLn.Close()
	}
	if s.trans != nil {
		err = errors.Join(err, s.trans.Close())
	}
	if s.fsm != nil {
		err = errors.Join(err, s.fsm.close())
	}
	if s.logDB != nil {
		err = errors.Join(err, s.logDB.Close())
	}
	if s.http != nil {
		s.http.CloseIdleConnections()
	}
	return err
}

// IsLeader reports whether this node is the raft leader now (always true
// on a local store).
func (s *Store) IsLeader() bool { return s.cons.isLeader() }

// Leader returns the current leader's raft server ID and raft address, or
// empty strings when none is known. A local store returns its own NodeID
// ("local") and an empty address.
func (s *Store) Leader() (id, raftAddr string) { return s.cons.leader() }

// WaitLeader blocks until a leader is known (and, on a leader, until its
// forward address is registered) or ctx ends (ctx.Err()). A local store
// leads from the start: nil at once (ErrClosed once closed).
func (s *Store) WaitLeader(ctx context.Context) error {
	if s.raft == nil {
		if s.closed.Load() {
			return ErrClosed
		}
		return nil
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if id, _ := s.Leader(); id != "" {
			if _, err := s.forwardAddrOf(id); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return ErrClosed
		case <-t.C:
		}
	}
}

// Ready reports whether the node can serve current reads: a leader is
// known, and the local FSM has applied every entry up to the raft commit
// index that this node saw at the first moment (since Open) a leader was
// known (entries the FSM never sees, no-ops and barriers, count as applied
// once raft has dispatched them: fsmCaughtUp). Once true it stays true
// while a leader is known; with no leader it is false. A local store is
// always Ready.
func (s *Store) Ready() bool { return s.cons.ready() }

func (s *Store) raftReady() bool {
	if s.fsm.halt.Load() != nil {
		return false
	}
	if id, _ := s.Leader(); id == "" {
		return false
	}
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if s.ready {
		return true
	}
	if s.readyTarget == 0 {
		s.readyTarget = s.raft.CommitIndex()
		if s.readyTarget == 0 {
			return false
		}
	}
	if s.fsm.applied.Load() >= s.readyTarget || s.fsmCaughtUp(s.readyTarget) {
		s.ready = true
	}
	return s.ready
}

// fsmCaughtUp reports whether the FSM has applied every entry it will ever
// be given at or below idx, when its applied index is below idx: raft has
// dispatched everything up to idx (AppliedIndex) and every entry after the
// FSM's applied index is one raft never hands to the FSM — a no-op (a new
// leader's first entry) or a barrier (a consistent read): hashicorp/raft
// prepareLog and runFSM's shouldSend pass only LogCommand and
// LogConfiguration. Raft's commit index counts those entries, so without
// this a follower restarted after a failover or a consistent read stayed
// not Ready until the next write.
func (s *Store) fsmCaughtUp(idx uint64) bool {
	applied := s.fsm.applied.Load()
	if s.raft.AppliedIndex() < idx || idx-applied > maxReadyGap {
		return false
	}
	var l raft.Log
	for i := applied + 1; i <= idx; i++ {
		if err := s.logDB.GetLog(i, &l); err != nil {
			return false
		}
		if l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return false
		}
	}
	return true
}

// maxReadyGap bounds the log entries fsmCaughtUp reads (entries the FSM does
// not see between two commands; more than this and Ready waits for a write).
const maxReadyGap = 4096

// Halted is nil while the FSM applies the log, and the *HaltError (wrapping
// ErrFSMHalted) once it stopped at an entry of a command type this binary
// does not know. A halted node is not Ready, refuses snapshots, and every
// write or wait on it fails with this error; it stays so until the process
// restarts (on a binary that knows the type). See DESIGN.md "Mixed versions".
func (s *Store) Halted() error {
	if h := s.fsm.halt.Load(); h != nil {
		return h
	}
	return nil
}

// Stats returns raft's statistics (raft.Raft.Stats: state, term,
// last_log_index, commit_index, applied_index, last_snapshot_index, ...)
// plus fsm_applied_index and last_event_index. A local store reports
// state "Leader", mode "local" and its local index as last_log_index,
// commit_index and applied_index.
func (s *Store) Stats() map[string]string {
	if s.raft == nil {
		return s.cons.(*localLog).stats()
	}
	st := s.raft.Stats()
	st["fsm_applied_index"] = fmt.Sprint(s.fsm.applied.Load())
	st["last_event_index"] = fmt.Sprint(s.fsm.lastEvent.Load())
	if h := s.fsm.halt.Load(); h != nil {
		st["fsm_halted_at_index"] = fmt.Sprint(h.Index)
	}
	return st
}

// Snapshot asks raft to take a snapshot now (raft.Raft.Snapshot) and waits
// for it. Raft refuses when nothing was written since the last one.
// ErrNoRaft on a local store.
func (s *Store) Snapshot() error {
	if s.raft == nil {
		return fmt.Errorf("%w: Snapshot", ErrNoRaft)
	}
	if h := s.fsm.halt.Load(); h != nil {
		return fmt.Errorf("snapshot refused: %w", h) // raft's own error would not wrap it
	}
	return s.raft.Snapshot().Error()
}

// Join adds a voter (raft server id at raftAddr) and registers its forward
// address. On a follower it is forwarded to the leader. Idempotent.
// ErrNoRaft on a local store.
func (s *Store) Join(ctx context.Context, id, raftAddr, forwardAddr string) error {
	if s.raft == nil {
		return fmt.Errorf("%w: Join %s", ErrNoRaft, id)
	}
	if id == "" || raftAddr == "" {
		return fmt.Errorf("%w: join needs id and raft address", ErrInvalid)
	}
	if !s.IsLeader() {
		err := s.forwardMembership(ctx, "/raft/join", membership{ID: id, RaftAddr: raftAddr, ForwardAddr: forwardAddr})
		if !errors.Is(err, errSelfLeader) {
			return err
		}
	}
	return s.joinLocal(ctx, raftAddr, &nodeInfo{ID: id, ForwardAddr: forwardAddr})
}

// joinLocal registers n (its forward address, and its version when the
// joiner sent it, JoinVia) and adds it as a voter at raftAddr.
func (s *Store) joinLocal(ctx context.Context, raftAddr string, n *nodeInfo) error {
	id, forwardAddr := n.ID, n.ForwardAddr
	if forwardAddr != "" {
		c := &command{Type: CmdRegisterNode, W: W{Actor: "store:" + s.cfg.NodeID, Reason: "join"}, Node: n}
		if _, _, err := s.applyLocal(ctx, c); err != nil {
			return fmt.Errorf("store: join %s: %w", id, err)
		}
	}
	defer s.gate.invalidate()
	if err := s.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, s.timeout(ctx)).Error(); err != nil {
		return fmt.Errorf("store: join %s at %s: %w", id, raftAddr, err)
	}
	s.log.Info("voter added", "id", id, "raft_addr", raftAddr, "forward_addr", forwardAddr)
	return nil
}

// Remove removes voter id from the cluster and forgets its forward
// address. On a follower it is forwarded to the leader. ErrNoRaft on a
// local store.
func (s *Store) Remove(ctx context.Context, id string) error {
	if s.raft == nil {
		return fmt.Errorf("%w: Remove %s", ErrNoRaft, id)
	}
	if !s.IsLeader() {
		err := s.forwardMembership(ctx, "/raft/remove", membership{ID: id})
		if !errors.Is(err, errSelfLeader) {
			return err
		}
	}
	return s.removeLocal(ctx, id)
}

func (s *Store) removeLocal(ctx context.Context, id string) error {
	defer s.gate.invalidate()
	if err := s.raft.RemoveServer(raft.ServerID(id), 0, s.timeout(ctx)).Error(); err != nil {
		return fmt.Errorf("store: remove %s: %w", id, err)
	}
	if id == s.cfg.NodeID {
		return nil // a removed leader steps down; the new leader may clean up
	}
	_, _, err := s.applyLocal(ctx, &command{Type: CmdRemoveNode, ID: id,
		W: W{Actor: "store:" + s.cfg.NodeID, Reason: "remove"}})
	return err
}

// timeout is min(ApplyTimeout, time left on ctx).
func (s *Store) timeout(ctx context.Context) time.Duration {
	d := s.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok {
		if left := time.Until(dl); left < d {
			d = left
		}
	}
	if d <= 0 {
		d = time.Millisecond
	}
	return d
}

// Barrier returns once the local replica reflects every write committed
// before the call: on the leader VerifyLeader + raft Barrier; on a follower
// it asks the leader (forward RPC) for its applied index and waits until
// the local FSM has applied it. Errors: ErrNotLeader (no reachable
// leader), ctx.Err(). On a local store every acknowledged write is
// already applied: Barrier returns nil (ctx.Err() once ctx has ended,
// ErrClosed once closed).
func (s *Store) Barrier(ctx context.Context) error { return s.cons.barrier(ctx) }

func (s *Store) raftBarrier(ctx context.Context) error {
	if s.IsLeader() {
		_, err := s.barrierLocal(ctx)
		if !errors.Is(err, raft.ErrNotLeader) && !errors.Is(err, raft.ErrLeadershipLost) {
			return err
		}
	}
	idx, err := s.forwardBarrier(ctx)
	if errors.Is(err, errSelfLeader) {
		_, err = s.barrierLocal(ctx)
		return err
	}
	if err != nil {
		return err
	}
	return s.waitApplied(ctx, idx)
}

func (s *Store) barrierLocal(ctx context.Context) (uint64, error) {
	if err := s.raft.VerifyLeader().Error(); err != nil {
		return 0, err
	}
	if err := s.raft.Barrier(s.timeout(ctx)).Error(); err != nil {
		return 0, err
	}
	return s.fsm.applied.Load(), nil
}

func (s *Store) waitApplied(ctx context.Context, idx uint64) error {
	for {
		_, ch := s.fsm.waitChans()
		if s.fsm.applied.Load() >= idx {
			return nil
		}
		if h := s.fsm.halt.Load(); h != nil {
			return h
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return ErrClosed
		}
	}
}
