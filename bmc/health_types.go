package bmc

import "time"

// HealthState is a health value as Redfish reports it (DSP0268 Resource.Health enum):
// "OK", "Warning", "Critical", or "" when the BMC does not say (unknown, never OK).
type HealthState string

// Health states (Redfish Resource.Health).
const (
	HealthOK       HealthState = "OK"       // normal
	HealthWarning  HealthState = "Warning"  // a condition requires attention
	HealthCritical HealthState = "Critical" // a critical condition requires immediate attention
	HealthUnknown  HealthState = ""         // not reported
)

// Health is what a BMC reports about its machine's health (Controller.Health).
type Health struct {
	// System is the ComputerSystem's health: the worse of Redfish Status.Health and
	// Status.HealthRollup; over IPMI, from sensors in a critical state and unresolved
	// critical SEL assertions.
	System HealthState
	// Chassis is the Chassis' health (Redfish Chassis Status.Health/HealthRollup);
	// HealthUnknown when the BMC has no chassis health (IPMI).
	Chassis HealthState
	// Events are recent Warning and Critical entries, newest first.
	Events []HealthEvent
}

// HealthEvent is one health-relevant entry a BMC reported.
type HealthEvent struct {
	Time     time.Time   // when the BMC recorded it (zero if the BMC gave no time)
	Source   string      // "sel" (IPMI SEL), "sensor" (IPMI SDR reading) or "redfish" (LogEntry)
	Severity HealthState // HealthWarning or HealthCritical
	Message  string      // the BMC's text, e.g. "Processor CPU1 IERR Asserted"
	ID       string      // the BMC's entry ID (SEL record ID, LogEntry Id, sensor name)
}
