package store

// BurnInRecord is a machine's last burn-in result (issue 17). It is one of the round-3 machine fields
// (records_v4.go): written by put_machines_v4 (30) and agent_report_v2
// (31) only.
type BurnInRecord struct{}
