package store

// Round 3 machine fields (issues 15, 16, 17) and the table of
// put_machines_v4 (command 30) and agent_report_v2 (command 31).
//
// Each issue owns its record type in its own file: BuildRecord
// (build_record.go, issue 15), AttestationRecord (attest_record.go, issue
// 16), BurnInRecord (burnin_record.go) and FirmwareRecord
// (firmware_record.go, issue 17). The rule that keeps them across the older
// machine commands is here, once.

// transitionsV4 is the table of put_machines_v4 (command 30) and
// agent_report_v2 (31): transitionsV3, plus what round 3 adds (each
// addition names its issue). It never changes once written: a later rule
// gets a new command.
var transitionsV4 = map[MachineState][]MachineState{
	StateDiscovered:   {StateRegistered, StateInspecting, StateRetired},
	StateRegistered:   {StateInspecting, StateRetired},
	StateInspecting:   {StateAvailable, StateQuarantined, StateFailed, StateErasing, StateRMA},
	StateAvailable:    {StateProvisioning, StateInspecting, StateErasing, StateRetired, StateRMA},
	StateProvisioning: {StateProvisioned, StateFailed, StateErasing, StateRMA},
	StateProvisioned:  {StateErasing, StateFailed, StateRemediating, StateRMA},
	StateFailed:       {StateInspecting, StateErasing, StateRetired, StateRemediating, StateRMA},
	StateQuarantined:  {StateInspecting, StateErasing, StateRetired, StateRMA},
	StateErasing:      {StateAvailable, StateInspecting, StateRetired, StateFailed, StateRMA},
	StateRemediating:  {StateProvisioned, StateInspecting, StateErasing, StateRMA, StateFailed},
	StateRMA:          {StateInspecting, StateErasing, StateRetired},
	StateRetired:      {},
}

// UsesV4 reports whether m needs put_machines_v4: it holds a round-3 field
// (or a claim with a cluster block, issue 15).
func (m *Machine) UsesV4() bool {
	return m.Build != nil || m.Attestation != nil || m.BurnIn != nil || m.Firmware != nil ||
		(m.Claim != nil && m.Claim.Cluster != nil) || usesInspection(&m.Intended) ||
		(m.Discovered != nil && usesInspection(m.Discovered))
}

func usesInspection(h *Hardware) bool { return len(h.PCI) > 0 || len(h.CPUFlags) > 0 || h.TPM != nil }

// keepV4Fields is the rule of the machine commands before round 3: the
// round-3 fields are what the stored record holds (old; nil on create),
// whatever the command carries, as on a node that does not know them.
func keepV4Fields(m, old *Machine) {
	if old == nil {
		old = &Machine{}
	}
	m.Build, m.Attestation, m.BurnIn, m.Firmware = old.Build, old.Attestation, old.BurnIn, old.Firmware
	if m.Claim != nil {
		// Issue 15: the claim's cluster block.
		var cl *ClusterSpec
		if old.Claim != nil {
			cl = old.Claim.Cluster
		}
		m.Claim.Cluster = cl
	}
	// Issue 15: the inspection fields layer choice reads.
	keepInspection(&m.Intended, &old.Intended)
	if m.Discovered != nil {
		if old.Discovered == nil {
			keepInspection(m.Discovered, &Hardware{})
		} else {
			keepInspection(m.Discovered, old.Discovered)
		}
	}
}

// keepInspection sets h's issue-15 inspection fields to old's.
func keepInspection(h, old *Hardware) {
	h.PCI, h.CPUFlags, h.TPM = old.PCI, old.CPUFlags, old.TPM
}
