// Package qemuvm holds test helpers for booting one qemu VM (TCG) on a lab
// network: a network namespace holding a bridge, a veth pair to the host and
// a tap for the VM (NewNet), OVMF firmware with a private copy of its
// variable store (OVMF), and a VM whose serial console goes to a file that
// the test polls for a marker (Start, VM.Wait). For tests only (it calls
// testing.TB); needs root, ip and qemu-system-x86_64.
package qemuvm
