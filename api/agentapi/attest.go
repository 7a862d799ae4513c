package agentapi

// Attestation (issue 16): the agent's attest step, between check and write.
// Two requests, both with the per-boot token:
//
//	POST {url}/v1/agent/attest/start  AttestStart     → AttestChallenge
//	POST {url}/v1/agent/attest/quote  AttestQuote     → AttestResult
//
// start sends the TPM's endorsement key (certificate, or its public key)
// and a fresh attestation key's creation parameters; Kiln answers with a
// credential-activation challenge (only the TPM holding that EK can open
// it, and only for an AK it created: a software key cannot stand in) and a
// fresh nonce. quote sends the opened secret, a quote over the boot PCRs
// bound to the nonce, the quoted PCR values and the firmware's event log.
// The challenge lives in the machine's record (replicated): any node of the
// site cluster may answer the quote, and the nonce is spent by the result.
// A machine without a TPM sends AttestStart with NoTPM set; the answer is
// then the result itself (the hardware model's policy).

// AttestStart opens an attestation.
type AttestStart struct {
	MachineID string `json:"machine_id"`
	// NoTPM: the agent found no TPM 2.0 (NoTPMReason says what it saw); the
	// other fields are empty.
	NoTPM       bool   `json:"no_tpm,omitempty"`
	NoTPMReason string `json:"no_tpm_reason,omitempty"`
	// TPM describes the device (manufacturer, firmware version).
	TPMManufacturer string `json:"tpm_manufacturer,omitempty"`
	TPMFirmware     string `json:"tpm_firmware,omitempty"`
	// EKCertificate is the EK certificate (DER) when the TPM holds one;
	// EKPublic the EK's public key (PKIX DER), always set.
	EKCertificate []byte `json:"ek_certificate,omitempty"`
	EKPublic      []byte `json:"ek_public,omitempty"`
	// AK is the attestation key's creation data (go-attestation's
	// AttestationParameters: TPMT_PUBLIC, TPMS_CREATION_DATA, TPMS_ATTEST
	// and its TPMT_SIGNATURE).
	AK AKParameters `json:"ak"`
}

// AKParameters are an attestation key's TPM 2.0 structures.
type AKParameters struct {
	Public            []byte `json:"public"`
	CreateData        []byte `json:"create_data"`
	CreateAttestation []byte `json:"create_attestation"`
	CreateSignature   []byte `json:"create_signature"`
}

// AttestChallenge is Kiln's answer to AttestStart: the activation
// challenge (TPM2_MakeCredential output for the AK's name under the EK) and
// the quote's nonce. NonceID names the challenge in AttestQuote. PCRs are
// the PCR indices the quote must cover (SHA-256 bank). Result is set
// instead when no quote follows (no TPM: the model's policy decided).
type AttestChallenge struct {
	NonceID    string        `json:"nonce_id,omitempty"`
	Nonce      []byte        `json:"nonce,omitempty"`
	Credential []byte        `json:"credential,omitempty"`
	Secret     []byte        `json:"secret,omitempty"`
	PCRs       []int         `json:"pcrs,omitempty"`
	Result     *AttestResult `json:"result,omitempty"`
}

// AttestQuote answers the challenge.
type AttestQuote struct {
	MachineID string `json:"machine_id"`
	NonceID   string `json:"nonce_id"`
	// Activated is the secret ActivateCredential returned.
	Activated []byte `json:"activated"`
	// Quote is the TPMS_ATTEST the AK signed, Signature its TPMT_SIGNATURE.
	Quote     []byte `json:"quote"`
	Signature []byte `json:"signature"`
	// PCRs are the quoted PCR values (SHA-256 bank).
	PCRs []PCRValue `json:"pcrs"`
	// EventLog is /sys/kernel/security/tpm0/binary_bios_measurements.
	EventLog []byte `json:"event_log"`
	// Cmdline is /proc/cmdline: Kiln checks it against the kernel command
	// line's measurement (PCR 9) and compares its text with Kiln's own
	// per-boot arguments masked (the boot token differs every boot).
	Cmdline string `json:"cmdline,omitempty"`
}

// PCRValue is one PCR's value.
type PCRValue struct {
	Index  int    `json:"index"`
	SHA256 []byte `json:"sha256"`
}

// Attestation results (AttestResult.Result, store.AttestationRecord.Result).
const (
	AttestPassed      = "passed"       // the quote verified and matched an approved state
	AttestFailed      = "failed"       // refused: Reason and Mismatches say why
	AttestNoTPMAllows = "no_tpm_allow" // no TPM; the model's policy allows it (the machine is labelled)
)

// AttestResult is Kiln's verdict. Reason is the closed attestation reason
// (store.Attest* constants, e.g. "state_mismatch"); Message names what
// differed ("PCR 9 (kernel, initrd, command line): event 3
// EV_EVENT_TAG ..."); Attempt the build attempt it counts for.
type AttestResult struct {
	Result  string `json:"result"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	State   string `json:"state,omitempty"`
	// Credentials are the claim's secrets for the stage step, handed only
	// with a pass (the credential gate); the provision task of a machine
	// that must attest carries none.
	Credentials *StageCredentials `json:"credentials,omitempty"`
}

// StageCredentials are the StageData fields held back until the
// attestation passes.
type StageCredentials struct {
	JoinData string `json:"join_data,omitempty"`
	CABundle string `json:"ca_bundle,omitempty"`
}
