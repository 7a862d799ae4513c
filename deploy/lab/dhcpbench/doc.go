// Package dhcpbench holds the appliance-level DHCP benchmarks (`make bench`,
// KILN_BENCH=1, root): TestBenchDHCP, one `kiln serve` (bin/kiln from `make
// build`, its real store, 2,000 machines imported with the CLI), and
// TestBenchDHCPCluster, three `kiln serve` nodes of one mutual-TLS cluster on
// one bridge, each against kea-dhcp4 (memfile) in the same run, all in their
// own network namespaces, driven by the test's own DORA generator (relays,
// gen_test.go) at the same ladder of rates; TestBenchDHCP also measures the
// generator against a trivial responder (echo_test.go), the most this machine
// can show. It has no non-test code; the method is in dhcp/DESIGN.md.
package dhcpbench
