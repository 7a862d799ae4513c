package store

// AttestationRecord is a machine's last TPM attestation result (issue 16). It is one of the round-3 machine fields
// (records_v4.go): written by put_machines_v4 (30) and agent_report_v2
// (31) only.
type AttestationRecord struct{}
