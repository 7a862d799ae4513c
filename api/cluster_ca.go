package api

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"kiln/store"
)

// The site CA rotation route (admin):
//
//	POST /v1/cluster/rotate-ca  → 200 CARotation (backend: CABackend)

// CABackend rotates the site CA (store.Store.RotateCA: new CA trusted
// everywhere, then signing, every member re-issued under it, then the old
// CA dropped; store/DESIGN.md "Cluster trust"). Errors:
// store.ErrUnsupportedByCluster (a member too old), store.ErrNotFound (a
// member without a forward address), or the failing step and member.
type CABackend interface {
	RotateCA(ctx context.Context) (store.CARotation, error)
}

// CARotation answers POST /v1/cluster/rotate-ca: the old and the new site
// CA ("sha256:" + hex SPKI SHA-256, the form join tokens carry) and each
// member's new certificate serial (hex).
type CARotation struct {
	OldCA   string            `json:"old_ca"`
	NewCA   string            `json:"new_ca"`
	Members map[string]string `json:"members"`
}

func (s *Server) caRoutes(admin echo.MiddlewareFunc) {
	s.e.POST("/v1/cluster/rotate-ca", s.rotateCA, admin)
}

func caDocOps() []docOp {
	return []docOp{{Method: "POST", Path: "/v1/cluster/rotate-ca",
		Summary: "Replace the site CA: the new CA is trusted by every member, then signs, every member is re-issued under it, then the old CA is dropped (no moment where two members refuse each other); join tokens made before stop working",
		Role:    RoleAdmin, Status: 200, Resp: CARotation{}}}
}

func (s *Server) rotateCA(c echo.Context) error {
	cb, ok := s.b.(CABackend)
	if !ok {
		return errNoCluster
	}
	r, err := cb.RotateCA(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, CARotation{OldCA: "sha256:" + r.OldCA, NewCA: "sha256:" + r.NewCA, Members: r.Members})
}
