package lifecycle

import (
	"crypto/x509"
	"fmt"
	"strings"
	"testing"
	"time"

	gattest "github.com/google/go-attestation/attest"

	"kiln/api/agentapi"
	"kiln/deploy/lab/swtpm"
	"kiln/deploy/lab/testreq"
	"kiln/store"
)

// The attestation gate in the lifecycle (issue 16) with real software
// TPMs: the reference machine's first build is refused (no approved
// state), its evidence is learned and approved, a machine of the same
// model then passes and receives its credentials; a replayed quote, a
// changed kernel command line and an agent that skips the step are
// refused; the no-TPM policy per model.

const attestModel = "QEMU/Standard PC (Q35 + ICH9, 2009)"

// tpmMachine is an agent's TPM: swtpm measured with a boot whose kernel
// command line is cmdline, and go-attestation over it.
type tpmMachine struct {
	t   *testing.T
	sw  *swtpm.TPM
	tpm *gattest.TPM
	ak  *gattest.AK
	ek  gattest.EK
}

func newTPMMachine(t *testing.T, cmdline string) *tpmMachine {
	t.Helper()
	testreq.Commands(t, "swtpm", "swtpm_setup")
	sw, err := swtpm.Start(t.TempDir())
	must(t, err)
	t.Cleanup(func() { sw.Close() })
	must(t, sw.Measure(swtpm.UEFIBoot(cmdline)...))
	conn, err := sw.Open()
	must(t, err)
	tpm, err := gattest.OpenTPM(&gattest.OpenConfig{CommandChannel: conn})
	must(t, err)
	t.Cleanup(func() { tpm.Close() })
	eks, err := tpm.EKs()
	must(t, err)
	ak, err := tpm.NewAK(nil)
	must(t, err)
	t.Cleanup(func() { ak.Close(tpm) })
	return &tpmMachine{t: t, sw: sw, tpm: tpm, ak: ak, ek: eks[0]}
}

func (m *tpmMachine) start(id string) agentapi.AttestStart {
	pub, err := x509.MarshalPKIXPublicKey(m.ek.Public)
	must(m.t, err)
	p := m.ak.AttestationParameters()
	return agentapi.AttestStart{MachineID: id, EKPublic: pub, EKCertificate: m.ek.Certificate.Raw, TPMManufacturer: "IBM", TPMFirmware: "1.59",
		AK: agentapi.AKParameters{Public: p.Public, CreateData: p.CreateData, CreateAttestation: p.CreateAttestation, CreateSignature: p.CreateSignature}}
}

func (m *tpmMachine) answer(id string, ch agentapi.AttestChallenge) agentapi.AttestQuote {
	m.t.Helper()
	secret, err := m.ak.ActivateCredentialWithEK(m.tpm, gattest.EncryptedCredential{Credential: ch.Credential, Secret: ch.Secret}, m.ek)
	must(m.t, err)
	all, err := m.tpm.PCRs(gattest.HashSHA256)
	must(m.t, err)
	want := map[int]bool{}
	for _, i := range ch.PCRs {
		want[i] = true
	}
	q := agentapi.AttestQuote{MachineID: id, NonceID: ch.NonceID, Activated: secret, EventLog: m.sw.EventLog()}
	for _, p := range all {
		if want[p.Index] {
			q.PCRs = append(q.PCRs, agentapi.PCRValue{Index: p.Index, SHA256: p.Digest})
		}
	}
	qt, err := m.ak.QuotePCRs(m.tpm, ch.Nonce, gattest.HashSHA256, ch.PCRs)
	must(m.t, err)
	q.Quote, q.Signature = qt.Quote, qt.Signature
	return q
}

// buildingMachine makes an available machine of model vendor/product,
// claims it (join data and CA are its credentials) and has its agent pass
// check: the build waits at attest. It returns the machine and its task.
func buildingMachine(t *testing.T, h *harness, n int, vendor, product string) (store.Machine, agentapi.Task) {
	t.Helper()
	mac := fmt.Sprintf("52:54:00:00:16:%02x", n)
	m, err := h.st.PutMachine(bg, store.Machine{Name: fmt.Sprintf("att-%d", n), Intended: store.Hardware{Vendor: vendor, Model: product,
		NICs: []store.NIC{{Name: "eth0", MAC: mac}}}}, store.W{Actor: "test"})
	must(t, err)
	_, err = h.c.AgentRegister(bg, m.ID, agentapi.Registration{MachineID: m.ID, Inventory: inventory(m)})
	must(t, err)
	h.mustState(m.ID, store.StateAvailable)
	img := h.image(fmt.Sprintf("img-%d.raw", n))
	_, err = h.c.Provision(bg, m.ID, store.Claim{Image: img.ID, JoinData: "kubeadm join --token SECRET", CABundle: "CA-PEM"}, store.W{Actor: "capi"})
	must(t, err)
	task, err := h.c.AgentTask(bg, m.ID)
	must(t, err)
	must(t, h.c.AgentReport(bg, m.ID, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateStarted, Attempt: task.Attempt}))
	must(t, h.c.AgentReport(bg, m.ID, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateSucceeded, Attempt: task.Attempt}))
	return h.get(m.ID), task
}

func (h *harness) attest(m store.Machine, tm *tpmMachine) agentapi.AttestResult {
	h.t.Helper()
	ch, err := h.c.AttestStart(bg, m.ID, tm.start(m.ID))
	must(h.t, err)
	if ch.Result != nil {
		return *ch.Result
	}
	res, err := h.c.AttestQuote(bg, m.ID, tm.answer(m.ID, ch))
	must(h.t, err)
	return res
}

func TestAttestationGate(t *testing.T) {
	h := newHarness(t, newStore(t), func(c *Config) {
		c.Attest.Models = map[string]AttestPolicy{
			attestModel:  {Require: true},
			"Acme/NoTPM": {Require: true, NoTPM: NoTPMAllow},
			"Acme/Old":   {Require: true},
		}
	})
	const cmdline = "console=ttyS0 kiln.url=http://10.99.0.1:8080"

	// The reference machine: the task carries no credentials, the gate is closed,
	// and its first attestation is refused for want of an approved state.
	ref, task := buildingMachine(t, h, 1, "QEMU", "Standard PC (Q35 + ICH9, 2009)")
	if !task.Attest || task.Stage == nil || task.Stage.JoinData != "" || task.Stage.CABundle != "" {
		t.Fatalf("task of an attesting model: attest %v stage %+v", task.Attest, task.Stage)
	}
	if err := h.c.CredentialGate(ref); err == nil {
		t.Fatal("gate open before any attestation")
	}
	refTPM := newTPMMachine(t, cmdline)
	t0 := time.Now()
	res := h.attest(ref, refTPM)
	t.Logf("attestation round trip (start, activation, quote, verify, record) %v", time.Since(t0).Round(time.Millisecond))
	if res.Result != store.AttestResultFailed || res.Reason != store.AttestReasonNoApprovedState || res.Credentials != nil {
		t.Fatalf("reference's first attestation: %+v", res)
	}
	m := h.mustState(ref.ID, store.StateQuarantined)
	if m.Reason != ReasonAttestationFailed || m.Attestation == nil || len(m.Attestation.PCRs) != 9 || len(m.Attestation.Events) == 0 ||
		m.Attestation.EKSHA256 == "" || m.Attestation.Challenge != nil {
		t.Fatalf("quarantined reference: reason %q attestation %+v", m.Reason, m.Attestation)
	}

	// Learn (proposed), approve (audited): several at once.
	st, err := h.c.LearnAttestState(bg, ref.ID, "ovmf-2022.11", false, "token:alice")
	must(t, err)
	if st.Status != store.AttestStateProposed || st.Model != attestModel || st.Source != ref.ID {
		t.Fatalf("learned %+v", st)
	}
	if _, err := h.c.SetAttestStates(bg, []string{st.ID}, store.AttestStateApproved, "token:root"); err != nil {
		t.Fatal(err)
	}
	var approved bool
	for _, ev := range allEvents(t, h.st.(*store.Store)) {
		if ev.Subject == "attest_state/"+st.ID && ev.Kind == "attest_state_approved" && ev.Actor == "token:root" && ev.From == "proposed" {
			approved = true
		}
	}
	if !approved {
		t.Fatal("no audited attest_state_approved event")
	}

	t.Run("a machine of the model passes and gets its credentials", func(t *testing.T) {
		m, _ := buildingMachine(t, h, 2, "QEMU", "Standard PC (Q35 + ICH9, 2009)")
		tm := newTPMMachine(t, cmdline)
		ch, err := h.c.AttestStart(bg, m.ID, tm.start(m.ID))
		must(t, err)
		q := tm.answer(m.ID, ch)
		res, err := h.c.AttestQuote(bg, m.ID, q)
		must(t, err)
		if res.Result != store.AttestResultPassed || res.State != st.ID || res.Credentials == nil ||
			res.Credentials.JoinData != "kubeadm join --token SECRET" || res.Credentials.CABundle != "CA-PEM" {
			t.Fatalf("pass: %+v", res)
		}
		got := h.mustState(m.ID, store.StateProvisioning)
		if err := h.c.CredentialGate(got); err != nil || got.Labels[LabelAttestation] != "passed" || !got.Attestation.Valid {
			t.Fatalf("after pass: gate %v labels %v", err, got.Labels)
		}
		// A pass records no events of its own (its state holds them), only
		// their count; learning from it takes the state's.
		if a := got.Attestation; len(a.Events) != 0 || a.EventCount != len(st.Events) || len(a.PCRs) != 9 || a.State != st.ID {
			t.Fatalf("passed record: %d events (count %d), %d PCRs, state %s; want 0 (count %d), 9, %s",
				len(a.Events), a.EventCount, len(a.PCRs), a.State, len(st.Events), st.ID)
		}
		again2, err := h.c.LearnAttestState(bg, m.ID, "from a pass", false, "token:alice")
		must(t, err)
		if len(again2.Events) != len(st.Events) || len(again2.PCRs) != len(st.PCRs) {
			t.Fatalf("learned from a pass: %d events, %d PCRs; want %d, %d", len(again2.Events), len(again2.PCRs), len(st.Events), len(st.PCRs))
		}
		// The same quote again (a retry after a lost answer): the same verdict.
		again, err := h.c.AttestQuote(bg, m.ID, q)
		if err != nil || again.Result != store.AttestResultPassed {
			t.Fatalf("retried quote: %+v %v", again, err)
		}
		// The build goes on.
		must(t, h.c.AgentReport(bg, m.ID, agentapi.Report{Step: agentapi.StepAttest, State: agentapi.StateSucceeded}))
		must(t, h.c.AgentReport(bg, m.ID, agentapi.Report{Step: agentapi.StepWrite, State: agentapi.StateStarted}))
		h.mustState(m.ID, store.StateProvisioning)
	})

	t.Run("a replayed quote (old nonce) is refused", func(t *testing.T) {
		m, _ := buildingMachine(t, h, 3, "QEMU", "Standard PC (Q35 + ICH9, 2009)")
		tm := newTPMMachine(t, cmdline)
		ch1, err := h.c.AttestStart(bg, m.ID, tm.start(m.ID))
		must(t, err)
		old := tm.answer(m.ID, ch1)
		if _, err := h.c.AttestStart(bg, m.ID, tm.start(m.ID)); err != nil { // a new challenge: ch1 is gone
			t.Fatal(err)
		}
		res, err := h.c.AttestQuote(bg, m.ID, old)
		must(t, err)
		got := h.mustState(m.ID, store.StateQuarantined)
		if res.Result != store.AttestResultFailed || res.Reason != store.AttestReasonNonce || res.Credentials != nil ||
			got.Reason != ReasonAttestationFailed {
			t.Fatalf("replay: %+v; machine %s %q", res, got.Reason, got.Message)
		}
		t.Logf("replay refused: %s", got.Message)
	})

	t.Run("a changed kernel command line is quarantined naming PCR 9", func(t *testing.T) {
		m, _ := buildingMachine(t, h, 4, "QEMU", "Standard PC (Q35 + ICH9, 2009)")
		res := h.attest(m, newTPMMachine(t, cmdline+" init=/bin/sh"))
		got := h.mustState(m.ID, store.StateQuarantined)
		if res.Result != store.AttestResultFailed || res.Reason != store.AttestReasonStateMismatch || res.Credentials != nil ||
			!strings.Contains(got.Message, "PCR 9") || !strings.Contains(got.Message, "kernel command line") ||
			len(got.Attestation.Mismatches) != 1 || got.Attestation.Mismatches[0].PCR != 9 {
			t.Fatalf("changed chain: %+v; machine %q %+v", res, got.Message, got.Attestation.Mismatches)
		}
		if err := h.c.CredentialGate(got); err == nil {
			t.Fatal("gate open for a refused machine")
		}
		t.Logf("machine message: %s", got.Message)
	})

	t.Run("an agent that skips attest is stopped before write", func(t *testing.T) {
		m, _ := buildingMachine(t, h, 5, "QEMU", "Standard PC (Q35 + ICH9, 2009)")
		must(t, h.c.AgentReport(bg, m.ID, agentapi.Report{Step: agentapi.StepWrite, State: agentapi.StateStarted}))
		got := h.mustState(m.ID, store.StateFailed)
		if got.Reason != ReasonAttestationFailed {
			t.Fatalf("reason %q %q", got.Reason, got.Message)
		}
	})

	t.Run("no TPM: the model's policy", func(t *testing.T) {
		m, _ := buildingMachine(t, h, 6, "Acme", "NoTPM")
		ch, err := h.c.AttestStart(bg, m.ID, agentapi.AttestStart{MachineID: m.ID, NoTPM: true, NoTPMReason: "no /sys/class/tpm"})
		must(t, err)
		got := h.mustState(m.ID, store.StateProvisioning)
		if ch.Result == nil || ch.Result.Result != store.AttestResultNoTPMAllow || ch.Result.Credentials == nil ||
			got.Labels[LabelAttestation] != "no-tpm" || h.c.CredentialGate(got) != nil {
			t.Fatalf("allowed no-TPM: %+v labels %v", ch.Result, got.Labels)
		}
		m, _ = buildingMachine(t, h, 7, "Acme", "Old")
		ch, err = h.c.AttestStart(bg, m.ID, agentapi.AttestStart{MachineID: m.ID, NoTPM: true, NoTPMReason: "no /sys/class/tpm"})
		must(t, err)
		got = h.mustState(m.ID, store.StateQuarantined)
		if ch.Result == nil || ch.Result.Reason != store.AttestReasonNoTPM || got.Reason != ReasonAttestationFailed {
			t.Fatalf("refused no-TPM: %+v machine %q", ch.Result, got.Reason)
		}
	})

	t.Run("a model that does not attest keeps the old task", func(t *testing.T) {
		m, task := buildingMachine(t, h, 8, "Other", "Box")
		if task.Attest || task.Stage.JoinData == "" || h.c.CredentialGate(h.get(m.ID)) != nil {
			t.Fatalf("non-attesting model: attest %v stage %+v", task.Attest, task.Stage)
		}
	})
}
