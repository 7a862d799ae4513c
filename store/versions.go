package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/bbolt"
)

// Mixed versions (DESIGN.md "Mixed versions"): every node registers its
// binary version and the newest command type it understands; the leader
// writes a command type only when every server of the raft configuration
// understands it.

// MaxCommand is the newest command type this binary understands (and
// writes). A node reports it in its version record.
const MaxCommand = cmdEnd - 1

// BaselineCommand is the newest command type assumed for a server that has
// no version record: every binary that can be a member of a cluster with
// site certificates knows the cluster-trust commands up to
// CmdRemoveMember (21), and the version records came after them.
const BaselineCommand = CmdRemoveMember

// registerInterval is how often a node checks that its version record is
// current (and retries a failed registration).
const registerInterval = 500 * time.Millisecond

// gateTTL bounds how long the leader trusts its cached minimum over the
// servers (also dropped at once on a configuration change it makes and on
// every applied version record).
const gateTTL = time.Second

// NodeVersion is a node's version record (bucket node_versions, written by
// CmdRegisterNode with version fields): its binary version (as `kiln
// version` prints it) and the newest command type it understands; At is
// the leader's time of the registration.
//
// Env is the node's in-RAM environment as it serves it (file name →
// lower-case hex SHA-256, Config.Env; absent when the node reports none:
// an older binary, or no environment files). It came later than the other
// fields: a binary from before it ignores it in command 12.
type NodeVersion struct {
	Version    string            `json:"version"`
	MaxCommand CommandType       `json:"max_command"`
	At         time.Time         `json:"at"`
	Env        map[string]string `json:"env,omitempty"`
}

// UnsupportedByClusterError is returned (wrapping ErrUnsupportedByCluster)
// when a write needs a command type that a server of the configuration
// does not understand. Old lists those servers (ID → newest command type
// they understand; BaselineCommand when they never registered).
type UnsupportedByClusterError struct {
	Command CommandType
	Old     map[string]CommandType
	// Unregistered names the servers of Old that have no version record
	// (counted at BaselineCommand).
	Unregistered map[string]bool
}

func (e *UnsupportedByClusterError) Error() string {
	ids := make([]string, 0, len(e.Old))
	for id := range e.Old {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		if e.Unregistered[id] {
			parts[i] = fmt.Sprintf("%s (no version record: an older binary, or it has not registered yet; assumed to understand up to %d)", id, e.Old[id])
		} else {
			parts[i] = fmt.Sprintf("%s (understands up to %d)", id, e.Old[id])
		}
	}
	return fmt.Sprintf("store: command %s (%d) is not understood by every node of the cluster: %s; "+
		"upgrade %s (a node re-registers its version on start), then retry",
		e.Command, uint8(e.Command), strings.Join(parts, ", "), strings.Join(ids, ", "))
}

func (e *UnsupportedByClusterError) Unwrap() error { return ErrUnsupportedByCluster }

// applyNodeVersion stores the version fields of a CmdRegisterNode. A
// registration without them (older binaries, the leader registering a
// joiner's forward address) leaves the record as it is.
func applyNodeVersion(a *applyCtx, n *nodeInfo) error {
	if n.Version == "" && n.MaxCommand == 0 {
		return nil
	}
	raw, err := json.Marshal(NodeVersion{Version: n.Version, MaxCommand: n.MaxCommand, At: a.now, Env: n.Env})
	if err != nil {
		return err
	}
	return a.tx.Bucket(bNodeVersions).Put([]byte(n.ID), raw)
}

// nodeVersions reads every version record of the local replica.
func nodeVersions(tx *bbolt.Tx) (map[string]NodeVersion, error) {
	out := map[string]NodeVersion{}
	err := tx.Bucket(bNodeVersions).ForEach(func(k, v []byte) error {
		var nv NodeVersion
		if err := json.Unmarshal(v, &nv); err != nil {
			return fmt.Errorf("%w: version record of %s: %v", ErrCorrupt, k, err)
		}
		out[string(k)] = nv
		return nil
	})
	return out, err
}

// versionGate caches, on the leader, which servers understand which
// command types.
type versionGate struct {
	mu    sync.Mutex
	at    time.Time
	gen   uint64                 // fsm.versionsGen when computed
	caps  map[string]CommandType // server ID → newest understood type
	unreg map[string]bool        // servers without a version record
}

func (g *versionGate) invalidate() {
	g.mu.Lock()
	g.caps = nil
	g.mu.Unlock()
}

// checkVersions refuses (*UnsupportedByClusterError) a command type that
// some server of the raft configuration does not understand. Only the
// leader calls it, in applyLocal; this node itself understands MaxCommand.
func (s *Store) checkVersions(t CommandType) error {
	if s.raft == nil {
		return nil
	}
	g := &s.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	gen := s.fsm.versionsGen.Load()
	if g.caps == nil || g.gen != gen || time.Since(g.at) > gateTTL {
		f := s.raft.GetConfiguration()
		if err := f.Error(); err != nil {
			return fmt.Errorf("store: raft configuration: %w", err)
		}
		var vers map[string]NodeVersion
		if err := s.fsm.view(func(tx *bbolt.Tx) (err error) {
			vers, err = nodeVersions(tx)
			return err
		}); err != nil {
			return err
		}
		caps, unreg := map[string]CommandType{}, map[string]bool{}
		for _, sv := range f.Configuration().Servers {
			id := string(sv.ID)
			switch nv, ok := vers[id]; {
			case id == s.cfg.NodeID:
				caps[id] = s.maxCommand()
			case ok:
				caps[id] = nv.MaxCommand
			default:
				caps[id], unreg[id] = BaselineCommand, true
			}
		}
		g.caps, g.unreg, g.gen, g.at = caps, unreg, gen, time.Now()
	}
	var e *UnsupportedByClusterError
	for id, max := range g.caps {
		if max < t {
			if e == nil {
				e = &UnsupportedByClusterError{Command: t, Old: map[string]CommandType{}, Unregistered: map[string]bool{}}
			}
			e.Old[id] = max
			if g.unreg[id] {
				e.Unregistered[id] = true
			}
		}
	}
	if e != nil {
		return e
	}
	return nil
}

// unregisteredWait bounds how long a write waits for servers without a
// version record to register (a node added with Join on its behalf
// registers within registerInterval of knowing the leader; an older binary
// never does, and is then refused).
const unregisteredWait = 3 * time.Second

// checkVersionsWait is checkVersions, waiting up to unregisteredWait (or
// ctx) while the only servers refusing t are ones that have not
// registered a version record yet.
func (s *Store) checkVersionsWait(ctx context.Context, t CommandType) error {
	deadline := time.Now().Add(unregisteredWait)
	for {
		err := s.checkVersions(t)
		var ue *UnsupportedByClusterError
		if !errors.As(err, &ue) || len(ue.Unregistered) < len(ue.Old) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-s.done:
			return ErrClosed
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// maxCommand is the newest type this node claims (MaxCommand unless a test
// lowered it to play an older binary).
func (s *Store) maxCommand() CommandType {
	if c := CommandType(s.claimMax.Load()); c != 0 {
		return c
	}
	return MaxCommand
}

func (s *Store) version() string {
	if s.cfg.Version == "" {
		return "dev"
	}
	return s.cfg.Version
}

// selfInfo is this node's registration: forward address and version.
func (s *Store) selfInfo() *nodeInfo {
	n := &nodeInfo{ID: s.cfg.NodeID, ForwardAddr: s.ForwardAddr(), Version: s.version(), MaxCommand: s.maxCommand()}
	if s.cfg.Env != nil {
		if env := s.cfg.Env(); len(env) > 0 {
			n.Env = env
		}
	}
	return n
}

// registered reports whether the local replica holds this node's current
// forward address and version.
func (s *Store) registered() bool {
	self := s.selfInfo()
	ok := false
	_ = s.fsm.view(func(tx *bbolt.Tx) error {
		if string(tx.Bucket(bNodes).Get([]byte(self.ID))) != self.ForwardAddr {
			return nil
		}
		var nv NodeVersion
		raw := tx.Bucket(bNodeVersions).Get([]byte(self.ID))
		ok = raw != nil && json.Unmarshal(raw, &nv) == nil && nv.Version == self.Version && nv.MaxCommand == self.MaxCommand &&
			maps.Equal(nv.Env, self.Env)
		return nil
	})
	return ok
}

// registerVersions keeps this node's version record current: once a
// leader is known, whenever the local replica's record (forward address,
// version, newest command type) differs from this binary's, it writes
// CmdRegisterNode with them, retrying every registerInterval. Runs until
// Close.
func (s *Store) registerVersions() {
	defer s.wg.Done()
	t := time.NewTicker(registerInterval)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		if leader, _ := s.Leader(); leader == "" || s.registered() {
			continue
		}
		ctx, cancel := context.WithTimeout(s.baseCtx, s.cfg.ApplyTimeout)
		c := &command{Type: CmdRegisterNode, W: W{Actor: "store:" + s.cfg.NodeID, Reason: "version"}, Node: s.selfInfo()}
		_, _, err := s.write(ctx, c)
		cancel()
		if err != nil && !errors.Is(err, ErrClosed) {
			s.log.Debug("register version", "err", err)
		}
	}
}

// nodeVersionMsg is the node_registered event's message: "version V,
// commands up to N", or "" for a registration without version fields.
func nodeVersionMsg(n *nodeInfo) string {
	if n.Version == "" && n.MaxCommand == 0 {
		return ""
	}
	return fmt.Sprintf("version %s, commands up to %d", n.Version, uint8(n.MaxCommand))
}

// NodeVersions returns the version record of every node that registered
// one (node ID → record), from the local replica.
func (s *Store) NodeVersions() (map[string]NodeVersion, error) {
	var out map[string]NodeVersion
	err := s.fsm.view(func(tx *bbolt.Tx) (err error) {
		out, err = nodeVersions(tx)
		return err
	})
	return out, err
}
