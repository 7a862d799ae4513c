package store

import "time"

// FirmwareRecord is a machine's firmware inventory, BIOS attributes and drift from its model's baseline (issue 17). It is one of the round-3 machine fields
// (records_v4.go): written by put_machines_v4 (30) and agent_report_v2
// (31) only.
type FirmwareRecord struct {
	// ReadAt is when the BMC was last read (the leader's clock at the write).
	ReadAt time.Time `json:"read_at"`
	// Error is the last read's failure reason ("" = read): a bmc reason
	// ("unsupported" for an IPMI-only BMC, "timeout", ...). Components and
	// BIOS then hold the last successful read.
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`
	// Components are the firmware versions the BMC reports (Redfish
	// UpdateService/FirmwareInventory), by SoftwareInventory Name.
	Components []FirmwareVersion `json:"components,omitempty"`
	// BIOS is the current BIOS attributes (Redfish Systems/{id}/Bios), as text.
	BIOS map[string]string `json:"bios,omitempty"`
	// PendingBIOS is the staged BIOS attributes (the settings object).
	PendingBIOS map[string]string `json:"pending_bios,omitempty"`
	// Baseline is the ID of the baseline compared against ("" = none for the model).
	Baseline string `json:"baseline,omitempty"`
	// Drift is each difference from the baseline: Field "firmware.<component>"
	// or "bios.<attribute>", Intended the baseline's value, Discovered the
	// BMC's ("" absent). Never blocking; also shown in Machine.Diff.
	Drift []FieldDiff `json:"drift,omitempty"`
	// Apply is the last bring-to-baseline run.
	Apply *FirmwareApply `json:"apply,omitempty"`
}

// FirmwareApply is one run bringing a machine to its baseline: firmware
// components first, then BIOS attributes, each a step.
type FirmwareApply struct {
	Baseline string         `json:"baseline"`
	Started  time.Time      `json:"started"`
	Finished time.Time      `json:"finished,omitempty"`
	State    string         `json:"state"` // running, succeeded, failed, unsupported
	Steps    []FirmwareStep `json:"steps,omitempty"`
}

// FirmwareStep is one step of a FirmwareApply.
type FirmwareStep struct {
	Kind    string `json:"kind"`   // "firmware" or "bios"
	Target  string `json:"target"` // component name, or "attributes"
	From    string `json:"from,omitempty"`
	To      string `json:"to,omitempty"`
	State   string `json:"state"`            // pending, running, succeeded, skipped, failed, unsupported
	Reason  string `json:"reason,omitempty"` // bmc reason on failure
	Message string `json:"message,omitempty"`
	Task    string `json:"task,omitempty"` // the BMC task's Id
	Percent int    `json:"percent,omitempty"`
}

// FirmwareVersion is one firmware component as the BMC reports it.
type FirmwareVersion struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	ID      string `json:"id,omitempty"` // the BMC's SoftwareInventory Id
}
