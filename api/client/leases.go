package client

import (
	"context"
	"net/http"
	"net/url"

	"kiln/api"
)

// Leases is GET /v1/leases: the DHCPv4 leases of the answering node's
// replica, one per address. With consistent the
// node first catches up with everything the leader has committed (a raft
// barrier; 503 not_leader without a reachable leader). Role viewer.
func (c *Client) Leases(ctx context.Context, consistent bool) (api.LeaseList, error) {
	var out api.LeaseList
	var q url.Values
	if consistent {
		q = url.Values{"consistent": {"true"}}
	}
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/leases", query: q}, &out)
	return out, err
}
