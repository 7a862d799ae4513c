package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"kiln/api"
)

// Healthz is GET /healthz: the process answers (no auth).
func (c *Client) Healthz(ctx context.Context) (api.Status, error) {
	var out api.Status
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/healthz"}, &out)
	return out, err
}

// Ready is GET /readyz (no auth): nil when the node is ready. A node that
// is not is an *Error with status 503 and code "not_ready", whose
// Detail.Leader names the raft leader when one is known; the Status body
// is returned either way.
func (c *Client) Ready(ctx context.Context) (api.Status, error) {
	var out api.Status
	status, err := c.do(ctx, request{method: http.MethodGet, path: "/readyz", ok: []int{http.StatusServiceUnavailable}}, &out)
	if err == nil && status != http.StatusOK {
		err = &Error{Method: http.MethodGet, Path: "/readyz", Status: status,
			Detail: api.ErrorDetail{Code: "not_ready", Message: "the node is not ready (no raft leader yet, or still applying the log)", Leader: out.Leader}}
	}
	return out, err
}

// SiteStatus is GET /v1/site/status: machine counts by state, failures,
// versions and raft health. Role viewer.
func (c *Client) SiteStatus(ctx context.Context) (api.SiteStatus, error) {
	var out api.SiteStatus
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/site/status"}, &out)
	return out, err
}

// ListSites is GET /v1/sites. Role viewer.
func (c *Client) ListSites(ctx context.Context) ([]api.Site, error) {
	var out api.SiteList
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/sites"}, &out)
	return out.Items, err
}

// GetSite is GET /v1/sites/{id}. Role viewer; 404 not_found.
func (c *Client) GetSite(ctx context.Context, id string) (api.Site, error) {
	var out api.Site
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/sites/" + seg(id)}, &out)
	return out, err
}

// CreateSite is POST /v1/sites (201; spec.ID optional, assigned when
// empty; spec.ResourceVersion must be 0). Role admin.
func (c *Client) CreateSite(ctx context.Context, spec api.SiteSpec) (api.Site, error) {
	var out api.Site
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/sites", json: spec}, &out)
	return out, err
}

// UpdateSite is PUT /v1/sites/{id}: spec.ResourceVersion must be the
// site's current one, else 409 conflict. Role admin.
func (c *Client) UpdateSite(ctx context.Context, id string, spec api.SiteSpec) (api.Site, error) {
	var out api.Site
	_, err := c.do(ctx, request{method: http.MethodPut, path: "/v1/sites/" + seg(id), json: spec}, &out)
	return out, err
}

// ListRacks is GET /v1/racks, of one site when site is not "". Role viewer.
func (c *Client) ListRacks(ctx context.Context, site string) ([]api.Rack, error) {
	var q url.Values
	if site != "" {
		q = url.Values{"site": {site}}
	}
	var out api.RackList
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/racks", query: q}, &out)
	return out.Items, err
}

// GetRack is GET /v1/racks/{id}. Role viewer; 404 not_found.
func (c *Client) GetRack(ctx context.Context, id string) (api.Rack, error) {
	var out api.Rack
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/racks/" + seg(id)}, &out)
	return out, err
}

// CreateRack is POST /v1/racks (201), like CreateSite. Role admin.
func (c *Client) CreateRack(ctx context.Context, spec api.RackSpec) (api.Rack, error) {
	var out api.Rack
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/racks", json: spec}, &out)
	return out, err
}

// UpdateRack is PUT /v1/racks/{id}, like UpdateSite. Role admin.
func (c *Client) UpdateRack(ctx context.Context, id string, spec api.RackSpec) (api.Rack, error) {
	var out api.Rack
	_, err := c.do(ctx, request{method: http.MethodPut, path: "/v1/racks/" + seg(id), json: spec}, &out)
	return out, err
}

// ListJobs is GET /v1/jobs, of one machine when machine is not "". Role viewer.
func (c *Client) ListJobs(ctx context.Context, machine string) ([]api.Job, error) {
	var q url.Values
	if machine != "" {
		q = url.Values{"machine": {machine}}
	}
	var out api.JobList
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/jobs", query: q}, &out)
	return out.Items, err
}

// GetJob is GET /v1/jobs/{id}. Role viewer; 404 not_found.
func (c *Client) GetJob(ctx context.Context, id string) (api.Job, error) {
	var out api.Job
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/jobs/" + seg(id)}, &out)
	return out, err
}

// EventQuery pages GET /v1/events by raft index.
type EventQuery struct {
	After uint64 // cursor: events with a larger index (0: from the start)
	Limit int    // events per answer; 0: the server's default (100)
	// Wait > 0 long-polls: when no event follows After, the server holds
	// the answer until one is applied or Wait ends (capped by the server's
	// MaxEventWait, 60 s by default), then answers with what there is,
	// possibly nothing. The caller's context must outlast Wait.
	Wait time.Duration
	// Subject, when set, returns only that subject's events ("machine/m-1");
	// the answer's Next may then pass events that did not match.
	Subject string
}

// Events is GET /v1/events: up to q.Limit events after q.After, oldest
// first. The answer's Next is the cursor to pass as After next time (the
// last event's index, or q.After when none came), so a follower loops
// Events(ctx, {After: prev.Next, Wait: 30 * time.Second}). Role viewer.
func (c *Client) Events(ctx context.Context, q EventQuery) (api.EventList, error) {
	v := url.Values{"after": {strconv.FormatUint(q.After, 10)}}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Wait > 0 {
		v.Set("wait", q.Wait.String())
	}
	if q.Subject != "" {
		v.Set("subject", q.Subject)
	}
	var out api.EventList
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/events", query: v}, &out)
	return out, err
}
