// Command kiln-firstboot is the first-boot reporter of the OS Kiln installs
// (the lab OS of deploy/lab/labos runs it from /sbin/init once the NIC has a
// DHCP lease). It finds the GPT partition named kiln-node
// (/sys/class/block/*/uevent PARTNAME=), hashes the whole partition (SHA-256),
// mounts it read-only (ext4 ro,noload: nothing is written, no journal replay),
// reads /etc/hostname, /etc/ssh/ssh_host_ed25519_key.pub (its fingerprint as
// `ssh-keygen -l` prints it) and /etc/kiln/firstboot.json, and posts one
// agentapi.FirstBootReport to {url}/v1/agent/firstboot with the bearer token,
// retrying (every URL in turn, backoff up to 10 s) until a 2xx or a 4xx. It
// prints one line on the console:
//
//	kiln-firstboot: reported hostname=H fp=SHA256:… node_sha256=… status=204 after N s
//
// A node layer that is present but incomplete is reported as failed
// (reason first_boot_node_layer); without a readable firstboot.json there is
// nobody to report to, and Kiln's first_boot_timeout decides. Static
// (CGO_ENABLED=0); imports only api/agentapi.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	sys := flag.String("sys", "/sys", "sysfs root (partitions: class/block/*/uevent)")
	dev := flag.String("dev", "/dev", "device directory")
	mnt := flag.String("mnt", "/run/kiln-node", "where the node layer is mounted read-only")
	dir := flag.String("dir", "", "read the node layer from this directory instead of the kiln-node partition (tests)")
	wait := flag.Duration("wait", 15*time.Second, "how long to wait for the kiln-node partition to appear")
	setHostname := flag.Bool("sethostname", false, "set the system's hostname from the node layer's /etc/hostname")
	flag.Parse()
	r := Reporter{Sys: *sys, Dev: *dev, Mount: *mnt, Dir: *dir, Wait: *wait, Console: os.Stdout, SetHostname: *setHostname,
		BootIDPath: "/proc/sys/kernel/random/boot_id", MaxBackoff: 10 * time.Second}
	if err := r.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stdout, "kiln-firstboot:", err)
		os.Exit(1)
	}
}
