package store

import "time"

// BurnInRecord is a machine's last burn-in result (issue 17): what the
// agent's step burn_in reported (appliance/lifecycle/burnin.go records it
// from agentapi.BurnInReport). It is one of the round-3 machine fields
// (records_v4.go): written by put_machines_v4 (30) and agent_report_v2
// (31) only. Passed is the verdict of the whole run; a machine whose
// burn-in policy requires one becomes available only with Passed true.
type BurnInRecord struct {
	// Policy names the policy run ("default" or a model entry "vendor/product").
	Policy string `json:"policy,omitempty"`
	Passed bool   `json:"passed"`
	// Reason is the failure's closed-enum reason (burnin_cpu_failed, ...); empty when passed.
	Reason string             `json:"reason,omitempty"`
	At     time.Time          `json:"at"` // when Kiln recorded the result
	Tests  []BurnInTestResult `json:"tests,omitempty"`
}

// BurnInTestResult is one test's result: Bytes and Iterations say how much
// was done (bytes tested; work units, pattern passes, regions or NICs up),
// Error is the first error (sanitised, truncated).
type BurnInTestResult struct {
	Name       string        `json:"name"`
	Passed     bool          `json:"passed"`
	Skipped    bool          `json:"skipped,omitempty"`
	Duration   time.Duration `json:"duration_ns"`
	Bytes      uint64        `json:"bytes,omitempty"`
	Iterations uint64        `json:"iterations,omitempty"`
	Error      string        `json:"error,omitempty"`
}
