// Package lifecycle is the machine lifecycle controller (top-level DESIGN.md
// "Lifecycle", "The gated build"; this directory's DESIGN.md "Transitions and
// their owners"): it owns every machine state transition except those an
// operator requests through it, drives BMC jobs, decides what a
// network-booting machine boots (BootFor), answers the in-RAM agent
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
//	provisioning ─(finalize succeeded)─▶ provisioning                reason build_complete, "build complete; rebooting to disk"
//	provisioning+build_complete ─(its next netboot: BootFor → exit to disk)─▶ provisioned   reason booted_local_disk
//	provisioning+build_complete ─(no netboot within RebootTimeout)─▶ provisioned            reason reboot_unobserved
//	  (the two rows above: plain images only; a release build, issue 15:)
//	provisioning+build_complete ─(first-boot report, matching)─▶ provisioned     reason first_boot_reported
//	provisioning+build_complete ─(report failed / not matching)─▶ failed        reason first_boot_* (DESIGN.md "Release builds")
//	provisioning+build_complete ─(no report within FirstBootTimeout)─▶ failed   reason first_boot_unreported
//	provisioning|inspecting|erasing ─(step failed / deadline passed)─▶ failed   reason = step reason | timeout
//	provisioned ─(Release)─▶ erasing ─(erase succeeded)─▶ available
//	quarantined ─(Erase)─▶ erasing ─(erase succeeded)─▶ inspecting     reason erase_complete; the running agent inspects again
//
// A provisioning machine whose Reason is build_complete has its image
// written, verified, staged and finalized; the agent then reboots it
// (top-level DESIGN.md "The gated build", step 6). It stays provisioning
// until it is seen booting its disk: the post-reboot iPXE fetch of
// /ipxe/{mac} reaches BootFor, which answers "exit to the local disk" (never
// the agent again) and records provisioned. Machines that boot their disk
// first never netboot, so the loop moves them after RebootTimeout (default 3
// min from the build's completion, Step.Deadline) instead of failing them.
// The agent's reboot report is recorded and keeps that deadline; a failed
// build step (reboot included) still fails the machine.
//
// Per-boot tokens and live agents (DESIGN.md "The boot guard", "Agent
// liveness"): BootFor never displaces a running agent. While the machine's
// agent has been heard from (register, task poll, report) within
// Controller.AgentLiveWindow = max(AgentStaleAfter, 2×AgentHeartbeat) — so a
// long write heartbeating every AgentHeartbeat stays live — BootFor issues no
// token, leaves Machine.BootTokenHash alone and returns ErrAgentActive. The
// appliance's httpboot backend passes that error on; httpboot answers any
// backend error with its wait-and-retry script (sleep, then chain /ipxe/{mac}
// again), which is exactly the wanted behaviour: a machine that really
// rebooted gets a fresh token once the agent is stale. Liveness memory is per
// node (the node whose boot URL the agent was given hears it); a node that
// neither issued nor verified the current token nor heard the agent uses the
// replicated evidence (Machine.Step written by an agent step within the
// window) and otherwise holds the boot from its first unsure request for at
// most one window, so a genuine boot is delayed, never blocked. A BMC power
// action by this node ends the agent (the hold stops at once). Machines with
// no token outstanding, machines booting their disk and the DHCP path are
// unaffected.
//
// Discovery limits: BootFor records unknown MACs (UnknownMachines=discover)
// at most DiscoverRate per second after a burst of DiscoverBurst (a token
// bucket per node) and only while fewer than MaxDiscovered machines are in
// state discovered (site-wide, counted from the store, whichever path made
// them). Over a limit BootFor answers as UnknownMachines=exit (BootLocal,
// no record). DiscoverDHCP, for unknown MACs the DHCP server saw, takes
// the same limits. Discovered records have no Name and the label
// kiln.io/discovered-by=ipxe (BootFor) or =dhcp (DiscoverDHCP, with
// kiln.io/arch and kiln.io/vendor-class; BootFor does not know the
// architecture).
//
// This package is the only writer of machine records: transitions,
// CreateMachine and UpdateIntended (the operator's intended fields, checked
// by package rules), imports, claims, discovery and the BMC inventory read
// after EnrollBMC. Service is the domain as the REST API sees it.
//
// Every transition is written with store.W{Actor, Reason}; the store appends
// the "transition" event. An agent step report becomes a "step" event,
// stored in the same store command as the machine's write
// (store.Store.ReportAgent); BMC job state changes are "job" events.
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
//	kiln_lifecycle_discoveries_dropped_total{reason} unknown MACs not recorded (rate|cap)
//	kiln_lifecycle_boots_held_total{reason}        netboots answered ErrAgentActive (agent_active|unknown|raced)
//	kiln_remediation_brake_engaged{scope}          gauge 0/1: the remediation brake is engaged for site|rack|claim
//	kiln_spares_available{class}                   gauge, spare machines per hardware class (label kiln.io/class)
//	kiln_spares_low_threshold{class}               gauge, the spare count at or below which spares are low
//	kiln_remediations_total{step,result}           ladder steps finished (power_cycle|reinspect|reprovision|erase|drain|spare)
//	kiln_health_reads_total{result}                BMC health reads by the poll (ok|failed)
package lifecycle
