package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-attestation/attest"

	"kiln/api/agentapi"
)

// The attest step (issue 16; cmd/kiln-agent/DESIGN.md "Attestation"): the
// TPM proves the measured boot before anything is written. The agent
// opens the TPM (the kernel's resource manager /dev/tpmrm0, else
// /dev/tpm0), creates an attestation key (AK) in it — new every boot, the
// in-RAM environment keeps nothing — and sends the EK (certificate and
// public key) with the AK's creation parameters. Kiln answers a
// credential-activation challenge that only this TPM can open for this AK
// (TPM2_ActivateCredential: the AK is a restricted signing key of the TPM
// that holds the EK, so no software key can stand in) and a fresh nonce;
// the agent quotes the boot PCRs over the nonce and sends the quote, the
// PCR values and the firmware's event log. Kiln's verdict ends the step:
// passed, or failed with reason attestation_failed naming what differed.

// EventLogPath is the firmware's TCG event log as the kernel exposes it.
const EventLogPath = "/sys/kernel/security/tpm0/binary_bios_measurements"

// ErrNoTPM: no TPM 2.0 is visible (the step reports it; Kiln applies the
// hardware model's policy).
var ErrNoTPM = errors.New("no TPM 2.0")

// OpenTPM opens the machine's TPM through go-attestation (its Linux probe:
// /sys/class/tpm, the resource manager when the kernel has one). A TPM 1.2
// or none is ErrNoTPM.
func OpenTPM() (*attest.TPM, error) {
	if _, err := os.Stat("/sys/class/tpm/tpm0"); err != nil {
		return nil, fmt.Errorf("%w: /sys/class/tpm/tpm0: %v", ErrNoTPM, err)
	}
	// The firmware event log is in securityfs, which the environment's
	// init does not mount.
	if _, err := os.Stat(EventLogPath); err != nil {
		_ = syscall.Mount("securityfs", "/sys/kernel/security", "securityfs", 0, "")
	}
	t, err := attest.OpenTPM(nil)
	if errors.Is(err, attest.ErrTPMNotAvailable) {
		return nil, fmt.Errorf("%w: %v", ErrNoTPM, err)
	}
	return t, err
}

func (a *Agent) openTPM() (*attest.TPM, error) {
	if a.cfg.OpenTPM != nil {
		return a.cfg.OpenTPM()
	}
	return OpenTPM()
}

// Attest runs the attest step's protocol (without its step reports) and
// returns the step's message and the credentials the pass releases. A refusal is a *StepError with reason
// attestation_failed; Kiln has already recorded it (and quarantined the
// machine when the measured boot differs).
func (a *Agent) Attest(ctx context.Context) (string, *agentapi.StageCredentials, error) {
	tpm, err := a.openTPM()
	if errors.Is(err, ErrNoTPM) {
		return AttestNoTPM(ctx, a.cfg.MachineID, err.Error(), a.call)
	}
	if err != nil {
		return "", nil, fail(agentapi.StepAttest, agentapi.ReasonAttestationFailed, "open TPM: %v", err)
	}
	defer tpm.Close()
	var cmdline string
	if b, err := os.ReadFile(filepath.Join(a.cfg.Root, "proc/cmdline")); err == nil {
		cmdline = strings.TrimRight(string(b), "\n")
	}
	return AttestTPM(ctx, tpm, a.cfg.MachineID, cmdline, a.call)
}

// Caller makes one agent API call: method and path under the appliance's
// URL, in sent as JSON (nil: no body), the JSON answer decoded into out
// (nil: discarded). Agent.call is one; the fleet simulator
// (deploy/lab/fleetsim) has its own.
type Caller func(ctx context.Context, method, path string, in, out any) error

// AttestNoTPM tells Kiln the machine has no TPM 2.0 (why: what the probe
// found) and returns the model's verdict: credentials when its policy
// allows such machines, else a *StepError (attestation_failed).
func AttestNoTPM(ctx context.Context, machineID, why string, call Caller) (string, *agentapi.StageCredentials, error) {
	var ch agentapi.AttestChallenge
	if err := call(ctx, http.MethodPost, "/v1/agent/attest/start", agentapi.AttestStart{
		MachineID: machineID, NoTPM: true, NoTPMReason: why}, &ch); err != nil {
		return "", nil, fmt.Errorf("attest start: %w", err)
	}
	if ch.Result == nil {
		return "", nil, fail(agentapi.StepAttest, agentapi.ReasonAttestationFailed, "no TPM and no verdict from the appliance")
	}
	if ch.Result.Result != agentapi.AttestNoTPMAllows {
		return "", nil, fail(agentapi.StepAttest, agentapi.ReasonAttestationFailed, "%s", ch.Result.Message)
	}
	return "no TPM: " + ch.Result.Message, ch.Result.Credentials, nil
}

// AttestTPM runs the exchange with an open TPM 2.0: the EK and a new AK's
// creation parameters to /v1/agent/attest/start, TPM2_ActivateCredential
// on Kiln's challenge, a SHA-256 quote of the challenge's PCRs over its
// nonce, and the quote, PCR values, the TPM's event log
// (tpm.MeasurementLog) and cmdline (the kernel command line, as in
// /proc/cmdline) to /v1/agent/attest/quote. It returns the step's message
// and the credentials of a pass; a refusal or a TPM error is a *StepError
// (attestation_failed), a call that found no appliance a plain error.
func AttestTPM(ctx context.Context, tpm *attest.TPM, machineID, cmdline string, call Caller) (string, *agentapi.StageCredentials, error) {
	start := time.Now()
	st := agentapi.AttestStart{MachineID: machineID}
	if info, err := tpm.Info(); err == nil {
		st.TPMManufacturer = info.Manufacturer.String()
		st.TPMFirmware = fmt.Sprintf("%d.%d", info.FirmwareVersionMajor, info.FirmwareVersionMinor)
	}
	eks, err := tpm.EKs()
	if err != nil || len(eks) == 0 {
		return "", nil, fail(agentapi.StepAttest, agentapi.ReasonAttestationFailed, "read endorsement key: %v", err)
	}
	ek := eks[0]
	if st.EKPublic, err = x509.MarshalPKIXPublicKey(ek.Public); err != nil {
		return "", nil, fail(agentapi.StepAttest, agentapi.ReasonAttestationFailed, "EK public key: %v", err)
	}
	if ek.Certificate != nil {
		st.EKCertificate = ek.Certificate.Raw
	}
	ak, err := tpm.NewAK(nil)
	if err != nil {
		return "", nil, fail(agentapi.StepAttest, agentapi.ReasonAttestationFailed, "create attestation key: %v", err)
	}
	defer ak.Close(tpm)
	p := ak.AttestationParameters()
	st.AK = agentapi.AKParameters{Public: p.Public, CreateData: p.CreateData,
		CreateAttestation: p.CreateAttestation, CreateSignature: p.CreateSignature}
	var ch agentapi.AttestChallenge
	if err := call(ctx, http.MethodPost, "/v1/agent/attest/start", st, &ch); err != nil {
		return "", nil, fmt.Errorf("attest start: %w", err)
	}
	if ch.Result != nil && ch.Result.Result != agentapi.AttestPassed {
		return "", nil, fail(agentapi.StepAttest, agentapi.ReasonAttestationFailed, "%s", ch.Result.Message)
	}
	secret, err := ak.ActivateCredentialWithEK(tpm, attest.EncryptedCredential{Credential: ch.Credential, Secret: ch.Secret}, ek)
	if err != nil {
		return "", nil, fail(agentapi.StepAttest, agentapi.ReasonAttestationFailed, "activate credential: %v", err)
	}
	all, err := tpm.PCRs(attest.HashSHA256)
	if err != nil {
		return "", nil, fail(agentapi.StepAttest, agentapi.ReasonAttestationFailed, "read PCRs: %v", err)
	}
	want := map[int]bool{}
	for _, i := range ch.PCRs {
		want[i] = true
	}
	q := agentapi.AttestQuote{MachineID: machineID, NonceID: ch.NonceID, Activated: secret, Cmdline: cmdline}
	for _, p := range all {
		if want[p.Index] {
			q.PCRs = append(q.PCRs, agentapi.PCRValue{Index: p.Index, SHA256: p.Digest})
		}
	}
	quote, err := ak.QuotePCRs(tpm, ch.Nonce, attest.HashSHA256, ch.PCRs)
	if err != nil {
		return "", nil, fail(agentapi.StepAttest, agentapi.ReasonAttestationFailed, "quote: %v", err)
	}
	q.Quote, q.Signature = quote.Quote, quote.Signature
	if q.EventLog, err = tpm.MeasurementLog(); err != nil {
		return "", nil, fail(agentapi.StepAttest, agentapi.ReasonAttestationFailed, "read event log: %v", err)
	}
	var res agentapi.AttestResult
	if err := call(ctx, http.MethodPost, "/v1/agent/attest/quote", q, &res); err != nil {
		return "", nil, fmt.Errorf("attest quote: %w", err)
	}
	if res.Result != agentapi.AttestPassed {
		return "", nil, fail(agentapi.StepAttest, agentapi.ReasonAttestationFailed, "%s", res.Message)
	}
	return fmt.Sprintf("passed: state %s, %d PCRs quoted, event log %d bytes, in %.2fs",
		res.State, len(q.PCRs), len(q.EventLog), time.Since(start).Seconds()), res.Credentials, nil
}
