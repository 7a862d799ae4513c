package api

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"kiln/store"
)

// The cluster routes (admin): join tokens and members. The backend serves
// them when it implements ClusterBackend (the appliance's does: it is
// *store.Store's own methods).
//
//	POST   /v1/cluster/tokens        JoinTokenRequest → 201 JoinTokenCreated
//	GET    /v1/cluster/members       → 200 ClusterMemberList
//	DELETE /v1/cluster/members/{id}  → 204
//	POST   /v1/site/rotate-key       → 200 SiteKeyRotation (backend: SiteKeyBackend)

// ClusterBackend is what the cluster routes need (store.Store implements it).
// Errors: store.ErrInvalid (a TTL out of range, the only voter), store.ErrNotFound
// (no such member), store.ErrNotLeader.
type ClusterBackend interface {
	// CreateJoinToken returns the token string (shown once, never stored)
	// and its stored record (hash, leader-fixed expiry).
	CreateJoinToken(ctx context.Context, ttl time.Duration, w store.W) (string, store.JoinToken, error)
	Members() ([]store.ClusterMember, error)
	RemoveMember(ctx context.Context, id string, w store.W) error
}

// JoinTokenRequest is the body of POST /v1/cluster/tokens. TTL is a Go
// duration ("30m", "24h"); empty means store.DefaultJoinTokenTTL (1 h);
// store.MinJoinTokenTTL (1 m) to store.MaxJoinTokenTTL (7 days).
type JoinTokenRequest struct {
	TTL string `json:"ttl,omitempty"`
}

// JoinTokenCreated answers POST /v1/cluster/tokens. Token is the whole
// one-time token ("kiln1.SECRET.CAHASH"): it is shown only here; the
// cluster keeps only its SHA-256. ID is its short name in events.
type JoinTokenCreated struct {
	Token     string    `json:"token"`
	ID        string    `json:"id"`
	ExpiresAt time.Time `json:"expires_at"`
	CAHash    string    `json:"ca_hash"` // "sha256:" + hex SPKI SHA-256 of the site CA
}

// ClusterMember is one server of the raft configuration.
type ClusterMember struct {
	ID          string    `json:"id"`
	RaftAddr    string    `json:"raft_addr"`
	ForwardAddr string    `json:"forward_addr,omitempty"`
	Suffrage    string    `json:"suffrage"`
	Leader      bool      `json:"leader"`
	CertSerial  string    `json:"cert_serial,omitempty"` // hex; empty for the bootstrap node
	JoinedAt    time.Time `json:"joined_at,omitzero"`
	TokenID     string    `json:"token_id,omitempty"`
	// Version is the node's binary version and MaxCommand the newest store
	// command type it understands, as it last registered them; empty and 0
	// when it has not registered (an older binary). The cluster writes a
	// command type only once every member understands it.
	Version    string `json:"version,omitempty"`
	MaxCommand int    `json:"max_command,omitempty"`
	// CertNotAfter and CAHash ("sha256:" + hex) are the node's certificate's
	// expiry and issuing CA as its last renewal recorded them; empty before
	// its first renewal.
	CertNotAfter time.Time `json:"cert_not_after,omitzero"`
	CAHash       string    `json:"ca_hash,omitempty"`
}

// ClusterMemberList answers GET /v1/cluster/members.
type ClusterMemberList struct {
	Items []ClusterMember `json:"items"`
}

// SiteKeyBackend rotates the site key that seals BMC credentials (the
// appliance implements it; appliance/sitekey.go says how no credential is
// ever unopenable during the rotation).
type SiteKeyBackend interface {
	RotateSiteKey(ctx context.Context, w store.W) (SiteKeyRotation, error)
}

// SiteKeyRotation answers POST /v1/site/rotate-key: the new key's ID (hex of
// the first 8 bytes of its SHA-256, also the key ID sealed blobs carry), the
// IDs of the keys it replaced and how many credentials were re-sealed.
type SiteKeyRotation struct {
	KeyID     string   `json:"key_id"`
	OldKeyIDs []string `json:"old_key_ids"`
	Resealed  int      `json:"resealed"`
}

// errNoCluster: the backend has no cluster operations.
var errNoCluster = fmt.Errorf("%w: this server's backend has no cluster operations", ErrInvalid)

// clusterRoutes registers the cluster routes (called from routes).
func (s *Server) clusterRoutes(admin, view echo.MiddlewareFunc) {
	s.e.POST("/v1/cluster/tokens", s.createJoinToken, admin)
	s.e.GET("/v1/cluster/members", s.listMembers, view)
	s.e.DELETE("/v1/cluster/members/:id", s.removeMember, admin)
	s.e.POST("/v1/site/rotate-key", s.rotateSiteKey, admin)
	s.caRoutes(admin) // cluster_ca.go
}

// clusterDocOps documents the cluster routes (appended to docOps).
func clusterDocOps() []docOp {
	return append([]docOp{
		{Method: "POST", Path: "/v1/cluster/tokens", Summary: "Create a one-time join token for a new node (shown once; only its hash is stored)",
			Role: RoleAdmin, Body: JoinTokenRequest{}, Status: 201, Resp: JoinTokenCreated{}},
		{Method: "GET", Path: "/v1/cluster/members", Summary: "The cluster's members (raft configuration, forward addresses, certificates)",
			Role: RoleViewer, Status: 200, Resp: ClusterMemberList{}},
		{Method: "DELETE", Path: "/v1/cluster/members/{id}", Summary: "Remove a member; its certificate is refused from then on",
			Role: RoleAdmin, Status: 204},
		{Method: "POST", Path: "/v1/site/rotate-key", Summary: "Replace the site key: re-seal every BMC credential under a new key, on every member, with no credential unopenable at any moment",
			Role: RoleAdmin, Status: 200, Resp: SiteKeyRotation{}},
	}, caDocOps()...) // cluster_ca.go
}

func (s *Server) cluster() (ClusterBackend, error) {
	cb, ok := s.b.(ClusterBackend)
	if !ok {
		return nil, errNoCluster
	}
	return cb, nil
}

func (s *Server) createJoinToken(c echo.Context) error {
	cb, err := s.cluster()
	if err != nil {
		return err
	}
	var req JoinTokenRequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, true); err != nil {
		return err
	}
	var ttl time.Duration
	if req.TTL != "" {
		if ttl, err = time.ParseDuration(req.TTL); err != nil || ttl <= 0 {
			return invalid("ttl", "want a positive Go duration such as 30m or 24h")
		}
	}
	tok, rec, err := cb.CreateJoinToken(c.Request().Context(), ttl, s.w(c, "join_token_created", ""))
	if err != nil {
		return err
	}
	caHash := ""
	if i := len(tok) - 64; i > 0 {
		caHash = "sha256:" + tok[i:]
	}
	return c.JSON(http.StatusCreated, JoinTokenCreated{Token: tok, ID: rec.ID(), ExpiresAt: rec.Expires, CAHash: caHash})
}

func (s *Server) listMembers(c echo.Context) error {
	cb, err := s.cluster()
	if err != nil {
		return err
	}
	ms, err := cb.Members()
	if err != nil {
		return err
	}
	out := ClusterMemberList{Items: make([]ClusterMember, 0, len(ms))}
	for _, m := range ms {
		out.Items = append(out.Items, ClusterMember{ID: m.ID, RaftAddr: m.RaftAddr, ForwardAddr: m.ForwardAddr,
			Suffrage: m.Suffrage, Leader: m.Leader, CertSerial: m.Record.CertSerial, JoinedAt: m.Record.JoinedAt,
			TokenID: m.Record.TokenID, Version: m.Version.Version, MaxCommand: int(m.Version.MaxCommand),
			CertNotAfter: m.Record.CertNotAfter})
		if h := m.Record.CAHash; h != "" {
			out.Items[len(out.Items)-1].CAHash = "sha256:" + h
		}
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) removeMember(c echo.Context) error {
	cb, err := s.cluster()
	if err != nil {
		return err
	}
	if err := cb.RemoveMember(c.Request().Context(), c.Param("id"), s.w(c, "member_removed", "")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

func (s *Server) rotateSiteKey(c echo.Context) error {
	kb, ok := s.b.(SiteKeyBackend)
	if !ok {
		return errNoCluster
	}
	out, err := kb.RotateSiteKey(c.Request().Context(), s.w(c, "site_key_rotated", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}
