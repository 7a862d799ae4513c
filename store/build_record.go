package store

// BuildRecord is the gated build's record (layers chosen and why, per-node layer hash, first-boot report) (issue 15). It is one of the round-3 machine fields
// (records_v4.go): written by put_machines_v4 (30) and agent_report_v2
// (31) only.
type BuildRecord struct{}
