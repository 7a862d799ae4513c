// Attestation (issue 16; DESIGN.md "Attestation"): the agent's attest step
// (AttestStart, AttestQuote), the credential gate (CredentialGate), and the
// approved measured-boot states per hardware model (learn, approve,
// revoke). The cryptography is package appliance/attest; this file keeps
// the challenge in the machine's record, applies the model's policy and
// moves the machine.

package lifecycle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"kiln/api/agentapi"
	"kiln/appliance/attest"
	"kiln/store"
)

// Attestation policy values (AttestPolicy.NoTPM).
const (
	NoTPMRefuse = "refuse" // a machine without a TPM is quarantined (attestation_failed, no_tpm)
	NoTPMAllow  = "allow"  // it is built, labelled LabelAttestation=no-tpm
)

// LabelAttestation is the machine label an attested build sets: "passed",
// or "no-tpm" for a machine the model's policy lets through without a TPM
// (a claim's selector can ask for kiln.io/attestation=passed).
const LabelAttestation = "kiln.io/attestation"

// ReasonAttestationFailed is the machine's reason when the attestation
// refused its measured boot (quarantined) or the agent could not attest.
const ReasonAttestationFailed = string(agentapi.ReasonAttestationFailed)

// DefaultChallengeTTL bounds an attestation challenge's life.
const DefaultChallengeTTL = 2 * time.Minute

// ErrAttestationRequired: the credential gate is closed (no passing
// attestation for this build).
var ErrAttestationRequired = errors.New("lifecycle: credentials need a passing attestation of this build")

// AttestPolicy is one hardware model's attestation policy.
type AttestPolicy struct {
	// Require: every build of the model attests (the attest step) and gets
	// its credentials only after a pass. false: no attest step, gate open.
	Require bool
	// NoTPM is NoTPMRefuse (default) or NoTPMAllow.
	NoTPM string
}

// AttestConfig configures attestation.
type AttestConfig struct {
	// Default applies to every model not in Models (zero: not required).
	Default AttestPolicy
	// Models maps "vendor/product" (as the agent's inventory reports
	// them) to the model's policy.
	Models map[string]AttestPolicy
	// PCRs quoted and compared; default attest.DefaultPCRs.
	PCRs []int
	// ChallengeTTL: default DefaultChallengeTTL.
	ChallengeTTL time.Duration
	// Trust: which EKs are accepted (manufacturer roots); zero = pinned
	// on first use.
	Trust attest.Trust
}

// ModelOf is the hardware model key of m: "vendor/product" as discovered
// (else as intended).
func ModelOf(m store.Machine) string {
	hw := m.Intended
	if m.Discovered != nil {
		hw = *m.Discovered
	}
	return hw.Vendor + "/" + hw.Model
}

func (c *Controller) attestPolicy(m store.Machine) AttestPolicy {
	if p, ok := c.cfg.Attest.Models[ModelOf(m)]; ok {
		return p
	}
	return c.cfg.Attest.Default
}

// attestRequired reports whether m's builds attest.
func (c *Controller) attestRequired(m store.Machine) bool { return c.attestPolicy(m).Require }

func buildAttempt(m store.Machine) int {
	if m.Step != nil {
		return m.Step.Attempt
	}
	return 0
}

// CredentialGate decides whether machine m's build may receive its
// cluster credentials (join configuration, CA, bootstrap secrets): yes when
// its model does not require attestation, or its attestation of this build
// (valid, same attempt) passed or was let through by the no-TPM policy.
// Otherwise ErrAttestationRequired. The credentials endpoint (issue 15)
// and the attest result call it.
func (c *Controller) CredentialGate(m store.Machine) error {
	if !c.attestRequired(m) {
		return nil
	}
	a := m.Attestation
	if m.State == store.StateProvisioning && a != nil && a.Valid && a.Attempt == buildAttempt(m) &&
		(a.Result == store.AttestResultPassed || a.Result == store.AttestResultNoTPMAllow) {
		return nil
	}
	return fmt.Errorf("%w (machine %s)", ErrAttestationRequired, m.ID)
}

// invalidateAttestation marks m's last attestation as not this build's (a
// build starts or is served again): the next build attests anew.
func invalidateAttestation(m *store.Machine) {
	if m.Attestation != nil {
		a := *m.Attestation
		a.Valid, a.Challenge = false, nil
		m.Attestation = &a
	}
}

// attestStepOpen reports whether the attest step may run now: the machine
// is provisioning, must attest, and its build has not gone past attest.
func (c *Controller) attestStepOpen(m store.Machine) error {
	if m.State != store.StateProvisioning || m.Claim == nil || buildComplete(m) {
		return &StateError{Op: "attest", Machine: m.ID, State: m.State, Want: []store.MachineState{store.StateProvisioning}}
	}
	if !c.attestRequired(m) {
		return fmt.Errorf("%w: machine %s (model %s) does not attest", ErrInvalid, m.ID, ModelOf(m))
	}
	return nil
}

// AttestStart answers POST /v1/agent/attest/start: a machine without a
// TPM gets its model's verdict; otherwise the EK and AK are checked and a
// challenge is issued and kept in the machine's record (replacing any
// outstanding one). A refused EK or AK quarantines the machine.
func (c *Controller) AttestStart(ctx context.Context, machineID string, st agentapi.AttestStart) (agentapi.AttestChallenge, error) {
	if st.MachineID != "" && st.MachineID != machineID {
		return agentapi.AttestChallenge{}, fmt.Errorf("%w: token for %s, attestation for %s", ErrMachineMismatch, machineID, st.MachineID)
	}
	c.seen(machineID)
	m, err := c.st.GetMachine(machineID)
	if err != nil {
		return agentapi.AttestChallenge{}, fmt.Errorf("lifecycle: attest %s: %w", machineID, err)
	}
	if err := c.attestStepOpen(m); err != nil {
		return agentapi.AttestChallenge{}, err
	}
	now := c.now()
	rec := store.AttestationRecord{At: now, Attempt: buildAttempt(m), Model: ModelOf(m),
		TPM: strings.TrimSpace(sanitize(st.TPMManufacturer + " " + st.TPMFirmware))}
	if st.NoTPM {
		rec.TPM = ""
		if c.attestPolicy(m).NoTPM == NoTPMAllow {
			rec.Result, rec.Valid = store.AttestResultNoTPMAllow, true
			rec.Message = "no TPM; model " + rec.Model + " allows it (label " + LabelAttestation + "=no-tpm)"
			res, err := c.attestVerdict(ctx, m.ID, "", rec)
			return agentapi.AttestChallenge{Result: &res}, err
		}
		rec.Result, rec.Reason = store.AttestResultFailed, store.AttestReasonNoTPM
		rec.Message = "no TPM (" + truncate(sanitize(st.NoTPMReason), 120) + "); model " + rec.Model + " requires one"
		res, err := c.attestVerdict(ctx, m.ID, "", rec)
		return agentapi.AttestChallenge{Result: &res}, err
	}
	ch, err := attest.NewChallenge(st, c.attestPCRs(), c.cfg.Attest.Trust, now, c.challengeTTL())
	if err == nil && m.Attestation != nil && m.Attestation.EKSHA256 != "" && m.Attestation.EKSHA256 != ch.EKSHA256 {
		err = &attest.Error{Reason: store.AttestReasonEKChanged, Msg: "the TPM's EK " + short(ch.EKSHA256) +
			" is not the one this machine attested with (" + short(m.Attestation.EKSHA256) + ")"}
	}
	if r := attest.ReasonOf(err); r != "" {
		rec.Result, rec.Reason, rec.Message = store.AttestResultFailed, r, err.Error()
		res, err := c.attestVerdict(ctx, m.ID, "", rec)
		return agentapi.AttestChallenge{Result: &res}, err
	}
	if err != nil {
		return agentapi.AttestChallenge{}, err
	}
	ch.Pending.Attempt = rec.Attempt
	_, err = c.update(ctx, m.ID, store.W{Actor: ActorController}, func(m *store.Machine) error {
		if c.attestStepOpen(*m) != nil {
			return errNoChange
		}
		a := store.AttestationRecord{}
		if m.Attestation != nil {
			a = *m.Attestation
		}
		a.Valid = false
		p := ch.Pending
		a.Challenge = &p
		if a.EKSHA256 == "" {
			a.EKSHA256, a.EKIssuer = ch.EKSHA256, ch.EKIssuer
		}
		m.Attestation = &a
		return nil
	})
	if err != nil {
		return agentapi.AttestChallenge{}, err
	}
	return ch.Wire, nil
}

// AttestQuote answers POST /v1/agent/attest/quote: the quote is verified
// against the machine's outstanding challenge, its measured boot compared
// with the model's approved states, and the verdict recorded (the
// challenge spent in the same write). A pass returns the build's
// credentials; a refusal quarantines the machine (attestation_failed,
// naming the measurement). The same quote sent again gets the recorded
// verdict.
func (c *Controller) AttestQuote(ctx context.Context, machineID string, q agentapi.AttestQuote) (agentapi.AttestResult, error) {
	if q.MachineID != "" && q.MachineID != machineID {
		return agentapi.AttestResult{}, fmt.Errorf("%w: token for %s, quote for %s", ErrMachineMismatch, machineID, q.MachineID)
	}
	c.seen(machineID)
	m, err := c.st.GetMachine(machineID)
	if err != nil {
		return agentapi.AttestResult{}, fmt.Errorf("lifecycle: attest %s: %w", machineID, err)
	}
	qsum := sha256.Sum256(append(append([]byte(nil), q.Quote...), q.Signature...))
	qhex := hex.EncodeToString(qsum[:])
	if a := m.Attestation; a != nil && a.Challenge == nil && a.NonceID == q.NonceID && a.QuoteSHA256 == qhex && a.Result != "" {
		return c.resultOf(m), nil // a retry of the quote whose answer was lost
	}
	if err := c.attestStepOpen(m); err != nil {
		return agentapi.AttestResult{}, err
	}
	now := c.now()
	rec := store.AttestationRecord{At: now, Attempt: buildAttempt(m), Model: ModelOf(m), NonceID: q.NonceID, QuoteSHA256: qhex}
	if m.Attestation != nil {
		rec.EKSHA256, rec.EKIssuer, rec.TPM = m.Attestation.EKSHA256, m.Attestation.EKIssuer, m.Attestation.TPM
	}
	if m.Attestation == nil || m.Attestation.Challenge == nil {
		rec.Result, rec.Reason, rec.Message = store.AttestResultFailed, store.AttestReasonNonce, "no outstanding challenge (spent or never issued): a replayed quote"
		return c.attestVerdict(ctx, m.ID, "", rec)
	}
	ev, err := attest.Verify(*m.Attestation.Challenge, q, now)
	if err != nil {
		rec.Result, rec.Reason, rec.Message = store.AttestResultFailed, attest.ReasonOf(err), err.Error()
		if rec.Reason == "" {
			rec.Reason = store.AttestReasonQuoteInvalid
		}
		// A refusal is recorded whatever challenge is outstanding (a
		// replayed quote names an old one): the machine is quarantined.
		return c.attestVerdict(ctx, m.ID, "", rec)
	}
	rec.PCRs, rec.PCRDigest, rec.Events, rec.EventCount = ev.PCRs, ev.Digest, ev.Events, len(ev.Events)
	all, err := c.st.ListAttestStates()
	if err != nil {
		return agentapi.AttestResult{}, err
	}
	var states []store.AttestState
	for _, s := range all {
		if s.Model == rec.Model && s.Status == store.AttestStateApproved {
			states = append(states, s)
		}
	}
	mt := attest.Compare(ev, states)
	switch {
	case len(states) == 0:
		rec.Result, rec.Reason = store.AttestResultFailed, store.AttestReasonNoApprovedState
		rec.Message = "no approved state for model " + rec.Model + " (kiln attest learn " + m.ID + ", then kiln attest approve)"
	case mt.State != nil:
		rec.Result, rec.Valid, rec.State = store.AttestResultPassed, true, mt.State.ID
		rec.Events = nil // they are the state's (store.AttestationRecord.Events)
		rec.Message = "matches approved state " + mt.State.ID
		if mt.State.Name != "" {
			rec.Message += " (" + mt.State.Name + ")"
		}
	default:
		rec.Result, rec.Reason, rec.Mismatches = store.AttestResultFailed, store.AttestReasonStateMismatch, mt.Mismatches
		rec.Message = truncate(attest.Summary(mt.Mismatches)+"; closest approved state "+mt.Closest.ID, 400)
	}
	return c.attestVerdict(ctx, m.ID, q.NonceID, rec)
}

// attestVerdict records rec on machine id with an "attestation" event, and
// moves a refused machine to quarantined; the write clears the outstanding
// challenge. nonceID, when set, is the challenge the verdict verified
// against: the write happens only while it is still outstanding (spent
// once, whichever node serves the quote). It returns the agent's answer.
func (c *Controller) attestVerdict(ctx context.Context, id, nonceID string, rec store.AttestationRecord) (agentapi.AttestResult, error) {
	ev := store.Event{Subject: "machine/" + id, Kind: "attestation", Actor: ActorController, To: rec.Result,
		Reason: rec.Reason, Message: truncate(attestEventMessage(rec), agentapi.MaxMessageLen)}
	w := store.W{Actor: ActorController}
	if rec.Result == store.AttestResultFailed {
		w.Reason = ReasonAttestationFailed
	}
	spent := false
	m, err := c.report(ctx, id, []store.Event{ev}, w, func(m *store.Machine) error {
		if c.attestStepOpen(*m) != nil {
			return errNoChange
		}
		if nonceID != "" && (m.Attestation == nil || m.Attestation.Challenge == nil || m.Attestation.Challenge.NonceID != nonceID) {
			spent = true // another node or request spent it meanwhile
			return errNoChange
		}
		r := rec
		if r.EKSHA256 == "" && m.Attestation != nil {
			r.EKSHA256, r.EKIssuer = m.Attestation.EKSHA256, m.Attestation.EKIssuer
		}
		if rec.Result == store.AttestResultFailed && len(r.Events) == 0 && m.Attestation != nil && len(m.Attestation.Events) > 0 {
			// Keep the last evidence for `kiln attest learn` when this
			// refusal has none (a bad quote).
			r.PCRs, r.PCRDigest, r.Events, r.EventCount = m.Attestation.PCRs, m.Attestation.PCRDigest, m.Attestation.Events, m.Attestation.EventCount
		}
		m.Attestation = &r
		switch rec.Result {
		case store.AttestResultFailed:
			m.State = store.StateQuarantined
			m.Reason = ReasonAttestationFailed
			m.Message = "attestation: " + truncate(rec.Message, 400)
			m.Step = &store.StepStatus{Step: agentapi.StepAttest, State: string(agentapi.StateFailed),
				Reason: ReasonAttestationFailed, Message: truncate(rec.Message, agentapi.MaxMessageLen), At: rec.At, Attempt: rec.Attempt}
		case store.AttestResultPassed:
			setMachineLabel(m, LabelAttestation, "passed")
		case store.AttestResultNoTPMAllow:
			setMachineLabel(m, LabelAttestation, "no-tpm")
		}
		return nil
	})
	if err != nil {
		return agentapi.AttestResult{}, err
	}
	if spent {
		if m.Attestation != nil && m.Attestation.QuoteSHA256 == rec.QuoteSHA256 {
			return c.resultOf(m), nil // the same quote, recorded by a concurrent request
		}
		return agentapi.AttestResult{Result: store.AttestResultFailed, Reason: store.AttestReasonNonce,
			Message: "challenge " + nonceID + " was spent meanwhile"}, nil
	}
	c.logger().Info("attestation", "machine", id, "result", rec.Result, "reason", rec.Reason, "message", rec.Message)
	return c.resultOf(m), nil
}

func setMachineLabel(m *store.Machine, k, v string) {
	labels := make(map[string]string, len(m.Labels)+1)
	for a, b := range m.Labels {
		labels[a] = b
	}
	labels[k] = v
	m.Labels = labels
}

// resultOf is the agent's answer for m's recorded attestation: with the
// claim's credentials when the gate is open.
func (c *Controller) resultOf(m store.Machine) agentapi.AttestResult {
	a := m.Attestation
	if a == nil {
		return agentapi.AttestResult{Result: store.AttestResultFailed, Reason: store.AttestReasonNonce}
	}
	res := agentapi.AttestResult{Result: a.Result, Reason: a.Reason, Message: a.Message, State: a.State}
	if m.Claim != nil && c.CredentialGate(m) == nil {
		res.Credentials = &agentapi.StageCredentials{JoinData: m.Claim.JoinData, CABundle: m.Claim.CABundle}
	}
	return res
}

func attestEventMessage(r store.AttestationRecord) string {
	s := r.Result
	if r.Reason != "" {
		s += " (" + r.Reason + ")"
	}
	if r.Message != "" {
		s += ": " + r.Message
	}
	if r.PCRDigest != "" {
		s += "; pcrs " + short(r.PCRDigest)
	}
	if r.NonceID != "" {
		s += "; nonce " + r.NonceID
	}
	return s
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func (c *Controller) attestPCRs() []int {
	if len(c.cfg.Attest.PCRs) > 0 {
		return c.cfg.Attest.PCRs
	}
	return attest.DefaultPCRs
}

func (c *Controller) challengeTTL() time.Duration {
	if c.cfg.Attest.ChallengeTTL > 0 {
		return c.cfg.Attest.ChallengeTTL
	}
	return DefaultChallengeTTL
}

// attestGateReport refuses a build step that starts while the gate is
// closed (an agent that skipped the attest step): "" when rep may proceed,
// else the failure message.
func (c *Controller) attestGateReport(m store.Machine, rep agentapi.Report) string {
	if m.State != store.StateProvisioning || rep.State != agentapi.StateStarted || !c.attestRequired(m) {
		return ""
	}
	if buildIndex(rep.Step) <= buildIndex(agentapi.StepAttest) || rep.Step == agentapi.StepReboot {
		return ""
	}
	if c.CredentialGate(m) == nil {
		return ""
	}
	return "step " + rep.Step + " started before a passing attestation of this build"
}

// ListAttestStates returns the measured-boot states, ordered by model then ID.
func (c *Controller) ListAttestStates() ([]store.AttestState, error) {
	out, err := c.st.ListAttestStates()
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Model != out[j].Model {
			return out[i].Model < out[j].Model
		}
		return out[i].ID < out[j].ID
	})
	return out, err
}

// LearnAttestState makes a proposed state of machine id's last attestation
// evidence (its quoted PCRs and replayed events; the reference machine's
// first attestation is refused with no_approved_state and keeps them).
// approve approves it in the same write. ErrInvalid when the machine has no
// evidence.
func (c *Controller) LearnAttestState(ctx context.Context, id, name string, approve bool, actor string) (store.AttestState, error) {
	m, err := c.st.GetMachine(id)
	if err != nil {
		return store.AttestState{}, fmt.Errorf("lifecycle: learn from %s: %w", id, err)
	}
	a := m.Attestation
	if a == nil || len(a.PCRs) == 0 {
		return store.AttestState{}, fmt.Errorf("%w: machine %s has no verified attestation to learn from (it must attest once: provision it)", ErrInvalid, id)
	}
	events := a.Events
	if len(events) == 0 && a.State != "" {
		// A pass keeps no events of its own: they are its matched state's.
		st, err := c.st.GetAttestState(a.State)
		if err != nil {
			return store.AttestState{}, fmt.Errorf("lifecycle: learn from %s: its matched state %s: %w", id, a.State, err)
		}
		events = st.Events
	}
	s := store.AttestState{Model: a.Model, Name: name, Status: store.AttestStateProposed,
		PCRs: a.PCRs, Events: events, Source: id, SourceAt: a.At}
	if approve {
		s.Status, s.ApprovedBy, s.ApprovedAt = store.AttestStateApproved, actor, c.now()
	}
	out, err := c.st.PutAttestStates(ctx, []store.AttestState{s}, store.W{Actor: actor, Reason: "attest_state_learned",
		Message: "learned from " + id + " (" + a.Model + ", pcrs " + short(a.PCRDigest) + ")"})
	if err != nil {
		return store.AttestState{}, err
	}
	return out[0], nil
}

// SetAttestStates sets the status of states ids (approved or revoked) in
// one write (several at once: a rolling firmware update), audited with
// actor. Errors: store.ErrNotFound, ErrInvalid, store.ErrConflict.
func (c *Controller) SetAttestStates(ctx context.Context, ids []string, status, actor string) ([]store.AttestState, error) {
	if status != store.AttestStateApproved && status != store.AttestStateRevoked {
		return nil, fmt.Errorf("%w: status %q", ErrInvalid, status)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: no state IDs", ErrInvalid)
	}
	var last error
	for attempt := 0; attempt < maxCASRetries; attempt++ {
		states := make([]store.AttestState, 0, len(ids))
		for _, id := range ids {
			s, err := c.st.GetAttestState(id)
			if err != nil {
				return nil, fmt.Errorf("lifecycle: attest state %s: %w", id, err)
			}
			s.Status = status
			if status == store.AttestStateApproved {
				s.ApprovedBy, s.ApprovedAt = actor, c.now()
			}
			states = append(states, s)
		}
		out, err := c.st.PutAttestStates(ctx, states, store.W{Actor: actor, Reason: "attest_state_" + status})
		if errors.Is(err, store.ErrConflict) {
			last = err
			continue
		}
		return out, err
	}
	return nil, last
}

// The attestation operations of Service (api.AttestBackend).

func (s *Service) AttestStart(ctx context.Context, id string, st agentapi.AttestStart) (agentapi.AttestChallenge, error) {
	return s.c.AttestStart(ctx, id, st)
}
func (s *Service) AttestQuote(ctx context.Context, id string, q agentapi.AttestQuote) (agentapi.AttestResult, error) {
	return s.c.AttestQuote(ctx, id, q)
}
func (s *Service) ListAttestStates() ([]store.AttestState, error) { return s.c.ListAttestStates() }
func (s *Service) LearnAttestState(ctx context.Context, id, name string, approve bool, actor string) (store.AttestState, error) {
	return s.c.LearnAttestState(ctx, id, name, approve, actor)
}
func (s *Service) SetAttestStates(ctx context.Context, ids []string, status, actor string) ([]store.AttestState, error) {
	return s.c.SetAttestStates(ctx, ids, status, actor)
}
