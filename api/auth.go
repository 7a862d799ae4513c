package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"kiln/api/agentapi"
	"kiln/store"
)

// Role is what a bearer token may do. Viewer < Operator < Admin; Agent is a
// separate role held only by per-boot agent tokens (Backend.VerifyAgentToken)
// and valid only on /v1/agent/* for its own machine.
type Role string

// Roles.
const (
	RoleViewer   Role = "viewer"   // GET only
	RoleOperator Role = "operator" // viewer + machine actions (provision, release, erase, inspect, claim)
	RoleAdmin    Role = "admin"    // everything
	RoleAgent    Role = "agent"    // /v1/agent/* for one machine and boot
)

func (r Role) rank() int {
	switch r {
	case RoleViewer:
		return 1
	case RoleOperator:
		return 2
	case RoleAdmin:
		return 3
	}
	return 0
}

// allows reports whether a token of role r may use a route that needs role need.
func (r Role) allows(need Role) bool {
	if need == RoleAgent || r == RoleAgent {
		return r == need
	}
	return r.rank() >= need.rank() && r.rank() > 0
}

// TokenSpec is one static API token. SHA256 is the lower-case hex SHA-256 of
// the token string; the token itself is never held by the server.
type TokenSpec struct {
	Name   string `json:"name" yaml:"name"`
	Role   Role   `json:"role" yaml:"role"`
	SHA256 string `json:"sha256" yaml:"sha256"`
}

// HashToken returns the lower-case hex SHA-256 of token, the form TokenSpec.SHA256 holds.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// AdminTokenBytes is the entropy of a generated admin token (bytes; the file holds hex).
const AdminTokenBytes = 32

// LoadOrCreateAdminToken returns the admin token stored at path, creating it
// (AdminTokenBytes random bytes as hex, mode 0600, parent directory 0700) on
// first start. A file that exists but is empty or group/world readable is an
// error. The caller puts TokenSpec{Name: "admin", Role: RoleAdmin,
// SHA256: HashToken(token)} into Config.Tokens and drops the token.
func LoadOrCreateAdminToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		fi, err := os.Stat(path)
		if err != nil {
			return "", fmt.Errorf("api: admin token: %w", err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			return "", fmt.Errorf("api: admin token %s has mode %v; want 0600 (chmod 600 it)", path, fi.Mode().Perm())
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", fmt.Errorf("api: admin token file %s is empty; delete it to have a new one generated", path)
		}
		return tok, nil
	case errors.Is(err, fs.ErrNotExist):
	default:
		return "", fmt.Errorf("api: admin token: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("api: admin token dir: %w", err)
	}
	raw := make([]byte, AdminTokenBytes)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("api: admin token: %w", err)
	}
	tok := hex.EncodeToString(raw)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("api: admin token: %w", err)
	}
	if _, err := f.WriteString(tok + "\n"); err != nil {
		f.Close()
		return "", fmt.Errorf("api: admin token: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", fmt.Errorf("api: admin token: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("api: admin token: %w", err)
	}
	return tok, nil
}

// principal is who made a request.
type principal struct {
	Name    string // TokenSpec.Name, or the machine ID for agents
	Role    Role
	Machine string // agents only
}

func (p principal) actor() string {
	if p.Role == RoleAgent {
		return "agent:" + p.Machine
	}
	return "token:" + p.Name
}

const ctxPrincipal = "kiln.principal"

// tokenTable holds static tokens by hash.
type tokenTable struct {
	byHash map[[sha256.Size]byte]TokenSpec
}

func newTokenTable(specs []TokenSpec) (*tokenTable, error) {
	t := &tokenTable{byHash: make(map[[sha256.Size]byte]TokenSpec, len(specs))}
	for i, sp := range specs {
		raw, err := hex.DecodeString(sp.SHA256)
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("%w: tokens[%d].sha256: want 64 hex digits", ErrBadConfig, i)
		}
		switch sp.Role {
		case RoleViewer, RoleOperator, RoleAdmin:
		case RoleAgent:
			return nil, fmt.Errorf("%w: tokens[%d].role: agent tokens are per-boot, not configured", ErrBadConfig, i)
		default:
			return nil, fmt.Errorf("%w: tokens[%d].role: %q is not admin|operator|viewer", ErrBadConfig, i, sp.Role)
		}
		if sp.Name == "" {
			return nil, fmt.Errorf("%w: tokens[%d].name: required", ErrBadConfig, i)
		}
		var k [sha256.Size]byte
		copy(k[:], raw)
		if _, dup := t.byHash[k]; dup {
			return nil, fmt.Errorf("%w: tokens[%d]: same token as an earlier entry", ErrBadConfig, i)
		}
		t.byHash[k] = sp
	}
	return t, nil
}

// lookup finds the spec of a presented token. The map is keyed by the
// token's SHA-256, so lookup time does not depend on how much of a guess
// matches a real token; the final compare is constant-time anyway.
func (t *tokenTable) lookup(token string) (TokenSpec, bool) {
	k := sha256.Sum256([]byte(token))
	sp, ok := t.byHash[k]
	if !ok {
		return TokenSpec{}, false
	}
	want, _ := hex.DecodeString(sp.SHA256)
	return sp, subtle.ConstantTimeCompare(want, k[:]) == 1
}

// bearer returns the token of an "Authorization: Bearer TOKEN" header.
func bearer(c echo.Context) (string, bool) {
	h := c.Request().Header.Get(echo.HeaderAuthorization)
	const p = "bearer "
	if len(h) <= len(p) || !strings.EqualFold(h[:len(p)], p) {
		return "", false
	}
	tok := strings.TrimSpace(h[len(p):])
	return tok, tok != ""
}

// requireRole is the middleware of a route that needs a static token of at least role need.
func (s *Server) requireRole(need Role) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			tok, ok := bearer(c)
			if !ok {
				s.m.authFailures.WithLabelValues("missing").Inc()
				return fmt.Errorf("%w: no bearer token; send Authorization: Bearer TOKEN", ErrUnauthorized)
			}
			sp, ok := s.tokens.lookup(tok)
			if !ok {
				s.m.authFailures.WithLabelValues("unknown").Inc()
				return fmt.Errorf("%w: token rejected", ErrUnauthorized)
			}
			if !sp.Role.allows(need) {
				s.m.authFailures.WithLabelValues("role").Inc()
				return fmt.Errorf("%w: role %s may not %s %s (needs %s)", ErrForbidden, sp.Role,
					c.Request().Method, c.Path(), need)
			}
			c.Set(ctxPrincipal, principal{Name: sp.Name, Role: sp.Role})
			return next(c)
		}
	}
}

// HeaderMachine names the machine an agent request acts for.
const HeaderMachine = agentapi.HeaderMachine

// authAgent checks the request's bearer token as the per-boot agent token
// of the machine the X-Kiln-Machine header names. It runs before the body
// is read, so a refused agent request is answered at once, whatever body
// follows. The header is required (the agent always sends it); a body's
// machine_id, when present, must name the same machine (bodyMachine). An
// agent token of machine A can never act for B.
func (s *Server) authAgent(c echo.Context) (principal, error) {
	tok, ok := bearer(c)
	if !ok {
		s.m.authFailures.WithLabelValues("missing").Inc()
		return principal{}, fmt.Errorf("%w: no bearer token; the agent sends kiln.token from the kernel command line", ErrUnauthorized)
	}
	id := c.Request().Header.Get(HeaderMachine)
	if id == "" {
		s.m.authFailures.WithLabelValues("missing").Inc()
		return principal{}, invalid(HeaderMachine, "required: the header names the machine whose agent token this is")
	}
	if !s.b.VerifyAgentToken(id, tok) {
		// This replica may not hold the token's record yet: a node that has
		// just restarted replays the log into an empty FSM after its
		// election, and a follower may lag the write that issued the token.
		// Catch up with the leader and look again before refusing; a node
		// that cannot catch up answers 503 (the agent retries, maybe
		// elsewhere), never a 403 that would end the agent's build.
		bctx, cancel := context.WithTimeout(c.Request().Context(), agentCatchUpTimeout)
		err := s.b.Barrier(bctx)
		cancel()
		if err != nil {
			s.m.authFailures.WithLabelValues("agent_unverified").Inc()
			return principal{}, fmt.Errorf("%w: cannot check the agent token of machine %q while this node's store catches up (%v); retry", store.ErrTimeout, id, err)
		}
		if !s.b.VerifyAgentToken(id, tok) {
			s.m.authFailures.WithLabelValues("agent_machine").Inc()
			return principal{}, fmt.Errorf("%w: agent token not valid for machine %q", ErrForbidden, id)
		}
	}
	return principal{Name: id, Role: RoleAgent, Machine: id}, nil
}

// agentCatchUpTimeout bounds authAgent's wait for this node's replica to
// catch up with the leader before it judges an unknown agent token.
const agentCatchUpTimeout = 5 * time.Second

// bodyMachine checks the machine_id of an agent's body against the machine
// its token was checked for ("" = not given).
func (s *Server) bodyMachine(p principal, bodyID string) error {
	if bodyID != "" && bodyID != p.Machine {
		s.m.authFailures.WithLabelValues("agent_machine").Inc()
		return fmt.Errorf("%w: token is for machine %q, body names %q", ErrForbidden, p.Machine, bodyID)
	}
	return nil
}

// Authenticate looks a static token up in the server's token table, as the
// bearer middleware does, and returns its name and role (ok false for an
// unknown token, counted as a refused bearer). The web UI (api/ui) signs a
// token in with it and checks it again on every request, so a session
// carries exactly the roles of the API and ends when its token is removed
// from the configuration.
func (s *Server) Authenticate(token string) (name string, role Role, ok bool) {
	sp, ok := s.tokens.lookup(token)
	if !ok {
		s.m.authFailures.WithLabelValues("unknown").Inc()
		return "", "", false
	}
	return sp.Name, sp.Role, true
}

// Allows reports whether role r may use a route that needs role need (the
// order viewer < operator < admin; agent apart), the rule of every route.
func (r Role) Allows(need Role) bool { return r.allows(need) }
