package api

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"kiln/api/agentapi"
	"kiln/store"
)

// Attestation routes (issue 16; appliance/lifecycle/DESIGN.md
// "Attestation"):
//
//	POST /v1/agent/attest/start             agentapi.AttestStart → 200 agentapi.AttestChallenge (agent token)
//	POST /v1/agent/attest/quote             agentapi.AttestQuote → 200 agentapi.AttestResult (agent token)
//	GET  /v1/attest/states                  → 200 AttestStateList (viewer)
//	POST /v1/attest/states/learn            AttestLearnRequest → 201 AttestState (operator)
//	POST /v1/attest/states/approve          AttestStatesRequest → 200 AttestStateList (admin; several at once)
//	POST /v1/attest/states/revoke           AttestStatesRequest → 200 AttestStateList (admin)
//
// Approving and revoking are admin operations: an approved state is what
// lets a machine's boot chain receive cluster credentials.

// AttestBackend is what the attestation routes need (part of Backend;
// lifecycle.Service implements it).
type AttestBackend interface {
	AttestStart(ctx context.Context, machineID string, st agentapi.AttestStart) (agentapi.AttestChallenge, error)
	AttestQuote(ctx context.Context, machineID string, q agentapi.AttestQuote) (agentapi.AttestResult, error)
	ListAttestStates() ([]store.AttestState, error)
	LearnAttestState(ctx context.Context, machineID, name string, approve bool, actor string) (store.AttestState, error)
	SetAttestStates(ctx context.Context, ids []string, status, actor string) ([]store.AttestState, error)
}

// AttestState is the wire form of an approved measured-boot state
// (store.AttestState; events counted, not listed).
type AttestState struct {
	Meta
	Model      string            `json:"model"`
	Name       string            `json:"name,omitempty"`
	Status     string            `json:"status"`
	PCRs       []store.AttestPCR `json:"pcrs"`
	Events     int               `json:"events"`
	Source     string            `json:"source,omitempty"`
	SourceAt   time.Time         `json:"source_at"`
	ApprovedBy string            `json:"approved_by,omitempty"`
	ApprovedAt time.Time         `json:"approved_at"`
}

// AttestStateList is GET /v1/attest/states.
type AttestStateList struct {
	Items []AttestState `json:"items"`
}

// AttestLearnRequest: make a state of machine Machine's last attestation
// (Approve: approved at once by an admin; an operator only proposes).
type AttestLearnRequest struct {
	Machine string `json:"machine"`
	Name    string `json:"name,omitempty"`
	Approve bool   `json:"approve,omitempty"`
}

// AttestStatesRequest names states to approve or revoke.
type AttestStatesRequest struct {
	IDs []string `json:"ids"`
}

// Attestation is the wire form of a machine's last attestation
// (store.AttestationRecord without the outstanding challenge; the
// replayed events are counted).
type Attestation struct {
	Result      string                 `json:"result,omitempty"`
	Reason      string                 `json:"reason,omitempty"`
	Message     string                 `json:"message,omitempty"`
	At          time.Time              `json:"at"`
	Valid       bool                   `json:"valid,omitempty"`
	Attempt     int                    `json:"attempt,omitempty"`
	Model       string                 `json:"model,omitempty"`
	NonceID     string                 `json:"nonce_id,omitempty"`
	PCRDigest   string                 `json:"pcr_digest,omitempty"`
	PCRs        []store.AttestPCR      `json:"pcrs,omitempty"`
	Events      int                    `json:"events,omitempty"`
	State       string                 `json:"state,omitempty"`
	Mismatches  []store.AttestMismatch `json:"mismatches,omitempty"`
	EKSHA256    string                 `json:"ek_sha256,omitempty"`
	EKIssuer    string                 `json:"ek_issuer,omitempty"`
	TPM         string                 `json:"tpm,omitempty"`
	ChallengeAt *time.Time             `json:"challenge_expires,omitempty"`
}

func attestationView(a *store.AttestationRecord) *Attestation {
	if a == nil {
		return nil
	}
	v := &Attestation{Result: a.Result, Reason: a.Reason, Message: a.Message, At: a.At, Valid: a.Valid, Attempt: a.Attempt,
		Model: a.Model, NonceID: a.NonceID, PCRDigest: a.PCRDigest, PCRs: a.PCRs, Events: max(a.EventCount, len(a.Events)), State: a.State,
		Mismatches: a.Mismatches, EKSHA256: a.EKSHA256, EKIssuer: a.EKIssuer, TPM: a.TPM}
	if a.Challenge != nil {
		t := a.Challenge.Expires
		v.ChallengeAt = &t
	}
	return v
}

func attestStateView(s store.AttestState) AttestState {
	return AttestState{Meta: metaView(s.Meta), Model: s.Model, Name: s.Name, Status: s.Status, PCRs: s.PCRs, Events: len(s.Events),
		Source: s.Source, SourceAt: s.SourceAt, ApprovedBy: s.ApprovedBy, ApprovedAt: s.ApprovedAt}
}

func attestStateList(ss []store.AttestState) AttestStateList {
	out := AttestStateList{Items: make([]AttestState, 0, len(ss))}
	for _, s := range ss {
		out.Items = append(out.Items, attestStateView(s))
	}
	return out
}

func (s *Server) attestRoutes(view, op, admin echo.MiddlewareFunc) {
	s.e.POST("/v1/agent/attest/start", s.agentAttestStart)
	s.e.POST("/v1/agent/attest/quote", s.agentAttestQuote)
	s.e.GET("/v1/attest/states", s.listAttestStates, view)
	s.e.POST("/v1/attest/states/learn", s.learnAttestState, op)
	s.e.POST("/v1/attest/states/approve", s.setAttestStates(store.AttestStateApproved), admin)
	s.e.POST("/v1/attest/states/revoke", s.setAttestStates(store.AttestStateRevoked), admin)
}

// attestDocOps documents the attestation routes (appended to docOps).
func attestDocOps() []docOp {
	return []docOp{
		{Method: "POST", Path: "/v1/agent/attest/start", Summary: "Agent: open an attestation (EK, AK parameters); answers the activation challenge and nonce, or the no-TPM verdict",
			Role: RoleAgent, Body: agentapi.AttestStart{}, Status: 200, Resp: agentapi.AttestChallenge{}},
		{Method: "POST", Path: "/v1/agent/attest/quote", Summary: "Agent: the activated secret, the quote over the boot PCRs and the event log; answers the verdict (with the build's credentials on a pass)",
			Role: RoleAgent, Body: agentapi.AttestQuote{}, Status: 200, Resp: agentapi.AttestResult{}},
		{Method: "GET", Path: "/v1/attest/states", Summary: "List the measured-boot states per hardware model (proposed, approved, revoked)",
			Role: RoleViewer, Status: 200, Resp: AttestStateList{}},
		{Method: "POST", Path: "/v1/attest/states/learn", Summary: "Make a state of a reference machine's last attestation (proposed; approve: true approves it, admin only)",
			Role: RoleOperator, Body: AttestLearnRequest{}, Status: 201, Resp: AttestState{}},
		{Method: "POST", Path: "/v1/attest/states/approve", Summary: "Approve states (several at once, one audited write)",
			Role: RoleAdmin, Body: AttestStatesRequest{}, Status: 200, Resp: AttestStateList{}},
		{Method: "POST", Path: "/v1/attest/states/revoke", Summary: "Revoke states: machines whose boot matches only these are refused from their next build on",
			Role: RoleAdmin, Body: AttestStatesRequest{}, Status: 200, Resp: AttestStateList{}},
	}
}

func (s *Server) agentAttestStart(c echo.Context) error {
	p, err := s.authAgent(c)
	if err != nil {
		return err
	}
	var st agentapi.AttestStart
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &st, false); err != nil {
		return err
	}
	if err := s.bodyMachine(p, st.MachineID); err != nil {
		return err
	}
	st.MachineID = p.Machine
	ch, err := s.b.AttestStart(c.Request().Context(), p.Machine, st)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ch)
}

func (s *Server) agentAttestQuote(c echo.Context) error {
	p, err := s.authAgent(c)
	if err != nil {
		return err
	}
	var q agentapi.AttestQuote
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &q, false); err != nil {
		return err
	}
	if err := s.bodyMachine(p, q.MachineID); err != nil {
		return err
	}
	q.MachineID = p.Machine
	res, err := s.b.AttestQuote(c.Request().Context(), p.Machine, q)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, res)
}

func (s *Server) listAttestStates(c echo.Context) error {
	ss, err := s.b.ListAttestStates()
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, attestStateList(ss))
}

func (s *Server) learnAttestState(c echo.Context) error {
	var req AttestLearnRequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, true); err != nil {
		return err
	}
	if req.Machine == "" {
		return invalid("machine", "required")
	}
	if err := checkText("name", req.Name, 128); err != nil {
		return err
	}
	if req.Approve && !who(c).Role.allows(RoleAdmin) {
		return fmt.Errorf("%w: approving a state needs the admin role; learn it, then an admin approves it", ErrForbidden)
	}
	st, err := s.b.LearnAttestState(c.Request().Context(), req.Machine, req.Name, req.Approve, who(c).actor())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, attestStateView(st))
}

func (s *Server) setAttestStates(status string) echo.HandlerFunc {
	return func(c echo.Context) error {
		var req AttestStatesRequest
		if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, true); err != nil {
			return err
		}
		if len(req.IDs) == 0 || len(req.IDs) > 100 {
			return invalid("ids", "1..100 state IDs")
		}
		ss, err := s.b.SetAttestStates(c.Request().Context(), req.IDs, status, who(c).actor())
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, attestStateList(ss))
	}
}
