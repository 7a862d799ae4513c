package store

// FirmwareRecord is a machine's firmware inventory, BIOS attributes and drift from its model's baseline (issue 17). It is one of the round-3 machine fields
// (records_v4.go): written by put_machines_v4 (30) and agent_report_v2
// (31) only.
type FirmwareRecord struct{}
