// Package testkit holds the test helpers that Kiln's packages share, so each
// rule is written once:
//
//   - Netns, Veth, NewLink, IP: network namespaces and veth pairs that the
//     test creates and removes at cleanup (iproute2's ip(8)); a protocol test
//     runs its server on the host end of a Link and a real client inside the
//     namespace (Link.Exec); InNetns opens a socket (a server's, a
//     client's) inside a namespace from the test process.
//   - Sample, Series: read a metric from a prometheus.Gatherer (the registry
//     a component was given).
//   - MACCases: the table of MAC addresses every copy of the machine-MAC
//     rule is tested against (store.ParseMachineMAC, and the copies in dhcp
//     and httpboot, which may not import the store).
//
// Whether a test may skip for want of root or a host program is not decided
// here: the one rule is deploy/lab/testreq's (testreq.Root, testreq.Commands),
// which a test calls before it sets up a Link.
//
// It is for tests only (it calls testing.TB) and imports nothing of Kiln's,
// so the test files of every package, the protocol packages and the store
// included, may import it: deploy/scripts/depcheck lets tests import the
// lab's packages as long as nothing they reach is outside what the importing
// package may import.
package testkit
