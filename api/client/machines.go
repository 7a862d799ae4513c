package client

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"

	"kiln/api"
)

// MachineQuery filters and pages GET /v1/machines. Zero fields are not
// sent (the server's defaults apply: every state, limit 100).
type MachineQuery struct {
	State  string            // a machine state, e.g. "available"
	Rack   string            // rack ID
	Labels map[string]string // every label must match (sent as label=k=v, sorted by key)
	Limit  int               // page size, 1..1000 on the default server
	After  string            // cursor: the Next of the previous page
	// Consistent makes the server wait for the leader's commit before it
	// reads (?consistent=true); else the answering node's replica is read.
	Consistent bool
}

func (q MachineQuery) values() url.Values {
	v := url.Values{}
	if q.State != "" {
		v.Set("state", q.State)
	}
	if q.Rack != "" {
		v.Set("rack", q.Rack)
	}
	keys := make([]string, 0, len(q.Labels))
	for k := range q.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v.Add("label", k+"="+q.Labels[k])
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.After != "" {
		v.Set("after", q.After)
	}
	if q.Consistent {
		v.Set("consistent", "true")
	}
	return v
}

// ListMachines returns one page of GET /v1/machines (ordered by ID; Next is
// the cursor of the following page, "" on the last). Role viewer.
func (c *Client) ListMachines(ctx context.Context, q MachineQuery) (api.MachineList, error) {
	var out api.MachineList
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/machines", query: q.values()}, &out)
	return out, err
}

// ListAllMachines follows the cursor from q.After to the last page and
// returns every machine: one request per page of q.Limit. A failed page
// ends it with that page's error and nothing is returned.
func (c *Client) ListAllMachines(ctx context.Context, q MachineQuery) ([]api.Machine, error) {
	items := []api.Machine{}
	for {
		page, err := c.ListMachines(ctx, q)
		if err != nil {
			return nil, err
		}
		items = append(items, page.Items...)
		if page.Next == "" {
			return items, nil
		}
		q.After = page.Next
	}
}

// GetMachine is GET /v1/machines/{id}. Role viewer; 404 not_found.
func (c *Client) GetMachine(ctx context.Context, id string) (api.Machine, error) {
	var out api.Machine
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/machines/" + seg(id)}, &out)
	return out, err
}

// CreateMachine registers one machine (POST /v1/machines, 201). Role
// admin; 400 naming the field, 409 conflict for a MAC another machine has.
func (c *Client) CreateMachine(ctx context.Context, spec api.MachineSpec) (api.Machine, error) {
	var out api.Machine
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/machines", json: spec}, &out)
	return out, err
}

// PatchMachine updates intended fields (PATCH /v1/machines/{id}).
// p.ResourceVersion must be the machine's current one, else 409 conflict.
// Role admin.
func (c *Client) PatchMachine(ctx context.Context, id string, p api.MachinePatch) (api.Machine, error) {
	var out api.Machine
	_, err := c.do(ctx, request{method: http.MethodPatch, path: "/v1/machines/" + seg(id), json: p}, &out)
	return out, err
}

// ImportMachines sends a purchase record or rack plan (POST
// /v1/machines/import?format=FORMAT, 201): format is "csv", "json" or
// "netbox"; r is streamed (the server takes at most api.DefaultMaxImportBytes,
// 64 MiB). All or nothing: a file with any bad row is 400 import_rejected
// with every bad row in Detail.Rows. Role admin.
func (c *Client) ImportMachines(ctx context.Context, format string, r io.Reader) (api.ImportResult, error) {
	var out api.ImportResult
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/machines/import",
		query: url.Values{"format": {format}}, body: r, ctype: "application/octet-stream", length: -1}, &out)
	return out, err
}

// Provision claims one available machine with req.Claim (POST
// /v1/machines/{id}/provision, 202); the build runs after the answer.
// Role operator; 409 illegal_transition or wrong_state from another state.
func (c *Client) Provision(ctx context.Context, id string, req api.ProvisionRequest) (api.Machine, error) {
	var out api.Machine
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/machines/" + seg(id) + "/provision", json: req}, &out)
	return out, err
}

// Claim claims req.Count available machines matching req.Role and
// req.Labels and provisions them (POST /v1/machines/claim, 202). All or
// nothing: 409 not_enough_machines when fewer match. Role operator.
func (c *Client) Claim(ctx context.Context, req api.ClaimRequest) ([]api.Machine, error) {
	var out api.ClaimResponse
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/machines/claim", json: req}, &out)
	return out.Items, err
}

// Release ends a provisioned machine's claim: it is erased, then available
// (POST /v1/machines/{id}/release, 202). Role operator.
func (c *Client) Release(ctx context.Context, id string, why api.ActionRequest) (api.Machine, error) {
	return c.action(ctx, id, "release", why)
}

// Erase erases a machine's disks (POST /v1/machines/{id}/erase, 202). Role operator.
func (c *Client) Erase(ctx context.Context, id string, why api.ActionRequest) (api.Machine, error) {
	return c.action(ctx, id, "erase", why)
}

// Inspect (re)inspects a machine's hardware (POST /v1/machines/{id}/inspect,
// 202). Role operator.
func (c *Client) Inspect(ctx context.Context, id string, why api.ActionRequest) (api.Machine, error) {
	return c.action(ctx, id, "inspect", why)
}

func (c *Client) action(ctx context.Context, id, verb string, why api.ActionRequest) (api.Machine, error) {
	var out api.Machine
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/machines/" + seg(id) + "/" + verb, json: why}, &out)
	return out, err
}

// EnrollBMC stores the BMC of a machine and its password, which is kept
// encrypted and never returned (POST /v1/machines/{id}/bmc, 201). Role admin.
func (c *Client) EnrollBMC(ctx context.Context, machineID string, req api.BMCEnrollRequest) (api.BMC, error) {
	var out api.BMC
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/machines/" + seg(machineID) + "/bmc", json: req}, &out)
	return out, err
}
