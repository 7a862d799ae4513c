// Package env holds the test of the in-RAM environment's contents (the
// environment itself is built by build.sh in this directory, `make env`).
package env

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"kiln/deploy/lab/testreq"
)

// TestEnvToolsRunFromInitramfs unpacks the environment's initramfs and runs
// the programs build.sh copies in (WANT_PROGRAMS) inside it with chroot: only
// the libraries the initramfs holds are there. mkfs.ext4 -d makes a node
// layer, veritysetup format and verify check a hash tree, as the agent does.
// It also requires the dm_verity and ext4 modules in the load order.
func TestEnvToolsRunFromInitramfs(t *testing.T) {
	testreq.Root(t, "chroot into the unpacked initramfs", "chroot", "cpio", "gzip")
	_, initrd := testreq.Env(t)
	dir := t.TempDir()
	cmd := exec.Command("sh", "-c", "gzip -dc '"+initrd+"' | cpio -id --quiet")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("unpack %s: %v: %s", initrd, err, out)
	}
	order, err := os.ReadFile(filepath.Join(dir, "lib/modules/order"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"dm_mod", "dm_verity", "crc32c_generic", "ext4"} {
		if !strings.Contains("\n"+string(order), "\n"+m+"\n") {
			t.Fatalf("module %s not in /lib/modules/order:\n%s", m, order)
		}
	}
	// The environment has devtmpfs; here the RNG devices cryptsetup opens suffice.
	for name, minor := range map[string]int{"random": 8, "urandom": 9} {
		if err := syscall.Mknod(filepath.Join(dir, "dev", name), syscall.S_IFCHR|0o666, 1<<8|minor); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "tmp/node/etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tmp/node/etc/hostname"), []byte("node-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		c := exec.Command("chroot", append([]string{dir}, args...)...)
		c.Env = []string{"PATH=/sbin:/bin"}
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("chroot %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("/sbin/mkfs.ext4", "-q", "-F", "-L", "kiln-node", "-d", "/tmp/node", "/tmp/node.ext4", "4M")
	// The data: the ext4 image padded to 4 KiB blocks; the tree after it.
	fi, err := os.Stat(filepath.Join(dir, "tmp/node.ext4"))
	if err != nil {
		t.Fatal(err)
	}
	off := strconv.FormatInt(fi.Size(), 10)
	out := run("/sbin/veritysetup", "format", "/tmp/node.ext4", "/tmp/node.ext4", "--hash-offset="+off, "--data-blocks="+strconv.FormatInt(fi.Size()/4096, 10))
	var root string
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && k == "Root hash" {
			root = strings.TrimSpace(v)
		}
	}
	if len(root) != 64 {
		t.Fatalf("veritysetup format printed no root hash:\n%s", out)
	}
	run("/sbin/veritysetup", "verify", "/tmp/node.ext4", "/tmp/node.ext4", root, "--hash-offset="+off)
	t.Logf("env: mkfs.ext4 and veritysetup run from the initramfs alone (root hash %s)", root)
}
