package api

import (
	"fmt"
	"strconv"

	"github.com/labstack/echo/v4"

	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// Handlers are thin: decode, call Backend, answer with a view (view.go);
// errors go to the one error handler (errors.go). One file per resource:
// status.go, sites.go, machines.go, bmc.go, images.go, events.go (jobs and
// events), agent.go; the helpers they share are here.

func who(c echo.Context) principal {
	p, _ := c.Get(ctxPrincipal).(principal)
	return p
}

func (s *Server) w(c echo.Context, reason, msg string) store.W {
	return store.W{Actor: who(c).actor(), Reason: reason, Message: msg}
}

func notFound(kind, id string) error { return fmt.Errorf("%w: %s %q", store.ErrNotFound, kind, id) }

// checkText applies the free-text rule (rules.CheckText) to one field.
func checkText(field, v string, max int) error {
	if err := rules.CheckText(v, max); err != nil {
		return invalid(field, "%v", err)
	}
	return nil
}

// firstErr returns the first non-nil error.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// queryInt parses an optional integer query parameter within [lo, hi].
func queryInt(c echo.Context, name string, def, lo, hi int) (int, error) {
	v := c.QueryParam(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, invalid(name, "must be an integer in %d..%d", lo, hi)
	}
	return n, nil
}

// maybeBarrier honours ?consistent=true (documented in /v1/openapi.json).
func (s *Server) maybeBarrier(c echo.Context) error {
	switch c.QueryParam("consistent") {
	case "", "false":
		return nil
	case "true":
	default:
		return invalid("consistent", "want true or false")
	}
	return s.b.Barrier(c.Request().Context())
}

// validateWhy checks the free-text reason and message a client gives for an action.
func validateWhy(reason, message string) error {
	return firstErr(checkText("reason", reason, rules.MaxTextLen), checkText("message", message, rules.MaxDescriptionLen))
}
