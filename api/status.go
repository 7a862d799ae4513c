package api

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"kiln/store"
)

// Status routes: /healthz, /readyz and GET /v1/site/status (what central pulls).

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, Status{Status: "ok"})
}

func (s *Server) readyz(c echo.Context) error {
	h := s.b.Health()
	if !h.Ready {
		return c.JSON(http.StatusServiceUnavailable, Status{Status: "not_ready", Leader: h.Leader, Error: h.Halted})
	}
	return c.JSON(http.StatusOK, Status{Status: "ok", Leader: h.Leader})
}

// imagePresenceTimeout bounds the site status's questions to the other
// nodes about the image files they hold.
const imagePresenceTimeout = 3 * time.Second

func (s *Server) siteStatus(c echo.Context) error {
	counts, err := s.b.CountByState()
	if err != nil {
		return err
	}
	st := SiteStatus{Time: time.Now().UTC(), Counts: make(map[store.MachineState]int, len(store.AllStates)),
		Failures: []MachineSummary{}, Images: []ImageVersion{}}
	for _, state := range store.AllStates {
		st.Counts[state] = counts[state]
		st.Total += counts[state]
	}
	failed, _, err := s.b.ListMachines(store.ListOptions{State: store.StateFailed, Limit: FailuresInStatus})
	if err != nil {
		return err
	}
	for _, m := range failed {
		st.Failures = append(st.Failures, MachineSummary{ID: m.ID, Name: m.Name, Rack: m.Rack, State: m.State,
			Reason: m.Reason, Message: m.Message, Updated: m.UpdatedAt})
	}
	imgs, err := s.b.ListImages()
	if err != nil {
		return err
	}
	var held map[string][]string
	if p, ok := s.b.(ImagePresenceBackend); ok {
		ctx, cancel := context.WithTimeout(c.Request().Context(), imagePresenceTimeout)
		held, err = p.ImagePresence(ctx)
		cancel()
		if err != nil {
			s.log.Warn("site status: image presence incomplete", "err", err)
		}
	}
	for _, im := range imgs {
		iv := ImageVersion{ID: im.ID, Name: im.Name, Version: im.Version, SHA256: im.SHA256}
		if held != nil {
			iv.Nodes = append([]string{}, held[im.ID]...)
		}
		st.Images = append(st.Images, iv)
	}
	if e, ok := s.b.(EnvBackend); ok {
		if st.Environment, err = e.EnvStatus(); err != nil {
			s.log.Warn("site status: environment comparison unavailable", "err", err)
		}
	}
	st.Raft = s.b.Health()
	st.Version = st.Raft.Version
	return c.JSON(http.StatusOK, st)
}
