// Package bmc powers machines on and off, sets their next boot to the network and reads
// their inventory and health ([Controller.Health]: Redfish Status.Health of the system and
// chassis and their LogService entries; IPMI sensors and SEL) through their baseboard
// management controller (BMC), over Redfish
// (DMTF DSP0266, ComputerSystem schema) or IPMI 2.0 RMCP+ (lanplus), on top of
// github.com/bmc-toolbox/bmclib/v2.
//
// A [Controller] serialises operations per BMC address, bounds the site-wide number of
// operations in flight, applies a per-call timeout and bounded retries with backoff, and
// reports every operation in Prometheus metrics named kiln_bmc_*. Every boot-device
// write is read back; a BMC that answers "OK" without applying the change yields
// [ErrBootNotApplied]. Answers that cannot be parsed strictly are errors, never states.
//
// Errors returned by the Controller are *[OpError] values wrapping one sentinel from the
// package's error block; [Reason] maps them to a stable string for jobs ("timeout",
// "auth", "boot_not_applied", ...). Credentials never appear in errors or logs: [Target]
// redacts its password in String, GoString, LogValue and JSON, error texts are scrubbed,
// and at rest they are sealed with AES-256-GCM by a [Sealer].
//
// The package imports nothing of Kiln's; see DESIGN.md for why some pieces bypass bmclib.
package bmc
