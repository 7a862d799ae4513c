package store

import (
	"context"
	"time"

	"kiln/store/pki"
)

// CreateJoinTokenTTL is CreateJoinToken without the MinJoinTokenTTL floor,
// so a test can see a token expire.
func (s *Store) CreateJoinTokenTTL(ctx context.Context, ttl time.Duration) (string, error) {
	tok := pki.NewToken(s.Identity().CAHash())
	_, _, err := s.write(ctx, &command{Type: CmdPutJoinToken, W: W{Actor: "test"},
		JoinToken: &JoinToken{Hash: tok.Hash(), TTL: ttl}})
	return tok.String(), err
}

// ClaimMaxCommand makes s play a binary that understands command types
// only up to t (0: this binary's MaxCommand again); its version record is
// re-registered with it within registerInterval.
func (s *Store) ClaimMaxCommand(t CommandType) { s.claimMax.Store(uint32(t)) }

// PlayMaxKnown makes s's FSM treat command types above t as unknown (0:
// this binary's own set again), as a node on an older binary would when
// the version gate was bypassed. It does not change s's version record.
func (s *Store) PlayMaxKnown(t CommandType) { s.fsm.knownMax.Store(uint32(t)) }

// ApplyRaw hands data to raft.Apply on s (the leader) as it is, bypassing
// encoding and the version gate, and returns the FSM's error for it.
func (s *Store) ApplyRaw(data []byte) error {
	f := s.raft.Apply(data, s.cfg.ApplyTimeout)
	if err := f.Error(); err != nil {
		return err
	}
	if r, ok := f.Response().(*applyResult); ok {
		return r.Err
	}
	return nil
}

// CloseConns closes s's pooled outbound connections (raft and forward
// RPC), so the next requests make new TLS handshakes.
func (s *Store) CloseConns() {
	s.trans.CloseStreams()
	s.http.CloseIdleConnections()
}
