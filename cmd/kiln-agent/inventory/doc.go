// Package inventory reads the hardware of the machine kiln-agent runs on straight from
// sysfs and procfs (no external library: jaypipes/ghw is not pinned for this project).
//
// Sources: DMI from /sys/class/dmi/id (SMBIOS type 1 via the kernel), CPUs from
// /sys/devices/system/cpu/online, memory from /proc/meminfo (MemTotal), disks from
// /sys/block (size in 512-byte units per the block layer ABI, model/serial/wwn from the
// device directory, queue/rotational, removable), NICs from /sys/class/net (address,
// operstate, type 1 = Ethernet per include/uapi/linux/if_arp.h); for issue 15's layer
// choice PCI functions (/sys/bus/pci/devices), CPU flags (/proc/cpuinfo) and the TPM
// (/sys/class/tpm), in hw.go.
//
// Every function takes the root of the file system ("/" on a real machine) so tests can
// run against a synthetic tree.
package inventory
