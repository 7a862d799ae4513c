package client

import (
	"context"
	"net/http"

	"kiln/api"
)

// Attestation (issue 16): the approved measured-boot states per hardware
// model.

// AttestStates lists every state (GET /v1/attest/states). Role viewer.
func (c *Client) AttestStates(ctx context.Context) ([]api.AttestState, error) {
	var out api.AttestStateList
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/attest/states"}, &out)
	return out.Items, err
}

// LearnAttestState makes a state of a reference machine's last attestation
// (POST /v1/attest/states/learn). Role operator; Approve needs admin.
func (c *Client) LearnAttestState(ctx context.Context, req api.AttestLearnRequest) (api.AttestState, error) {
	var out api.AttestState
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/attest/states/learn", json: req}, &out)
	return out, err
}

// ApproveAttestStates approves states in one audited write (POST
// /v1/attest/states/approve). Role admin.
func (c *Client) ApproveAttestStates(ctx context.Context, ids []string) ([]api.AttestState, error) {
	return c.setAttestStates(ctx, "approve", ids)
}

// RevokeAttestStates revokes states (POST /v1/attest/states/revoke). Role admin.
func (c *Client) RevokeAttestStates(ctx context.Context, ids []string) ([]api.AttestState, error) {
	return c.setAttestStates(ctx, "revoke", ids)
}

func (c *Client) setAttestStates(ctx context.Context, verb string, ids []string) ([]api.AttestState, error) {
	var out api.AttestStateList
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/attest/states/" + verb, json: api.AttestStatesRequest{IDs: ids}}, &out)
	return out.Items, err
}
