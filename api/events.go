package api

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"kiln/store"
)

// Jobs and the event feed: GET /v1/jobs, /v1/jobs/{id} and the long-polled
// GET /v1/events.

func (s *Server) listJobs(c echo.Context) error {
	items, err := s.b.ListJobs(c.QueryParam("machine"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, JobList{Items: views(items, jobView)})
}

func (s *Server) getJob(c echo.Context) error {
	j, err := s.b.GetJob(c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, jobView(j))
}

// events serves ?after=CURSOR&limit=N&wait=DURATION. With wait, an empty
// answer is held until an event arrives or the wait (capped at
// MaxEventWait) ends; then it returns what there is (possibly nothing).
func (s *Server) events(c echo.Context) error {
	var after uint64
	if v := c.QueryParam("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return invalid("after", "must be an event index (unsigned integer)")
		}
		after = n
	}
	limit, err := queryInt(c, "limit", s.cfg.DefaultListLimit, 1, s.cfg.MaxListLimit)
	if err != nil {
		return err
	}
	var wait time.Duration
	if v := c.QueryParam("wait"); v != "" {
		if wait, err = time.ParseDuration(v); err != nil || wait < 0 {
			return invalid("wait", "must be a duration like 30s")
		}
		wait = min(wait, s.cfg.MaxEventWait)
	}
	read := func() ([]store.Event, error) {
		if after == math.MaxUint64 {
			// No event follows the largest index, and a backend seeking
			// to after+1 would wrap to 0 and return the whole log.
			return nil, nil
		}
		return s.b.Events(after, limit)
	}
	evs, err := read()
	if err != nil {
		return err
	}
	if len(evs) == 0 && wait > 0 {
		ctx, cancel := context.WithTimeout(c.Request().Context(), wait)
		defer cancel()
		for len(evs) == 0 {
			if err := s.b.WaitEvents(ctx, after); err != nil {
				if ctx.Err() != nil && c.Request().Context().Err() == nil {
					break // the wait ended with nothing new: answer empty
				}
				return err
			}
			if evs, err = read(); err != nil {
				return err
			}
		}
	}
	out := EventList{Events: views(evs, eventView), Next: after}
	if len(evs) > 0 {
		out.Next = evs[len(evs)-1].Index
	}
	return c.JSON(http.StatusOK, out)
}
