package fleetsim

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	gattest "github.com/google/go-attestation/attest"

	"kiln/cmd/kiln-agent/agent"
	"kiln/deploy/lab/swtpm"
)

// Attestation in the simulator (issue 16; Options.Attest): the first
// Options.Attest machines have a TPM 2.0 each, a real software TPM (swtpm,
// manufactured with an EK certificate), measured at every boot with the
// boot OVMF and the Linux EFI stub record (swtpm.UEFIBoot) and the kernel
// command line the machine's iPXE script gave it. Their agents run the
// real agent's exchange (agent.AttestTPM: EK, AK, credential activation,
// quote, event log); the other machines report no TPM (agent.AttestNoTPM),
// which the model's policy allows with a label. The model requires
// attestation, so every build runs the attest step.
//
// The first TPM machine is the model's reference, as an operator's first
// machine of a new model is: its first build is refused (no approved
// state) and quarantined; the simulator then learns and approves that
// measured boot (POST /v1/attest/states/learn, approve), inspects the
// machine again and claims it again. The other TPM machines are claimed
// once the state is approved.

// attestConfig is the appliance config's attest section of a run with
// Options.Attest (appliance/attest_config.go keys).
func attestConfig(o Options) string {
	if o.Attest <= 0 {
		return ""
	}
	return fmt.Sprintf("attest:\n  models:\n    - model: %s/%s\n      require: true\n      no_tpm: allow\n", fleetVendor, fleetModel)
}

// AttestResult is the attestation part of a run (Options.Attest > 0).
// Times are in seconds.
type AttestResult struct {
	// TPMs: machines with a swtpm; ManufactureSeconds: making all of them
	// (swtpm_setup with an EK certificate) before the run.
	TPMs               int     `json:"tpms"`
	ManufactureSeconds float64 `json:"manufacture_seconds"`
	// Passed: attest steps that passed with a TPM; NoTPM: steps the
	// model's policy let through without one; Refused: steps refused (the
	// reference's first build is one).
	Passed  int `json:"passed"`
	NoTPM   int `json:"no_tpm"`
	Refused int `json:"refused"`
	// Reference is the reference machine's first verdict; ApprovedAt is
	// when its state was approved (seconds after the import began), State
	// the approved state's ID.
	Reference  string  `json:"reference"`
	ApprovedAt float64 `json:"approved_at"`
	State      string  `json:"state"`
	// StepTPM and StepNoTPM are the attest step as the agent times it
	// (the TPM's work and both calls included), TPM machines and the others.
	StepTPM   Phase `json:"step_tpm"`
	StepNoTPM Phase `json:"step_no_tpm"`
	// Kiln's handler latency of the agent's two calls (mean ms, and the
	// call counts), from kiln_api_request_seconds: start answers a no-TPM
	// report too; quote is made only with a TPM.
	StartMS  float64 `json:"start_ms"`
	Starts   int     `json:"starts"`
	QuoteMS  float64 `json:"quote_ms"`
	Quotes   int     `json:"quotes"`
	PerTPMMS float64 `json:"per_tpm_ms"` // Kiln's time per TPM attestation: quote mean + start mean
}

// Line is the run's attestation line:
//
//	fleet: attest: T TPMs (swtpm) + U without; P passed, R refused (reference: …); kiln per attestation X ms (start A ms × S, quote B ms × Q); step p50/p99 …
func (a *AttestResult) Line() string {
	return fmt.Sprintf("fleet: attest: %d machines with a TPM (swtpm, made in %.1f s), %d without (allowed, labelled); %d passed, %d refused (reference's first build: %s; state %s approved at %.1f s); "+
		"kiln handler time per TPM attestation %.2f ms (start %.2f ms × %d, with or without a TPM; quote %.2f ms × %d); attest step p50/p99 s: tpm %.3f/%.3f, no tpm %.3f/%.3f",
		a.TPMs, a.ManufactureSeconds, a.NoTPM, a.Passed, a.Refused, a.Reference, a.State, a.ApprovedAt,
		a.PerTPMMS, a.StartMS, a.Starts, a.QuoteMS, a.Quotes, a.StepTPM.P50, a.StepTPM.P99, a.StepNoTPM.P50, a.StepNoTPM.P99)
}

// attestState is the run's attestation bookkeeping.
type attestState struct {
	mu       sync.Mutex
	approved bool
	held     []*machine // TPM machines available before the state was approved
	res      AttestResult
	start    time.Time       // the import's start
	tpm      []time.Duration // attest steps passed with a TPM
	noTPM    []time.Duration // attest steps passed without
}

// makeTPMs manufactures one swtpm for each of the first o.Attest machines
// under Work/tpm, 4 at a time.
func (f *fleet) makeTPMs() error {
	if f.o.Attest <= 0 {
		return nil
	}
	t0 := time.Now()
	jobs := make(chan *machine)
	errc := make(chan error, f.o.Attest)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range jobs {
				t, err := swtpm.Start(filepath.Join(f.o.Work, "tpm", m.name))
				if err != nil {
					errc <- fmt.Errorf("fleetsim: %s's TPM: %w", m.name, err)
					continue
				}
				m.tpm = t
			}
		}()
	}
	for _, m := range f.machines[:f.o.Attest] {
		jobs <- m
	}
	close(jobs)
	wg.Wait()
	close(errc)
	f.att.res.TPMs = f.o.Attest
	f.att.res.ManufactureSeconds = time.Since(t0).Seconds()
	f.say("fleet: attest: %d TPMs manufactured (swtpm, EK certificates) in %.1f s", f.o.Attest, f.att.res.ManufactureSeconds)
	return <-errc
}

func (f *fleet) closeTPMs() {
	for _, m := range f.machines {
		if m.tpm != nil {
			m.tpm.Close()
		}
	}
}

// attest is the machine's attest step: its TPM rebooted when it was
// measured before (the PCRs start from zero at a reset), the boot
// measured with cmdline, and the agent's exchange; without a TPM the
// no-TPM report. The step's time is recorded by kind.
func (m *machine) attest(ctx context.Context, a *agentConn, cmdline string) (string, error) {
	t0 := time.Now()
	var msg string
	var err error
	if m.tpm == nil {
		msg, _, err = agent.AttestNoTPM(ctx, m.id, "fleetsim: no TPM in this machine", a.call)
	} else {
		msg, err = m.attestTPM(ctx, a, cmdline)
	}
	d := time.Since(t0)
	st := m.f.att
	st.mu.Lock()
	defer st.mu.Unlock()
	var se *agent.StepError
	switch {
	case err == nil && m.tpm == nil:
		st.res.NoTPM++
		st.noTPM = append(st.noTPM, d)
	case err == nil:
		st.res.Passed++
		st.tpm = append(st.tpm, d)
	case errors.As(err, &se):
		st.res.Refused++
		return "", &stepErr{se.Reason, se.Err}
	}
	return msg, err
}

func (m *machine) attestTPM(ctx context.Context, a *agentConn, cmdline string) (string, error) {
	if m.measured {
		if err := m.tpm.Reboot(); err != nil {
			return "", err
		}
	}
	m.measured = true
	if err := m.tpm.Measure(swtpm.UEFIBoot(cmdline)...); err != nil {
		return "", err
	}
	conn, err := m.tpm.Open()
	if err != nil {
		return "", err
	}
	tpm, err := gattest.OpenTPM(&gattest.OpenConfig{CommandChannel: conn})
	if err != nil {
		conn.Close()
		return "", err
	}
	defer tpm.Close()
	msg, _, err := agent.AttestTPM(ctx, tpm, m.id, cmdline, a.call)
	return msg, err
}

// hold reports whether the provisioner must not claim m yet: a TPM
// machine other than the reference, before the reference's state is
// approved (it is claimed when approve releases it).
func (st *attestState) hold(m *machine) bool {
	if st == nil || m.tpm == nil || m.i == 0 {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.approved {
		return false
	}
	st.held = append(st.held, m)
	return true
}

// isReferenceRefusal reports whether m's quarantine is the reference's
// first, expected refusal (before any state was approved).
func (st *attestState) isReferenceRefusal(m *machine) bool {
	if st == nil || m.i != 0 || m.tpm == nil {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return !st.approved && st.res.Reference == ""
}

// approveReference is the operator's part for the reference m, which was
// just quarantined: its refusal must be no_approved_state; the measured
// boot is learned and approved, the machine inspected again and, once
// available, claimed again (watcher.transition, m.reclaim); the held TPM
// machines are then handed to the provisioner. A refusal of another kind
// or a failing call is the machine's simulator error.
func (f *fleet) approveReference(ctx context.Context, w *watcher, m *machine) {
	st := f.att
	var mm struct {
		State       string `json:"state"`
		Attestation *struct {
			Result  string `json:"result"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
			Events  int    `json:"events"`
		} `json:"attestation"`
	}
	err := f.do(ctx, "GET", "/v1/machines/"+m.id, nil, nil, "", &mm)
	if err == nil && (mm.Attestation == nil || mm.Attestation.Reason != "no_approved_state") {
		err = fmt.Errorf("the reference's first build: %s, attestation %+v; want refused with no_approved_state", mm.State, mm.Attestation)
	}
	var learned struct {
		ID string `json:"id"`
	}
	if err == nil {
		st.mu.Lock()
		st.res.Reference = fmt.Sprintf("%s %s, %d events", mm.Attestation.Result, mm.Attestation.Reason, mm.Attestation.Events)
		st.mu.Unlock()
		err = f.do(ctx, "POST", "/v1/attest/states/learn", nil, map[string]any{"machine": m.id, "name": "fleetsim reference", "approve": true}, "", &learned)
	}
	if err == nil {
		m.mu.Lock()
		m.reclaim = true
		m.mu.Unlock()
		err = f.do(ctx, "POST", "/v1/machines/"+m.id+"/inspect", nil, map[string]string{"reason": "attest_state_approved"}, "", nil)
	}
	if err != nil {
		m.setErr(fmt.Errorf("attest reference: %w", err))
		f.say("fleet: attest: reference %s: %v", m.name, err)
		return
	}
	st.mu.Lock()
	st.approved = true
	st.res.State = learned.ID
	st.res.ApprovedAt = time.Since(st.start).Seconds()
	held := st.held
	st.held = nil
	st.mu.Unlock()
	f.say("fleet: attest: reference %s refused (%s); state %s learned and approved; %d held machines released", m.name, st.res.Reference, learned.ID, len(held))
	for _, h := range held {
		w.avail <- h
	}
}

// finish fills the result's step times and Kiln's handler latencies
// (the run's /metrics, watched series).
func (st *attestState) finish(metrics map[string]float64) *AttestResult {
	st.mu.Lock()
	defer st.mu.Unlock()
	r := st.res
	r.StepTPM, r.StepNoTPM = phaseOf("attest_tpm", st.tpm), phaseOf("attest_no_tpm", st.noTPM)
	mean := func(route string) (float64, int) {
		k := `{method="POST",route="/v1/agent/attest/` + route + `"}`
		n := metrics["kiln_api_request_seconds_count"+k]
		if n == 0 {
			return 0, 0
		}
		return 1000 * metrics["kiln_api_request_seconds_sum"+k] / n, int(n)
	}
	r.StartMS, r.Starts = mean("start")
	r.QuoteMS, r.Quotes = mean("quote")
	if r.Quotes > 0 {
		r.PerTPMMS = r.StartMS + r.QuoteMS
	}
	return &r
}
