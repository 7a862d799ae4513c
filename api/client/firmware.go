package client

import (
	"context"
	"net/http"

	"kiln/api"
)

// Firmware and BIOS baselines (issue 17; api/firmware.go).

// ListBaselines is GET /v1/baselines. Role viewer.
func (c *Client) ListBaselines(ctx context.Context) ([]api.Baseline, error) {
	var out api.BaselineList
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/baselines"}, &out)
	return out.Items, err
}

// PutBaseline sets the baseline of b.Vendor and b.Model (PUT /v1/baselines;
// resource_version 0 sets it whatever is stored, else compare-and-set). Role admin.
func (c *Client) PutBaseline(ctx context.Context, b api.Baseline) (api.Baseline, error) {
	var out api.Baseline
	_, err := c.do(ctx, request{method: http.MethodPut, path: "/v1/baselines", json: b}, &out)
	return out, err
}

// ReadFirmware reads machine id's firmware and BIOS from its BMC now (POST
// /v1/machines/{id}/firmware/read, 200; a failed read shows in
// firmware.error). Role operator.
func (c *Client) ReadFirmware(ctx context.Context, id string) (api.Machine, error) {
	return c.machinePost(ctx, id, "firmware/read", struct{}{})
}

// ApplyFirmware starts bringing machine id to its baseline (POST
// /v1/machines/{id}/firmware/apply, 202); follow firmware.apply with
// GetMachine. Role operator.
func (c *Client) ApplyFirmware(ctx context.Context, id string, why api.ActionRequest) (api.Machine, error) {
	return c.machinePost(ctx, id, "firmware/apply", why)
}
