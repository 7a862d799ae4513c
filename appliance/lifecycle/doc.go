// Package lifecycle is the machine lifecycle controller (DESIGN.md
// "Lifecycle", "The gated build"): it owns every machine state transition
// except those an operator requests through it, drives BMC jobs, decides what
// a network-booting machine boots (BootFor), answers the in-RAM agent
// (AgentRegister, AgentTask, AgentReport), enforces step deadlines and
// computes the intended-vs-discovered hardware difference under a per-field
// block/warn policy.
//
// State machine (store.CanTransition is the single legality table; the
// controller checks it before every write and the store checks it again):
//
//	registered ─(BMC: boot_pxe + power_cycle, or agent registers)─▶ inspecting
//	discovered ─(agent registers)─▶ inspecting
//	inspecting ─(diff has no blocking field)─▶ available
//	inspecting ─(blocking mismatch)─▶ quarantined
//	available ─(claim + agent asks for a task)─▶ provisioning
//	provisioning ─(finalize or reboot succeeded)─▶ provisioned      reason build_complete
//	provisioning|inspecting|erasing ─(step failed / deadline passed)─▶ failed   reason = step reason | timeout
//	provisioned ─(Release)─▶ erasing ─(erase succeeded)─▶ available
//
// Every transition is written with store.W{Actor, Reason}; the store appends
// the "transition" event. Agent step reports become "step" events and BMC
// job state changes "job" events, appended by this package.
//
// Leadership: the periodic loop (Run) — auto-inspection of registered
// machines with a BMC, deadline checks, the state gauge — and BMC jobs act
// only while the local store is the raft leader. The request methods may be
// called on any node; their writes go through the store, which forwards to
// the leader.
//
// Metrics (registry passed to New):
//
//	kiln_lifecycle_machines{state}                 gauge, machines by state
//	kiln_lifecycle_transitions_total{from,to}      transitions made by this controller
//	kiln_lifecycle_step_seconds{step,result}       histogram of agent step durations
//	kiln_lifecycle_jobs_total{kind,result}         BMC jobs finished (succeeded|failed)
package lifecycle
