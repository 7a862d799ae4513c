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

// Subject filter bounds (GET /v1/events?subject=): one read scans the
// feed in pages of eventScanPage and at most eventScanMax events, then
// answers with the matches so far and Next at the last event scanned, so
// a follower never misses one and a request never scans the whole log.
const (
	eventScanPage = 1000
	eventScanMax  = 50000
	maxSubjectLen = 256
)

// events serves ?after=CURSOR&limit=N&wait=DURATION&subject=KIND/ID. With
// wait, an empty answer is held until an event (a matching one, with
// subject) arrives or the wait (capped at MaxEventWait) ends; then it
// returns what there is (possibly nothing). With subject (e.g.
// machine/m-1), only that subject's events are returned; Next may then
// move past events that did not match.
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
	subject := c.QueryParam("subject")
	if len(subject) > maxSubjectLen {
		return invalid("subject", "at most 256 bytes, e.g. machine/m-1")
	}
	// read returns up to limit events after from (of subject, when set)
	// and the cursor after them: the last event read or scanned.
	read := func(from uint64) ([]store.Event, uint64, error) {
		if from == math.MaxUint64 {
			// No event follows the largest index, and a backend seeking
			// to after+1 would wrap to 0 and return the whole log.
			return nil, from, nil
		}
		if subject == "" {
			evs, err := s.b.Events(from, limit)
			if err != nil || len(evs) == 0 {
				return nil, from, err
			}
			return evs, evs[len(evs)-1].Index, nil
		}
		var out []store.Event
		cur := from
		for scanned := 0; scanned < eventScanMax; {
			page, err := s.b.Events(cur, eventScanPage)
			if err != nil {
				return nil, from, err
			}
			for _, e := range page {
				cur = e.Index
				scanned++
				if e.Subject == subject {
					if out = append(out, e); len(out) == limit {
						return out, cur, nil
					}
				}
			}
			if len(page) < eventScanPage || cur == math.MaxUint64 {
				break
			}
		}
		return out, cur, nil
	}
	evs, next, err := read(after)
	if err != nil {
		return err
	}
	if len(evs) == 0 && wait > 0 {
		ctx, cancel := context.WithTimeout(c.Request().Context(), wait)
		defer cancel()
		for len(evs) == 0 && ctx.Err() == nil {
			if next == after {
				if err := s.b.WaitEvents(ctx, after); err != nil {
					if ctx.Err() != nil && c.Request().Context().Err() == nil {
						break // the wait ended with nothing new: answer empty
					}
					return err
				}
			}
			after = next
			if evs, next, err = read(after); err != nil {
				return err
			}
		}
		if err := c.Request().Context().Err(); err != nil {
			return err
		}
	}
	return c.JSON(http.StatusOK, EventList{Events: views(evs, eventView), Next: next})
}
