package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"kiln/api/agentapi"
	"kiln/store"
)

// Issue 15 (package agentapi, release.go): the gated credentials of a
// release build (per-boot agent token) and the installed OS's first-boot
// report (first-boot token). Neither answer nor body is logged.

func (s *Server) agentCredentials(c echo.Context) error {
	p, err := s.authAgent(c)
	if err != nil {
		return err
	}
	cr, err := s.b.AgentCredentials(c.Request().Context(), p.Machine)
	if err != nil {
		return err
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusOK, cr)
}

// agentFirstBoot takes POST /v1/agent/firstboot: bearer = the first-boot
// token of the machine the body (or the X-Kiln-Machine header) names,
// checked on this node's replica after catching up with the leader when it
// does not match at once (any node accepts it). 204 once recorded.
func (s *Server) agentFirstBoot(c echo.Context) error {
	tok, ok := bearer(c)
	if !ok {
		s.m.authFailures.WithLabelValues("missing").Inc()
		return fmt.Errorf("%w: no bearer token; the OS sends the token of /etc/kiln/firstboot.json", ErrUnauthorized)
	}
	var rep agentapi.FirstBootReport
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &rep, false); err != nil {
		return err
	}
	id := c.Request().Header.Get(HeaderMachine)
	if id == "" {
		id = rep.MachineID
	}
	if id == "" {
		return invalid("machine_id", "required: the machine of /etc/kiln/firstboot.json")
	}
	if !s.b.VerifyFirstBootToken(id, tok) {
		bctx, cancel := context.WithTimeout(c.Request().Context(), agentCatchUpTimeout)
		err := s.b.Barrier(bctx)
		cancel()
		if err != nil {
			return fmt.Errorf("%w: cannot check the first-boot token of machine %q while this node's store catches up (%v); retry", store.ErrTimeout, id, err)
		}
		if !s.b.VerifyFirstBootToken(id, tok) {
			s.m.authFailures.WithLabelValues("first_boot").Inc()
			return fmt.Errorf("%w: first-boot token not valid for machine %q", ErrForbidden, id)
		}
	}
	if _, err := s.b.FirstBoot(c.Request().Context(), id, rep); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
