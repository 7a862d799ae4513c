package client

import (
	"context"
	"net/http"

	"kiln/api"
)

// CreateJoinToken is POST /v1/cluster/tokens: a one-time join token for a
// new node (shown only in this answer; the cluster keeps its SHA-256).
// req.TTL is a Go duration, "" for the default (1 h). Role admin.
func (c *Client) CreateJoinToken(ctx context.Context, req api.JoinTokenRequest) (api.JoinTokenCreated, error) {
	var out api.JoinTokenCreated
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/cluster/tokens", json: req}, &out)
	return out, err
}

// ClusterMembers is GET /v1/cluster/members: the raft configuration with
// forward addresses and certificate serials. Role viewer.
func (c *Client) ClusterMembers(ctx context.Context) ([]api.ClusterMember, error) {
	var out api.ClusterMemberList
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/cluster/members"}, &out)
	return out.Items, err
}

// RemoveMember is DELETE /v1/cluster/members/{id} (204): the member leaves
// the raft configuration and its certificate is refused from then on.
// 404 not_found for an unknown member. Role admin.
func (c *Client) RemoveMember(ctx context.Context, id string) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: "/v1/cluster/members/" + seg(id)}, nil)
	return err
}

// RotateSiteKey is POST /v1/site/rotate-key: every BMC credential is
// re-sealed under a new site key on every member (appliance/DESIGN.md
// "Site key rotation"). Role admin.
func (c *Client) RotateSiteKey(ctx context.Context) (api.SiteKeyRotation, error) {
	var out api.SiteKeyRotation
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/site/rotate-key"}, &out)
	return out, err
}

// RotateCA is POST /v1/cluster/rotate-ca: the site CA is replaced on every
// member with no moment where two members refuse each other
// (store/DESIGN.md "Cluster trust"). Role admin.
func (c *Client) RotateCA(ctx context.Context) (api.CARotation, error) {
	var out api.CARotation
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/cluster/rotate-ca"}, &out)
	return out, err
}
