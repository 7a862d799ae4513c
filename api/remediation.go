package api

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"kiln/appliance/lifecycle"
	"kiln/store"
)

// The day-2 routes (issue 14; appliance/lifecycle/DESIGN.md
// "Remediation"), served by the Backend's RemediationBackend methods
// (lifecycle.Service).
//
//	POST /v1/machines/{id}/health       HealthReport → 200 Machine (operator: the claim's owner)
//	POST /v1/machines/{id}/drain/ack    ActionRequest → 200 Machine
//	POST /v1/machines/{id}/power        PowerRequest → 202 Machine (the job: GET /v1/jobs?machine=)
//	POST /v1/machines/{id}/maintenance  MaintenanceRequest → 200 Machine
//	POST /v1/machines/{id}/retire       ActionRequest → 202 Machine (admin)
//	POST /v1/machines/{id}/rma          RMARequest → 202 Machine
//	POST /v1/machines/{id}/reprovision  ActionRequest → 202 Machine
//	GET  /v1/remediation                → 200 RemediationStatus
//	POST /v1/remediation/resume         ActionRequest → 200 Brake
//
// Every write carries the caller as actor and its reason and message
// (joined as the write's message; the lifecycle sets the closed reason).

// RemediationBackend is what the day-2 routes need (part of Backend;
// lifecycle.Service implements it).
// Errors as Backend's, plus store.ErrUnsupportedByCluster (409
// unsupported_by_cluster) while a node predates store command 25.
type RemediationBackend interface {
	ReportHealth(ctx context.Context, id, condType, status, reason, message string, w store.W) (store.Machine, error)
	DrainAck(ctx context.Context, id string, w store.W) (store.Machine, error)
	Power(ctx context.Context, id, action string, w store.W) (store.Machine, error)
	SetMaintenance(ctx context.Context, id string, on bool, w store.W) (store.Machine, error)
	Retire(ctx context.Context, id string, w store.W) (store.Machine, error)
	RMA(ctx context.Context, id string, skipErase bool, w store.W) (store.Machine, error)
	Reprovision(ctx context.Context, id string, w store.W) (store.Machine, error)
	ResumeRemediation(ctx context.Context, w store.W) (store.RepairBrake, error)
	RemediationStatus() (lifecycle.RemediationStatus, error)
}

// HealthReport is the body of POST /v1/machines/{id}/health: a condition
// of the machine as its owner sees it (a Cluster API MachineHealthCheck's
// verdict). Type: 1–63 of letters, digits, '.', '_', '-', '/' (stored as
// "owner/"+type); Status: OK, Warning or Critical (Redfish
// Resource.Health). A Critical condition starts automatic repair.
type HealthReport struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// PowerRequest is the body of POST /v1/machines/{id}/power.
type PowerRequest struct {
	Action  string `json:"action"` // on | off | cycle
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// MaintenanceRequest is the body of POST /v1/machines/{id}/maintenance:
// Maintenance true sets the flag (Reason is kept on it), false clears it.
type MaintenanceRequest struct {
	Maintenance *bool  `json:"maintenance"`
	Reason      string `json:"reason,omitempty"`
	Message     string `json:"message,omitempty"`
}

// RMARequest is the body of POST /v1/machines/{id}/rma. SkipErase: the
// machine goes to rma without its disks erased (the report says so).
type RMARequest struct {
	SkipErase bool   `json:"skip_erase,omitempty"`
	Reason    string `json:"reason,omitempty"`
	Message   string `json:"message,omitempty"`
}

// Brake is the remediation brake (store.RepairBrake's wire form).
type Brake struct {
	Engaged   bool            `json:"engaged"`
	Scope     string          `json:"scope,omitempty"`
	Key       string          `json:"key,omitempty"`
	EngagedAt time.Time       `json:"engaged_at,omitzero"`
	Message   string          `json:"message,omitempty"`
	ResumedAt time.Time       `json:"resumed_at,omitzero"`
	ResumedBy string          `json:"resumed_by,omitempty"`
	Failures  []BrakeFailure  `json:"failures"`
	Meta      *BrakeRecordRef `json:"record,omitempty"`
}

// BrakeRecordRef names the stored brake record's version.
type BrakeRecordRef struct {
	ResourceVersion uint64    `json:"resource_version"`
	UpdatedAt       time.Time `json:"updated_at"`
}

// BrakeFailure is one failure the brake counted in its window.
type BrakeFailure struct {
	Machine string    `json:"machine"`
	Rack    string    `json:"rack,omitempty"`
	Claim   string    `json:"claim,omitempty"`
	At      time.Time `json:"at"`
	Why     string    `json:"why,omitempty"`
}

// SparePool is one hardware class's spare count and low threshold.
type SparePool struct {
	Class        string `json:"class"`
	Available    int    `json:"available"`
	LowThreshold int    `json:"low_threshold"`
	Low          bool   `json:"low"`
}

// RemediationMachine is one machine with a ladder run, in maintenance, or rma.
type RemediationMachine struct {
	ID          string             `json:"id"`
	Name        string             `json:"name,omitempty"`
	Rack        string             `json:"rack,omitempty"`
	State       store.MachineState `json:"state"`
	Maintenance *store.Maintenance `json:"maintenance,omitempty"`
	Step        string             `json:"step,omitempty"`
	Attempt     int                `json:"attempt,omitempty"`
	Why         string             `json:"why,omitempty"`
	Deadline    time.Time          `json:"deadline,omitzero"`
	Outcome     string             `json:"outcome,omitempty"`
	Spare       string             `json:"spare,omitempty"`
}

// RemediationStatus answers GET /v1/remediation.
type RemediationStatus struct {
	Mode     string               `json:"mode"` // auto | off
	Brake    Brake                `json:"brake"`
	Spares   []SparePool          `json:"spares"`
	Machines []RemediationMachine `json:"machines"`
}

func brakeView(b store.RepairBrake) Brake {
	out := Brake{Engaged: b.Engaged, Scope: b.Scope, Key: b.Key, EngagedAt: b.EngagedAt, Message: b.Message,
		ResumedAt: b.ResumedAt, ResumedBy: b.ResumedBy, Failures: []BrakeFailure{}}
	if b.ResourceVersion != 0 {
		out.Meta = &BrakeRecordRef{ResourceVersion: b.ResourceVersion, UpdatedAt: b.UpdatedAt}
	}
	for _, f := range b.Failures {
		out.Failures = append(out.Failures, BrakeFailure{Machine: f.Machine, Rack: f.Rack, Claim: f.Claim, At: f.At, Why: f.Why})
	}
	return out
}

func remediationStatusView(st lifecycle.RemediationStatus) RemediationStatus {
	out := RemediationStatus{Mode: st.Mode, Brake: brakeView(st.Brake), Spares: []SparePool{}, Machines: []RemediationMachine{}}
	for _, p := range st.Spares {
		out.Spares = append(out.Spares, SparePool{Class: p.Class, Available: p.Available, LowThreshold: p.Low, Low: p.Available <= p.Low})
	}
	for _, m := range st.Machines {
		out.Machines = append(out.Machines, RemediationMachine{ID: m.ID, Name: m.Name, Rack: m.Rack, State: m.State,
			Maintenance: m.Maintenance, Step: m.Step, Attempt: m.Attempt, Why: m.Why, Deadline: m.Deadline, Outcome: m.Outcome, Spare: m.Spare})
	}
	return out
}

func (s *Server) remediation() (RemediationBackend, error) { return s.b, nil }

func (s *Server) remediationRoutes(view, op, admin echo.MiddlewareFunc) {
	s.e.POST("/v1/machines/:id/health", s.reportHealth, op)
	s.e.POST("/v1/machines/:id/drain/ack", s.drainAck, op)
	s.e.POST("/v1/machines/:id/power", s.power, op)
	s.e.POST("/v1/machines/:id/maintenance", s.maintenance, op)
	s.e.POST("/v1/machines/:id/retire", s.retire, admin)
	s.e.POST("/v1/machines/:id/rma", s.rma, op)
	s.e.POST("/v1/machines/:id/reprovision", s.reprovision, op)
	s.e.GET("/v1/remediation", s.remediationStatus, view)
	s.e.POST("/v1/remediation/resume", s.resumeRemediation, op)
}

// remediationDocOps documents the day-2 routes (appended to docOps).
func remediationDocOps() []docOp {
	return []docOp{
		{Method: "POST", Path: "/v1/machines/{id}/health", Summary: "Report a health condition of a claimed machine as its owner sees it (Critical starts automatic repair)",
			Role: RoleOperator, Body: HealthReport{}, Status: 200, Resp: Machine{}},
		{Method: "POST", Path: "/v1/machines/{id}/drain/ack", Summary: "Acknowledge the drain request before a disruptive repair step",
			Role: RoleOperator, Body: ActionRequest{}, Status: 200, Resp: Machine{}},
		{Method: "POST", Path: "/v1/machines/{id}/power", Summary: "Power on, off or cycle the machine through its BMC (one job)",
			Role: RoleOperator, Body: PowerRequest{}, Status: 202, Resp: Machine{}},
		{Method: "POST", Path: "/v1/machines/{id}/maintenance", Summary: "Set or clear the maintenance flag (nothing automatic touches the machine while set)",
			Role: RoleOperator, Body: MaintenanceRequest{}, Status: 200, Resp: Machine{}},
		{Method: "POST", Path: "/v1/machines/{id}/retire", Summary: "Retire the machine for good (its disks are erased first)",
			Role: RoleAdmin, Body: ActionRequest{}, Status: 202, Resp: Machine{}},
		{Method: "POST", Path: "/v1/machines/{id}/rma", Summary: "Declare the machine failed: erase (unless skip_erase), rma, its claim to a spare",
			Role: RoleOperator, Body: RMARequest{}, Status: 202, Resp: Machine{}},
		{Method: "POST", Path: "/v1/machines/{id}/reprovision", Summary: "Inspect the claimed machine again and build its claim again",
			Role: RoleOperator, Body: ActionRequest{}, Status: 202, Resp: Machine{}},
		{Method: "GET", Path: "/v1/remediation", Summary: "Remediation status: the brake, the spare pools, machines being repaired, in maintenance or rma",
			Role: RoleViewer, Status: 200, Resp: RemediationStatus{}},
		{Method: "POST", Path: "/v1/remediation/resume", Summary: "Release the remediation brake (automatic repair goes on)",
			Role: RoleOperator, Body: ActionRequest{}, Status: 200, Resp: Brake{}},
	}
}

// why joins a request's reason and message into the write's message.
func why(reason, message string) string {
	var parts []string
	for _, p := range []string{strings.TrimSpace(reason), strings.TrimSpace(message)} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, ": ")
}

func (s *Server) machineOp(c echo.Context, reason, message string, status int,
	f func(RemediationBackend, context.Context, string, store.W) (store.Machine, error)) error {
	rb, err := s.remediation()
	if err != nil {
		return err
	}
	if err := validateWhy(reason, message); err != nil {
		return err
	}
	m, err := f(rb, c.Request().Context(), c.Param("id"), s.w(c, "", why(reason, message)))
	if err != nil {
		return err
	}
	return c.JSON(status, machineView(m, who(c).Role))
}

func (s *Server) reportHealth(c echo.Context) error {
	var req HealthReport
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, false); err != nil {
		return err
	}
	rb, err := s.remediation()
	if err != nil {
		return err
	}
	m, err := rb.ReportHealth(c.Request().Context(), c.Param("id"), req.Type, req.Status, req.Reason, req.Message, s.w(c, "", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, machineView(m, who(c).Role))
}

func (s *Server) actionBody(c echo.Context) (ActionRequest, error) {
	var req ActionRequest
	err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, true)
	return req, err
}

func (s *Server) drainAck(c echo.Context) error {
	req, err := s.actionBody(c)
	if err != nil {
		return err
	}
	return s.machineOp(c, req.Reason, req.Message, http.StatusOK, RemediationBackend.DrainAck)
}

func (s *Server) power(c echo.Context) error {
	var req PowerRequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, false); err != nil {
		return err
	}
	switch req.Action {
	case lifecycle.PowerOn, lifecycle.PowerOff, lifecycle.PowerCycle:
	default:
		return invalid("action", "%q: want on, off or cycle", req.Action)
	}
	return s.machineOp(c, req.Reason, req.Message, http.StatusAccepted, func(rb RemediationBackend, ctx context.Context, id string, w store.W) (store.Machine, error) {
		return rb.Power(ctx, id, req.Action, w)
	})
}

func (s *Server) maintenance(c echo.Context) error {
	var req MaintenanceRequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, false); err != nil {
		return err
	}
	if req.Maintenance == nil {
		return invalid("maintenance", "required: true to set the flag, false to clear it")
	}
	return s.machineOp(c, req.Reason, req.Message, http.StatusOK, func(rb RemediationBackend, ctx context.Context, id string, w store.W) (store.Machine, error) {
		return rb.SetMaintenance(ctx, id, *req.Maintenance, w)
	})
}

func (s *Server) retire(c echo.Context) error {
	req, err := s.actionBody(c)
	if err != nil {
		return err
	}
	return s.machineOp(c, req.Reason, req.Message, http.StatusAccepted, RemediationBackend.Retire)
}

func (s *Server) rma(c echo.Context) error {
	var req RMARequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, true); err != nil {
		return err
	}
	return s.machineOp(c, req.Reason, req.Message, http.StatusAccepted, func(rb RemediationBackend, ctx context.Context, id string, w store.W) (store.Machine, error) {
		return rb.RMA(ctx, id, req.SkipErase, w)
	})
}

func (s *Server) reprovision(c echo.Context) error {
	req, err := s.actionBody(c)
	if err != nil {
		return err
	}
	return s.machineOp(c, req.Reason, req.Message, http.StatusAccepted, RemediationBackend.Reprovision)
}

func (s *Server) remediationStatus(c echo.Context) error {
	rb, err := s.remediation()
	if err != nil {
		return err
	}
	st, err := rb.RemediationStatus()
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, remediationStatusView(st))
}

func (s *Server) resumeRemediation(c echo.Context) error {
	req, err := s.actionBody(c)
	if err != nil {
		return err
	}
	if err := validateWhy(req.Reason, req.Message); err != nil {
		return err
	}
	rb, err := s.remediation()
	if err != nil {
		return err
	}
	b, err := rb.ResumeRemediation(c.Request().Context(), s.w(c, "", why(req.Reason, req.Message)))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, brakeView(b))
}
