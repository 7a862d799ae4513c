package client

import (
	"context"
	"net/http"

	"kiln/api"
)

// Day-2 calls (issue 14; api/remediation.go).

// ReportHealth reports a condition of a claimed machine as its owner sees
// it (POST /v1/machines/{id}/health, 200). Role operator.
func (c *Client) ReportHealth(ctx context.Context, id string, r api.HealthReport) (api.Machine, error) {
	return c.machinePost(ctx, id, "health", r)
}

// DrainAck acknowledges a machine's drain request (POST
// /v1/machines/{id}/drain/ack, 200). Role operator.
func (c *Client) DrainAck(ctx context.Context, id string, why api.ActionRequest) (api.Machine, error) {
	return c.machinePost(ctx, id, "drain/ack", why)
}

// Power powers a machine on, off or cycles it through its BMC (POST
// /v1/machines/{id}/power, 202). Role operator.
func (c *Client) Power(ctx context.Context, id string, r api.PowerRequest) (api.Machine, error) {
	return c.machinePost(ctx, id, "power", r)
}

// SetMaintenance sets or clears the maintenance flag (POST
// /v1/machines/{id}/maintenance, 200). Role operator.
func (c *Client) SetMaintenance(ctx context.Context, id string, r api.MaintenanceRequest) (api.Machine, error) {
	return c.machinePost(ctx, id, "maintenance", r)
}

// Retire retires a machine for good, its disks erased first (POST
// /v1/machines/{id}/retire, 202). Role admin.
func (c *Client) Retire(ctx context.Context, id string, why api.ActionRequest) (api.Machine, error) {
	return c.action(ctx, id, "retire", why)
}

// RMA declares a machine failed (POST /v1/machines/{id}/rma, 202). Role operator.
func (c *Client) RMA(ctx context.Context, id string, r api.RMARequest) (api.Machine, error) {
	return c.machinePost(ctx, id, "rma", r)
}

// Reprovision inspects a claimed machine again and builds its claim again
// (POST /v1/machines/{id}/reprovision, 202). Role operator.
func (c *Client) Reprovision(ctx context.Context, id string, why api.ActionRequest) (api.Machine, error) {
	return c.action(ctx, id, "reprovision", why)
}

// RemediationStatus returns the brake, the spare pools and the machines
// being repaired (GET /v1/remediation). Role viewer.
func (c *Client) RemediationStatus(ctx context.Context) (api.RemediationStatus, error) {
	var out api.RemediationStatus
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/remediation"}, &out)
	return out, err
}

// ResumeRemediation releases the remediation brake (POST
// /v1/remediation/resume). Role operator.
func (c *Client) ResumeRemediation(ctx context.Context, why api.ActionRequest) (api.Brake, error) {
	var out api.Brake
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/remediation/resume", json: why}, &out)
	return out, err
}

func (c *Client) machinePost(ctx context.Context, id, verb string, body any) (api.Machine, error) {
	var out api.Machine
	_, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/machines/" + seg(id) + "/" + verb, json: body}, &out)
	return out, err
}
