package api

import (
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
		return c.JSON(http.StatusServiceUnavailable, Status{Status: "not_ready", Leader: h.Leader})
	}
	return c.JSON(http.StatusOK, Status{Status: "ok", Leader: h.Leader})
}

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
	for _, im := range imgs {
		st.Images = append(st.Images, ImageVersion{ID: im.ID, Name: im.Name, Version: im.Version, SHA256: im.SHA256})
	}
	st.Raft = s.b.Health()
	st.Version = st.Raft.Version
	return c.JSON(http.StatusOK, st)
}
