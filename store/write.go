package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

// The write path: every typed write (writes.go) builds a command, prepare
// fixes its leader-chosen fields, and write applies it through the store's
// consensus (consensus.go): through raft on the leader (applyLocal) or
// forwarded to the leader (forward.go), or through the local log of a store
// opened with OpenLocal (local.go).

// randID returns prefix + 16 lower-case hex digits (64 random bits).
func randID(prefix string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("store: crypto/rand failed: " + err.Error()) // never on Linux ≥ 3.17
	}
	return prefix + hex.EncodeToString(b[:])
}

// prepare fixes everything non-deterministic before the command is logged:
// the time and any missing record IDs (not for an agent report, which never
// creates a machine: its apply refuses an empty ID). Only the leader calls
// it.
func prepare(c *command) {
	c.Time = time.Now().UTC()
	setID := func(m *Meta, prefix string) {
		if m.ID == "" {
			m.ID = randID(prefix)
		}
	}
	switch {
	case c.Site != nil:
		setID(&c.Site.Meta, "site-")
	case c.Rack != nil:
		setID(&c.Rack.Meta, "rack-")
	case c.BMC != nil:
		setID(&c.BMC.Meta, "bmc-")
	case c.Image != nil:
		setID(&c.Image.Meta, "img-")
	case c.Job != nil:
		setID(&c.Job.Meta, "job-")
	}
	if c.Type == CmdAgentReport || c.Type == CmdAgentReportV2 {
		return
	}
	for i := range c.Machines {
		setID(&c.Machines[i].Meta, "m-")
	}
	if c.Type == CmdPutJoinToken && c.JoinToken != nil {
		c.JoinToken.Created = c.Time
		c.JoinToken.Expires = c.Time.Add(c.JoinToken.TTL)
	}
}

// write submits c: on the leader through raft, on a follower through the
// forward RPC. It returns the JSON of the records written and, when the
// write was applied on this node, the records themselves (recs, see
// applyResult; nil when forwarded).
func (s *Store) write(ctx context.Context, c *command) (vals []json.RawMessage, recs []any, err error) {
	if s.closed.Load() {
		return nil, nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	start := time.Now()
	s.m.commands.WithLabelValues(c.Type.String()).Inc()
	for attempt := 0; ; attempt++ {
		if s.IsLeader() {
			vals, recs, err = s.cons.commit(ctx, c)
			if !errors.Is(err, raft.ErrNotLeader) {
				break
			}
		}
		recs = nil
		vals, err = s.forward(ctx, c)
		if !errors.Is(err, errSelfLeader) || attempt > 3 {
			break
		}
	}
	if err == nil {
		s.m.commit.Observe(time.Since(start).Seconds())
	}
	return vals, recs, err
}

// applyLocal prepares c and commits it through raft on this (leader) node.
// raft.ErrNotLeader is returned unwrapped-compatible (errors.Is) when
// leadership was gone before the entry was enqueued, so it is safe to retry.
func (s *Store) applyLocal(ctx context.Context, c *command) ([]json.RawMessage, []any, error) {
	if err := s.checkVersionsWait(ctx, c.Type); err != nil {
		return nil, nil, err
	}
	upgradeCommand(c, s.checkVersions)
	prepare(c)
	data, err := encodeCommand(c)
	if err != nil {
		return nil, nil, err
	}
	// Decode the entry here, in the caller's goroutine and before raft
	// takes it, so the FSM's single goroutine need not (see predecode).
	defer s.fsm.predecode(data)()
	f := s.raft.Apply(data, s.timeout(ctx))
	if err := f.Error(); err != nil {
		switch {
		case errors.Is(err, raft.ErrEnqueueTimeout):
			return nil, nil, fmt.Errorf("%w: %s not enqueued: %v", ErrTimeout, c.Type, err)
		case errors.Is(err, raft.ErrNotLeader):
			return nil, nil, err
		case errors.Is(err, raft.ErrRaftShutdown):
			return nil, nil, fmt.Errorf("%w: %v", ErrClosed, err)
		}
		// ErrLeadershipLost etc.: the entry may or may not commit later.
		return nil, nil, fmt.Errorf("store: %s outcome unknown: %w", c.Type, err)
	}
	res, ok := f.Response().(*applyResult)
	if !ok {
		return nil, nil, fmt.Errorf("store: %s: unexpected FSM response %T", c.Type, f.Response())
	}
	return res.Values, res.Recs, res.Err
}

// upgradeCommand writes a machine command as the newest one every node
// understands (check returns nil for a command type they all do):
// put_machines_v2 and v3 as put_machines_v4, else v2 as v3; agent_report as
// agent_report_v2; put_image as put_image_v2. Each newer command is the older under a wider table,
// keeping the newer fields as the write gives them, so a write that clears
// them (ending maintenance, say) clears them instead of keeping the stored
// values as the older command must.
func upgradeCommand(c *command, check func(CommandType) error) {
	switch c.Type {
	case CmdPutMachinesV2, CmdPutMachinesV3:
		if check(CmdPutMachinesV4) == nil {
			c.Type = CmdPutMachinesV4
		} else if c.Type == CmdPutMachinesV2 && check(CmdPutMachinesV3) == nil {
			c.Type = CmdPutMachinesV3
		}
	case CmdAgentReport:
		if check(CmdAgentReportV2) == nil {
			c.Type = CmdAgentReportV2
		}
	case CmdPutImage:
		if check(CmdPutImageV2) == nil {
			c.Type = CmdPutImageV2
		}
	}
}

// errSelfLeader: forwardRetry found this node is now the leader.
var errSelfLeader = errors.New("store: this node is the leader")
