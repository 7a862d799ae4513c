package api

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/rules"
)

// The agent protocol (package agentapi): register, task, report; each
// request carries the machine's per-boot token (authAgent).

func (s *Server) agentRegister(c echo.Context) error {
	p, err := s.authAgent(c)
	if err != nil {
		return err
	}
	var reg agentapi.Registration
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &reg, false); err != nil {
		return err
	}
	if err := s.bodyMachine(p, reg.MachineID); err != nil {
		return err
	}
	reg.MachineID = p.Machine
	t, err := s.b.AgentRegister(c.Request().Context(), p.Machine, reg)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, t)
}

func (s *Server) agentTask(c echo.Context) error {
	p, err := s.authAgent(c)
	if err != nil {
		return err
	}
	t, err := s.b.AgentTask(c.Request().Context(), p.Machine)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, t)
}

var knownSteps = map[string]bool{
	agentapi.StepInspect: true, agentapi.StepCheck: true, agentapi.StepWrite: true, agentapi.StepVerify: true,
	agentapi.StepStage: true, agentapi.StepFinalize: true, agentapi.StepReboot: true, agentapi.StepErase: true,
	agentapi.StepAttest: true,
	agentapi.StepBurnIn: true, // issue 17
}

// validateReport checks a step report against the closed enums and
// sanitises its message (control characters → space, truncated to
// agentapi.MaxMessageLen bytes on a UTF-8 boundary).
func validateReport(r *agentapi.Report) error {
	if !knownSteps[r.Step] {
		return invalid("step", "%q is not a known step", r.Step)
	}
	switch r.State {
	case agentapi.StateStarted, agentapi.StateRunning, agentapi.StateSucceeded, agentapi.StateFailed:
	default:
		return invalid("state", "%q is not started|running|succeeded|failed", r.State)
	}
	if r.Reason != agentapi.ReasonNone {
		ok := false
		for _, x := range agentapi.Reasons {
			ok = ok || x == r.Reason
		}
		if !ok {
			return invalid("reason", "%q is not a known reason", r.Reason)
		}
	}
	if r.State == agentapi.StateFailed && r.Reason == agentapi.ReasonNone {
		return invalid("reason", "required when state is failed")
	}
	if r.Progress < 0 || r.Progress > 1 || r.Progress != r.Progress {
		return invalid("progress", "must be 0..1")
	}
	r.Message = rules.SanitizeText(r.Message, agentapi.MaxMessageLen)
	return nil
}

func (s *Server) agentReport(c echo.Context) error {
	p, err := s.authAgent(c)
	if err != nil {
		return err
	}
	var rep agentapi.Report
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &rep, false); err != nil {
		return err
	}
	if err := s.bodyMachine(p, rep.MachineID); err != nil {
		return err
	}
	rep.MachineID = p.Machine
	if err := validateReport(&rep); err != nil {
		return err
	}
	if err := s.b.AgentReport(c.Request().Context(), p.Machine, rep); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
