package attest_test

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	gattest "github.com/google/go-attestation/attest"
	"github.com/google/go-tpm/legacy/tpm2"

	"kiln/api/agentapi"
	"kiln/appliance/attest"
	"kiln/deploy/lab/swtpm"
	"kiln/deploy/lab/testreq"
	"kiln/store"
)

// The host-side attestation tests (issue 16): a real software TPM (swtpm)
// measured like a firmware boot (deploy/lab/swtpm), go-attestation as the
// agent's side, and this package as Kiln's.

// machine is one swtpm-backed "machine": its TPM, measured with a boot
// whose kernel command line is cmdline.
type machine struct {
	t   *testing.T
	sw  *swtpm.TPM
	tpm *gattest.TPM
	ak  *gattest.AK
	ek  gattest.EK
}

func newMachine(t *testing.T, cmdline string) *machine {
	t.Helper()
	testreq.Commands(t, "swtpm", "swtpm_setup")
	sw, err := swtpm.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sw.Close() })
	if err := sw.Measure(swtpm.UEFIBoot(cmdline)...); err != nil {
		t.Fatal(err)
	}
	conn, err := sw.Open()
	if err != nil {
		t.Fatal(err)
	}
	tpm, err := gattest.OpenTPM(&gattest.OpenConfig{CommandChannel: conn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tpm.Close() })
	eks, err := tpm.EKs()
	if err != nil || len(eks) == 0 {
		t.Fatalf("EKs: %v %d", err, len(eks))
	}
	if eks[0].Certificate == nil {
		t.Fatal("swtpm_setup --create-ek-cert gave no EK certificate")
	}
	ak, err := tpm.NewAK(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ak.Close(tpm) })
	return &machine{t: t, sw: sw, tpm: tpm, ak: ak, ek: eks[0]}
}

// start is the agent's AttestStart.
func (m *machine) start() agentapi.AttestStart {
	pub, err := x509.MarshalPKIXPublicKey(m.ek.Public)
	if err != nil {
		m.t.Fatal(err)
	}
	p := m.ak.AttestationParameters()
	return agentapi.AttestStart{MachineID: "m-1", EKPublic: pub, EKCertificate: m.ek.Certificate.Raw,
		AK: agentapi.AKParameters{Public: p.Public, CreateData: p.CreateData, CreateAttestation: p.CreateAttestation,
			CreateSignature: p.CreateSignature}}
}

// answer is the agent's AttestQuote for challenge ch.
func (m *machine) answer(ch agentapi.AttestChallenge) agentapi.AttestQuote {
	m.t.Helper()
	secret, err := m.ak.ActivateCredentialWithEK(m.tpm, gattest.EncryptedCredential{Credential: ch.Credential, Secret: ch.Secret}, m.ek)
	if err != nil {
		m.t.Fatalf("activate: %v", err)
	}
	return m.quote(ch, secret)
}

func (m *machine) quote(ch agentapi.AttestChallenge, secret []byte) agentapi.AttestQuote {
	m.t.Helper()
	all, err := m.tpm.PCRs(gattest.HashSHA256)
	if err != nil {
		m.t.Fatal(err)
	}
	want := map[int]bool{}
	for _, i := range ch.PCRs {
		want[i] = true
	}
	q := agentapi.AttestQuote{MachineID: "m-1", NonceID: ch.NonceID, Activated: secret}
	for _, p := range all {
		if want[p.Index] {
			q.PCRs = append(q.PCRs, agentapi.PCRValue{Index: p.Index, SHA256: p.Digest})
		}
	}
	qt, err := m.ak.QuotePCRs(m.tpm, ch.Nonce, gattest.HashSHA256, ch.PCRs)
	if err != nil {
		m.t.Fatal(err)
	}
	q.Quote, q.Signature = qt.Quote, qt.Signature
	q.EventLog = m.sw.EventLog()
	return q
}

func challenge(t *testing.T, m *machine) attest.Challenge {
	t.Helper()
	ch, err := attest.NewChallenge(m.start(), attest.DefaultPCRs, attest.Trust{}, time.Now(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func wantReason(t *testing.T, err error, reason string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want refusal %s", reason)
	}
	if got := attest.ReasonOf(err); got != reason {
		t.Fatalf("refused with %q (%v); want %s", got, err, reason)
	}
	t.Logf("refused as wanted: %v", err)
}

// learn makes an approved state of ev, as `kiln attest learn` + approve do.
func learn(ev attest.Evidence) store.AttestState {
	return store.AttestState{Meta: store.Meta{ID: "as-ref"}, Model: "QEMU/Standard PC", Status: store.AttestStateApproved,
		PCRs: ev.PCRs, Events: ev.Events}
}

// TestAttestSWTPM is the whole exchange against a real TPM: pass, then
// every refusal the verifier owes.
func TestAttestSWTPM(t *testing.T) {
	ref := newMachine(t, "console=ttyS0 kiln.url=http://10.0.0.1:8080")
	t0 := time.Now()
	ch := challenge(t, ref)
	q := ref.answer(ch.Wire)
	ev, err := attest.Verify(ch.Pending, q, time.Now())
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	t.Logf("full exchange (challenge, activation, quote, verify) in %v; %d PCRs, %d events, log %d bytes",
		time.Since(t0).Round(time.Millisecond), len(ev.PCRs), len(ev.Events), len(q.EventLog))
	if len(ev.PCRs) != len(attest.DefaultPCRs) || len(ev.Events) != 15 {
		t.Fatalf("evidence %d PCRs %d events", len(ev.PCRs), len(ev.Events))
	}
	states := []store.AttestState{learn(ev)}
	if mt := attest.Compare(ev, states); mt.State == nil || mt.State.ID != "as-ref" {
		t.Fatalf("the reference's own evidence does not match its state: %+v", mt)
	}
	// A proposed (not yet approved) state matches nothing.
	prop := learn(ev)
	prop.Status = store.AttestStateProposed
	if mt := attest.Compare(ev, []store.AttestState{prop}); mt.State != nil {
		t.Fatal("a proposed state matched")
	}

	t.Run("pass on another machine of the same model", func(t *testing.T) {
		m := newMachine(t, "console=ttyS0 kiln.url=http://10.0.0.1:8080")
		ch := challenge(t, m)
		ev2, err := attest.Verify(ch.Pending, m.answer(ch.Wire), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if mt := attest.Compare(ev2, states); mt.State == nil {
			t.Fatalf("identical boot on another TPM does not match: %s", attest.Summary(mt.Mismatches))
		}
	})

	t.Run("replayed quote with an old nonce", func(t *testing.T) {
		ch2 := challenge(t, ref) // the next challenge replaces the spent one
		_, err := attest.Verify(ch2.Pending, q, time.Now())
		wantReason(t, err, store.AttestReasonNonce)
		// The old quote under the new challenge's ID: its nonce is not the new one.
		old := q
		old.NonceID = ch2.Pending.NonceID
		old.Activated = ref.answer(ch2.Wire).Activated
		_, err = attest.Verify(ch2.Pending, old, time.Now())
		wantReason(t, err, store.AttestReasonNonce)
	})

	t.Run("expired challenge", func(t *testing.T) {
		ch := challenge(t, ref)
		_, err := attest.Verify(ch.Pending, ref.answer(ch.Wire), time.Now().Add(2*time.Minute))
		wantReason(t, err, store.AttestReasonNonce)
	})

	t.Run("AK of another TPM", func(t *testing.T) {
		other := newMachine(t, "console=ttyS0 kiln.url=http://10.0.0.1:8080")
		st := ref.start() // ref's EK ...
		p := other.ak.AttestationParameters()
		st.AK = agentapi.AKParameters{Public: p.Public, CreateData: p.CreateData, CreateAttestation: p.CreateAttestation, CreateSignature: p.CreateSignature}
		ch, err := attest.NewChallenge(st, attest.DefaultPCRs, attest.Trust{}, time.Now(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		// ... so neither TPM can open the credential for that AK.
		if _, err := other.ak.ActivateCredentialWithEK(other.tpm, gattest.EncryptedCredential{Credential: ch.Wire.Credential, Secret: ch.Wire.Secret}, other.ek); err == nil {
			t.Fatal("the other TPM opened a credential made for ref's EK")
		}
		if _, err := ref.ak.ActivateCredentialWithEK(ref.tpm, gattest.EncryptedCredential{Credential: ch.Wire.Credential, Secret: ch.Wire.Secret}, ref.ek); err == nil {
			t.Fatal("ref's TPM opened a credential made for another TPM's AK")
		}
		guess := make([]byte, 32)
		_, _ = rand.Read(guess)
		_, err = attest.Verify(ch.Pending, other.quote(ch.Wire, guess), time.Now())
		wantReason(t, err, store.AttestReasonAKNotCertified)
	})

	t.Run("quote signed by a software key", func(t *testing.T) {
		ch := challenge(t, ref)
		good := ref.answer(ch.Wire)
		soft, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		d := sha256.Sum256(good.Quote)
		sig, err := rsa.SignPKCS1v15(rand.Reader, soft, crypto.SHA256, d[:])
		if err != nil {
			t.Fatal(err)
		}
		enc, err := tpm2.Signature{Alg: tpm2.AlgRSASSA, RSA: &tpm2.SignatureRSA{HashAlg: tpm2.AlgSHA256, Signature: sig}}.Encode()
		if err != nil {
			t.Fatal(err)
		}
		forged := good
		forged.Signature = enc
		_, err = attest.Verify(ch.Pending, forged, time.Now())
		wantReason(t, err, store.AttestReasonQuoteInvalid)
		// PCR values that are not the quoted ones.
		lied := good
		lied.PCRs = append([]agentapi.PCRValue(nil), good.PCRs...)
		lied.PCRs[0].SHA256 = make([]byte, 32)
		_, err = attest.Verify(ch.Pending, lied, time.Now())
		wantReason(t, err, store.AttestReasonQuoteInvalid)
	})

	t.Run("event log that does not replay", func(t *testing.T) {
		ch := challenge(t, ref)
		q := ref.answer(ch.Wire)
		// The log of another command line: PCR 9's events do not extend to the quoted PCR 9.
		lie := swtpm.SpecIDEvent()
		for _, e := range swtpm.UEFIBoot("console=ttyS0") {
			d := e.Digest
			if d == nil {
				s := sha256.Sum256(e.Data)
				d = s[:]
			}
			lie = append(lie, swtpm.LogEvent(e.PCR, e.Type, d, e.Data)...)
		}
		q.EventLog = lie
		_, err := attest.Verify(ch.Pending, q, time.Now())
		wantReason(t, err, store.AttestReasonEventLog)
		if !strings.Contains(err.Error(), "PCR 9") {
			t.Fatalf("refusal does not name PCR 9: %v", err)
		}
		// A log with the PCR 9 events left out.
		q.EventLog = swtpm.SpecIDEvent()
		for _, e := range swtpm.UEFIBoot("console=ttyS0 kiln.url=http://10.0.0.1:8080") {
			if e.PCR == 9 {
				continue
			}
			d := e.Digest
			if d == nil {
				s := sha256.Sum256(e.Data)
				d = s[:]
			}
			q.EventLog = append(q.EventLog, swtpm.LogEvent(e.PCR, e.Type, d, e.Data)...)
		}
		_, err = attest.Verify(ch.Pending, q, time.Now())
		wantReason(t, err, store.AttestReasonEventLog)
	})

	t.Run("per-boot arguments are masked; another argument is named", func(t *testing.T) {
		// Kiln's per-boot token and the machine ID differ every boot: with the
		// agent's /proc/cmdline, proven by PCR 9's LoadOptions digest, they are
		// masked and the rest of the command line is compared as text.
		refCL := "console=ttyS0 kiln.url=http://10.0.0.1:8080 kiln.machine=m-a kiln.token=AAAA"
		r := newMachine(t, refCL)
		ch := challenge(t, r)
		q := r.answer(ch.Wire)
		q.Cmdline = refCL
		rev, err := attest.Verify(ch.Pending, q, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		var text string
		for _, e := range rev.Events {
			if e.PCR == 9 && e.Text != "" {
				text = e.Text
			}
		}
		if text != "console=ttyS0 kiln.url=* kiln.machine=* kiln.token=*" || strings.Contains(text, "AAAA") {
			t.Fatalf("masked command line %q", text)
		}
		st := []store.AttestState{learn(rev)}
		other := "console=ttyS0 kiln.url=http://10.0.0.2:8080 kiln.machine=m-b kiln.token=BBBB"
		m := newMachine(t, other)
		ch = challenge(t, m)
		q = m.answer(ch.Wire)
		q.Cmdline = other
		ev2, err := attest.Verify(ch.Pending, q, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if mt := attest.Compare(ev2, st); mt.State == nil {
			t.Fatalf("another token and machine do not match: %s", attest.Summary(mt.Mismatches))
		}
		// A /proc/cmdline that is not what was measured is not believed.
		ch = challenge(t, m)
		q = m.answer(ch.Wire)
		q.Cmdline = refCL
		ev3, err := attest.Verify(ch.Pending, q, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ev3.Events {
			if e.Text != "" {
				t.Fatalf("an unproven command line was taken: %+v", e)
			}
		}
		extra := other + " init=/bin/sh"
		x := newMachine(t, extra)
		ch = challenge(t, x)
		q = x.answer(ch.Wire)
		q.Cmdline = extra
		ev4, err := attest.Verify(ch.Pending, q, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		mt := attest.Compare(ev4, st)
		sum := attest.Summary(mt.Mismatches)
		t.Logf("mismatch: %s", sum)
		if mt.State != nil || !strings.Contains(sum, "PCR 9") || !strings.Contains(sum, "arguments +init=/bin/sh") || strings.Contains(sum, "BBBB") {
			t.Fatalf("extra argument: %s", sum)
		}
	})

	t.Run("changed kernel command line is a mismatch naming PCR 9", func(t *testing.T) {
		m := newMachine(t, "console=ttyS0 kiln.url=http://10.0.0.1:8080 init=/bin/sh")
		ch := challenge(t, m)
		ev2, err := attest.Verify(ch.Pending, m.answer(ch.Wire), time.Now())
		if err != nil {
			t.Fatalf("a changed but honest boot must verify (and then mismatch): %v", err)
		}
		mt := attest.Compare(ev2, states)
		if mt.State != nil || len(mt.Mismatches) != 1 {
			t.Fatalf("match %+v", mt)
		}
		mm := mt.Mismatches[0]
		sum := attest.Summary(mt.Mismatches)
		t.Logf("mismatch: %s", sum)
		if mm.PCR != 9 || !strings.Contains(sum, "kernel command line") || !strings.Contains(sum, "event 1 EV_EVENT_TAG") {
			t.Fatalf("mismatch does not name PCR 9's kernel command line: %s", sum)
		}
	})
}
