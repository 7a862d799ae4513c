package store

import (
	"encoding/json"
	"fmt"
	"time"
)

// AttestationRecord is a machine's last TPM attestation (issue 16;
// appliance/lifecycle/DESIGN.md "Attestation"). It is one of the round-3
// machine fields (records_v4.go): written by put_machines_v4 (30) and
// agent_report_v2 (31) only.
//
// Challenge is the outstanding challenge (nonce, the activation secret's
// hash, the AK): kept here, in the replicated record, so any node can
// verify the quote that answers it, and spent by the result's write (a
// compare-and-set on the machine): a nonce verifies at most once, on
// whichever node, and never after Challenge.Expires.
type AttestationRecord struct {
	// Result is AttestResult* ("" while only a challenge is outstanding).
	Result string `json:"result,omitempty"`
	// Reason is the closed reason of a failed result (AttestReason*).
	Reason string `json:"reason,omitempty"`
	// Message names what differed or why the quote was refused ("PCR 9
	// (kernel, initrd, command line): event 2 EV_EVENT_TAG ...").
	Message string    `json:"message,omitempty"`
	At      time.Time `json:"at"`
	// Valid: this result is the current build's (set by the verdict,
	// cleared when a build starts or is served again): the credential gate
	// opens only on a valid pass.
	Valid bool `json:"valid,omitempty"`
	// Attempt is the build attempt (StepStatus.Attempt) it was made in.
	Attempt int `json:"attempt,omitempty"`
	// Model is the hardware model ("vendor/product") the states were
	// looked up for.
	Model string `json:"model,omitempty"`
	// NonceID names the challenge the result answered.
	NonceID string `json:"nonce_id,omitempty"`
	// QuoteSHA256 is the hash of the quote that produced the result: the
	// same quote sent again (a retry after a lost answer) gets the same
	// result instead of a replay refusal.
	QuoteSHA256 string `json:"quote_sha256,omitempty"`
	// PCRDigest is the SHA-256 (hex) over the quoted PCR values in index
	// order; PCRs the values themselves.
	PCRDigest string      `json:"pcr_digest,omitempty"`
	PCRs      []AttestPCR `json:"pcrs,omitempty"`
	// Events are the replayed event log's events of the quoted PCRs (what
	// `kiln attest learn` makes an approved state from), kept for a result
	// that is not a pass; a pass's events are those of its State, so the
	// record does not carry them (every later write of the machine would
	// repeat them in the raft log). EventCount is how many were replayed.
	Events     []AttestEvent `json:"events,omitempty"`
	EventCount int           `json:"event_count,omitempty"`
	// State is the matched approved state's ID.
	State string `json:"state,omitempty"`
	// Mismatches name each measurement that differs from the closest
	// approved state.
	Mismatches []AttestMismatch `json:"mismatches,omitempty"`
	// EKSHA256 is the SHA-256 (hex) of the EK public key (PKIX DER); the
	// first attestation pins it, a later one from another EK is refused.
	EKSHA256 string `json:"ek_sha256,omitempty"`
	// EKIssuer is the EK certificate's issuer ("" when the TPM has none).
	EKIssuer string `json:"ek_issuer,omitempty"`
	// TPM is "manufacturer firmware".
	TPM string `json:"tpm,omitempty"`

	Challenge *AttestChallenge `json:"challenge,omitempty"`
}

// AttestChallenge is an outstanding attestation challenge.
type AttestChallenge struct {
	NonceID string    `json:"nonce_id"`
	Nonce   []byte    `json:"nonce"`
	Expires time.Time `json:"expires"`
	// SecretSHA256 is the hash of the credential-activation secret.
	SecretSHA256 string `json:"secret_sha256"`
	// AKPublic is the attestation key (TPMT_PUBLIC) the quote must verify with.
	AKPublic []byte `json:"ak_public"`
	// PCRs the quote must cover.
	PCRs []int `json:"pcrs"`
	// Attempt is the build attempt the challenge was issued in.
	Attempt int `json:"attempt,omitempty"`
}

// Attestation results.
const (
	AttestResultPassed     = "passed"
	AttestResultFailed     = "failed"
	AttestResultNoTPMAllow = "no_tpm_allow"
)

// Attestation failure reasons (AttestationRecord.Reason; the machine's
// reason is attestation_failed).
const (
	AttestReasonNoTPM           = "no_tpm"            // no TPM 2.0 and the model's policy refuses
	AttestReasonEKUntrusted     = "ek_untrusted"      // the EK certificate does not chain to a configured root, or does not match the EK
	AttestReasonEKChanged       = "ek_changed"        // another EK than the one pinned by the first attestation
	AttestReasonAKNotCertified  = "ak_not_certified"  // the AK's creation data or the activation secret is wrong: not a key of this TPM
	AttestReasonNonce           = "nonce_invalid"     // unknown, spent or expired challenge
	AttestReasonQuoteInvalid    = "quote_invalid"     // signature, nonce or PCR digest of the quote wrong
	AttestReasonEventLog        = "event_log_invalid" // the event log does not replay to the quoted PCRs
	AttestReasonNoApprovedState = "no_approved_state" // no approved state for the model
	AttestReasonStateMismatch   = "state_mismatch"    // a measurement differs from every approved state
)

// AttestPCR is one PCR value (SHA-256 bank, hex).
type AttestPCR struct {
	Index  int    `json:"index"`
	SHA256 string `json:"sha256"`
}

// AttestEvent is one replayed event-log event: PCR, its position among
// that PCR's events, type (EV_…), digest (hex) and a short printable
// excerpt of its data.
type AttestEvent struct {
	PCR    int    `json:"pcr"`
	Seq    int    `json:"seq"`
	Type   string `json:"type"`
	Digest string `json:"digest"`
	Data   string `json:"data,omitempty"`
	// Text is the measured text when Kiln could read it, proven by the
	// digest: the kernel command line (the agent's /proc/cmdline), with
	// Kiln's per-boot arguments masked (kiln.token=*, ...). Events with
	// Text compare by it, not by their digest.
	Text string `json:"text,omitempty"`
}

// AttestMismatch names one differing measurement: the PCR and what it
// measures, the first event of it that differs (or is missing or extra),
// and the wanted and observed digests.
type AttestMismatch struct {
	PCR         int    `json:"pcr"`
	Measurement string `json:"measurement"`
	Event       string `json:"event,omitempty"`
	Want        string `json:"want,omitempty"`
	Got         string `json:"got,omitempty"`
}

// Approved-state statuses.
const (
	AttestStateProposed = "proposed" // learned, not approved: matches nothing
	AttestStateApproved = "approved"
	AttestStateRevoked  = "revoked"
)

// AttestState is a measured-boot state of one hardware model (bucket
// attest_states; command 33 put_attest_state). Learned from a reference
// machine's attestation (proposed), then approved by an operator (audited
// event attest_state_approved); several states of a model may be approved
// at once (a rolling firmware update). Only approved states match.
type AttestState struct {
	Meta
	Model  string        `json:"model"`
	Name   string        `json:"name,omitempty"`
	Status string        `json:"status"`
	PCRs   []AttestPCR   `json:"pcrs"`
	Events []AttestEvent `json:"events,omitempty"`
	// Source is the machine it was learned from, SourceAt that
	// attestation's time.
	Source     string    `json:"source,omitempty"`
	SourceAt   time.Time `json:"source_at"`
	ApprovedBy string    `json:"approved_by,omitempty"`
	ApprovedAt time.Time `json:"approved_at"`
}

// bAttestStates holds AttestState by ID (command 33).
var bAttestStates = []byte("attest_states")

// putAttestStates is CmdPutAttestState: every state compare-and-set, all or
// nothing; one event per state (attest_state_<status>, subject
// attest_state/ID, From the old status) with the command's W.
func putAttestStates(a *applyCtx, states []AttestState) ([]json.RawMessage, []any, error) {
	if len(states) == 0 {
		return nil, nil, fmt.Errorf("%w: put_attest_state without states", ErrBadCommand)
	}
	out := make([]json.RawMessage, 0, len(states))
	recs := make([]any, 0, len(states))
	for i := range states {
		s := &states[i]
		switch s.Status {
		case AttestStateProposed, AttestStateApproved, AttestStateRevoked:
		default:
			return nil, nil, fmt.Errorf("%w: attest state %s: status %q", ErrInvalid, s.ID, s.Status)
		}
		if s.Model == "" || len(s.PCRs) == 0 {
			return nil, nil, fmt.Errorf("%w: attest state %s needs a model and PCRs", ErrInvalid, s.ID)
		}
		old, err := casPrepare[AttestState](a, bAttestStates, "attest_state", s)
		if err != nil {
			return nil, nil, err
		}
		raw, err := writeRec(a, bAttestStates, s)
		if err != nil {
			return nil, nil, err
		}
		ev := Event{Subject: "attest_state/" + s.ID, Kind: "attest_state_" + s.Status, To: s.Status,
			Message: orStr(a.w.Message, s.Model+" "+s.Name)}
		if old != nil {
			ev.From = old.Status
		}
		if err := a.event(ev); err != nil {
			return nil, nil, err
		}
		out = append(out, raw)
		recs = append(recs, s)
	}
	return out, recs, nil
}
