package client

import (
	"context"
	"net/http"

	"kiln/api"
)

// Campaigns (issue 17): /v1/campaigns.

// PlanCampaign computes a campaign's waves and time to finish over the
// machines its selector picks (POST /v1/campaigns/plan). Role viewer.
func (c *Client) PlanCampaign(ctx context.Context, req api.CampaignRequest) (api.CampaignPlan, error) {
	var out api.CampaignPlan
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/campaigns/plan", json: req}, &out)
	return out, err
}

// CreateCampaign stores a planned campaign (POST /v1/campaigns). Role operator.
func (c *Client) CreateCampaign(ctx context.Context, req api.CampaignRequest) (api.Campaign, error) {
	var out api.Campaign
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/campaigns", json: req}, &out)
	return out, err
}

// ListCampaigns lists the campaigns (GET /v1/campaigns). Role viewer.
func (c *Client) ListCampaigns(ctx context.Context) ([]api.Campaign, error) {
	var out []api.Campaign
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/campaigns"}, &out)
	return out, err
}

// GetCampaign returns campaign ref (ID or name) (GET /v1/campaigns/{id}). Role viewer.
func (c *Client) GetCampaign(ctx context.Context, ref string) (api.Campaign, error) {
	var out api.Campaign
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/campaigns/" + seg(ref)}, &out)
	return out, err
}

// StartCampaign starts a planned campaign. Role operator.
func (c *Client) StartCampaign(ctx context.Context, ref string, why api.ActionRequest) (api.Campaign, error) {
	return c.campaignPost(ctx, ref, "start", why)
}

// HaltCampaign halts a campaign. Role operator.
func (c *Client) HaltCampaign(ctx context.Context, ref string, why api.ActionRequest) (api.Campaign, error) {
	return c.campaignPost(ctx, ref, "halt", why)
}

// ResumeCampaign resumes a halted campaign. Role operator.
func (c *Client) ResumeCampaign(ctx context.Context, ref string, why api.ActionRequest) (api.Campaign, error) {
	return c.campaignPost(ctx, ref, "resume", why)
}

func (c *Client) campaignPost(ctx context.Context, ref, verb string, body any) (api.Campaign, error) {
	var out api.Campaign
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/campaigns/" + seg(ref) + "/" + verb, json: body}, &out)
	return out, err
}
