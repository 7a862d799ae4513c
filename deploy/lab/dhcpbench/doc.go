// Package dhcpbench holds the appliance-level DHCP benchmark, TestBenchDHCP
// (`make bench`, KILN_BENCH=1, root): `kiln serve` (bin/kiln from `make
// build`, its real store, 2,000 machines imported with the CLI) against
// kea-dhcp4 (memfile), each in its own network namespace, both driven by
// perfdhcp from a third namespace at the same ladder of rates. It has no
// non-test code; the method is in dhcp/DESIGN.md.
package dhcpbench
