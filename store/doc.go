// Package store is Kiln's replicated state: one hashicorp/raft group per
// site, a raft log and stable store in bbolt (raft-boltdb/v2, file
// raft.db), and an FSM whose state lives in its own bbolt file (fsm.db).
//
// It owns the records of records.go (Site, Rack, Machine, BMC, Image, Job,
// Lease, secrets) and the event log (the audit trail and the feed central
// pulls by cursor). It imports nothing of Kiln's.
//
// Writes are typed, numbered raft commands (CommandType, 1 byte + JSON
// body). The leader fixes time and IDs before a command is logged, so the
// apply function is deterministic; a follower forwards writes to the
// leader over a small HTTPS RPC (Config.ForwardAddr). Raft and that RPC run
// over mutual TLS under a site CA (package pki; join tokens, Enroll,
// Members, RemoveMember: DESIGN.md "Cluster trust"). Every record carries
// Meta.ResourceVersion (the raft index of its last write) for
// compare-and-set; every change appends an Event keyed by (raft index,
// seq). Machine lifecycle transitions are checked by the FSM against
// CanTransition.
//
// Reads come from the local replica; Barrier makes a following read
// current (linearizable with respect to writes acknowledged before it).
//
// OpenLocal opens the same Store with no raft (for tests, via
// storetest.NewLocal, and single-process tools): writes take the same apply
// path over fsm.db in process, one at a time, with the same indexes and
// ResourceVersions; raft-only calls fail with ErrNoRaft.
//
// Referential rules are decided inside the raft apply, never by a
// read-then-write of a caller: a claim must name a stored image and an
// image a claim names cannot be deleted (ErrImageInUse); ImportMachines
// creates machines only when no stored or fellow machine holds their name,
// serial, BMC MAC or NIC MAC (*ImportConflictError). ParseMachineMAC is the
// one rule for a machine MAC given by an import or the API. BindLeases
// binds a DHCP address only while no other client holds it unexpired
// (*AddressTakenError), and WatchLeases follows the address view as the log
// is applied.
//
// Errors: ErrNotFound, ErrConflict (*ImportConflictError), ErrInvalid
// (*MACError), ErrDuplicateMAC, ErrImageInUse, ErrAddressTaken
// (*AddressTakenError), *IllegalTransitionError,
// ErrNotLeader (*NotLeaderError), ErrTimeout, ErrCorrupt (names the file),
// ErrInconsistentDataDir (names the files and how to recover),
// ErrUnknownCommand, ErrFSMHalted, ErrBadCommand, ErrClosed, ErrNoRaft.
//
// Metrics (kiln_store_*): raft_state, last_index, commit_index,
// applied_index, last_event_index, commit_seconds, commands_total{type},
// apply_errors_total{code}, forwarded_total{result}.
//
// See DESIGN.md in this directory for the command encoding, determinism,
// snapshot/restore, start-up rebuild and forwarding.
package store
