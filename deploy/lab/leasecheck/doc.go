// Package leasecheck is Kiln's lease-safety test in the spirit of Jepsen
// (issue 12); see README.md for the design, the fault model and what the
// checker proves. This file's package holds the checker (Check,
// CheckGrants, CheckStore) over a history of ACKs; the lab that produces
// the history (three `kiln serve` nodes in network namespaces, simulated
// DHCP clients, the fault injector) is in the test files.
package leasecheck
