package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"kiln/api"
	"kiln/api/agentapi"
	"kiln/api/client"
)

// attestJoinData is the attested run's claim join data: a credential the
// gate holds back until the machine's measured boot matches an approved
// state, so the disk holds it only after a pass.
const attestJoinData = "kubeadm join 10.99.0.1:6443 --token e2e-attest-SECRET"

// e2eAttest is the attested run's appliance config: every model attests
// and a machine without a TPM is refused (appliance/attest_config.go).
const e2eAttest = `attest:
  default:
    require: true
    no_tpm: refuse
`

// attestReference is the operator's part of a first attested build on a
// new model, as `kiln attest learn --approve` and `kiln machines inspect`
// do it: the first claim must have been refused for want of an approved
// state (quarantined, attestation_failed, no_approved_state) with no join
// data on the disk; the refused quote's measured boot is learned as the
// model's reference and approved; the machine is inspected again and
// claimed again. The refused build's disk must not hold the join data.
func attestReference(ctx context.Context, k *kiln, w *watcher, r *Result, disk, image string, claim api.Claim, secret string, say func(string, ...any)) error {
	m := w.last
	if m.State != client.StateQuarantined || m.Reason != "attestation_failed" || m.Attestation == nil || m.Attestation.Reason != "no_approved_state" {
		return fmt.Errorf("first attested claim: machine %s (%s) %q, attestation %+v; want quarantined (attestation_failed, no_approved_state)",
			m.State, m.Reason, m.Message, m.Attestation)
	}
	r.AttestRefused = m.Attestation
	b, err := os.ReadFile(disk)
	if err != nil {
		return err
	}
	if bytes.Contains(b, []byte(secret)) {
		return fmt.Errorf("the refused build's disk holds the claim's secret (join data or cluster token): the gate let the credentials through")
	}
	say("attest: reference build refused as it must be: %s", attestSummary(m.Attestation))
	st, err := k.api.LearnAttestState(ctx, api.AttestLearnRequest{Machine: m.ID, Name: "ovmf e2e reference", Approve: true})
	if err != nil {
		return fmt.Errorf("attest learn: %w", err)
	}
	say("attest: learned and approved state %s from %s", st.ID, m.ID)
	if _, err := k.api.Inspect(ctx, m.ID, api.ActionRequest{Reason: "attest_state_approved"}); err != nil {
		return fmt.Errorf("inspect after approval: %w", err)
	}
	if err := w.until(ctx, func(x api.Machine) bool {
		return x.State == client.StateAvailable || x.State == client.StateFailed || x.State == client.StateQuarantined ||
			x.State == client.StateProvisioning
	}); err != nil {
		return err
	}
	switch w.last.State {
	case client.StateAvailable:
		if w.last.Claim != nil {
			break // the quarantine kept the claim: the agent's next poll starts its build
		}
		if _, err := k.api.Provision(ctx, m.ID, api.ProvisionRequest{Reason: "e2e attested", Claim: claim}); err != nil {
			return fmt.Errorf("provision after approval: %w", err)
		}
	case client.StateProvisioning:
	default:
		return fmt.Errorf("inspection after approval ended %s (%s): %s", w.last.State, w.last.Reason, w.last.Message)
	}
	say("claim: provisioning %s with %s again, its measured boot approved", m.ID, image)
	return nil
}

// attestStepSeconds is the last attest step's started→succeeded time in
// the machine's step events (Kiln's clock), 0 without both.
func attestStepSeconds(evs []api.Event, id string) float64 {
	var started, done time.Time
	for _, e := range evs {
		if e.Subject != "machine/"+id || e.Kind != "step" || !strings.HasPrefix(e.Message, agentapi.StepAttest) {
			continue
		}
		switch e.To {
		case string(agentapi.StateStarted):
			started, done = e.Time, time.Time{}
		case string(agentapi.StateSucceeded):
			done = e.Time
		}
	}
	if started.IsZero() || done.IsZero() {
		return 0
	}
	return done.Sub(started).Seconds()
}

func attestSummary(a *api.Attestation) string {
	if a == nil {
		return "no attestation record"
	}
	return fmt.Sprintf("%s (%s) %q; TPM %s, %d events", a.Result, a.Reason, a.Message, a.TPM, a.Events)
}

func attestState(a *api.Attestation) string {
	if a == nil {
		return ""
	}
	return a.State
}
