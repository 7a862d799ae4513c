package store

import (
	"context"
	"time"

	"kiln/store/pki"
)

// CreateJoinTokenTTL is CreateJoinToken without the MinJoinTokenTTL floor,
// so a test can see a token expire.
func (s *Store) CreateJoinTokenTTL(ctx context.Context, ttl time.Duration) (string, error) {
	tok := pki.NewToken(s.cfg.Identity.CAHash())
	_, _, err := s.write(ctx, &command{Type: CmdPutJoinToken, W: W{Actor: "test"},
		JoinToken: &JoinToken{Hash: tok.Hash(), TTL: ttl}})
	return tok.String(), err
}

// ClaimMaxCommand makes s play a binary that understands command types
// only up to t (0: this binary's MaxCommand again); its version record is
// re-registered with it within registerInterval.
func (s *Store) ClaimMaxCommand(t CommandType) { s.claimMax.Store(uint32(t)) }
