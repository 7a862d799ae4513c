// Fixture: commands reached through wrappers, closures, lists and LookPath.
package main

import (
	"os"
	"os/exec"
)

func run(name string, args ...string) error { return exec.Command(name, args...).Run() }

func runAll(args ...string) error { return exec.Command(args[0], args[1:]...).Run() }

type lab struct{ ns string }

func (l lab) inNS(name string, args ...string) *exec.Cmd {
	return exec.Command("timeout", append([]string{"20", "ip", "netns", "exec", l.ns, name}, args...)...)
}

func need(bins ...string) {
	for _, b := range append([]string{"losetup"}, bins...) {
		_, _ = exec.LookPath(b)
	}
}

func main() {
	_ = run("ip", "link")
	_ = lab{"x"}.inNS("tcpdump", "-i", "lo")
	need("sfdisk", "/sbin/modinfo")
	ipCmd := func(a ...string) { _ = exec.Command("ip", a...).Run() }
	ipCmd("netns", "exec", "x", "dnsmasq", "-k")
	_ = exec.Command("sh", "-c", "find . | cpio -o > /tmp/x").Run()
	p, _ := exec.LookPath("qemu-system-x86_64")
	_ = exec.Command(p, "-nodefaults")
	for _, c := range [][]string{{"ns1", "ping", "-c1"}, {"ns2", "arping"}} {
		_ = runAll(append([]string{"ip", "netns", "exec", c[0]}, c[1:]...)...)
	}
	need := []string{"mkfs.ext4"}
	if len(os.Args) > 1 {
		need = append(need, "ipmi_sim")
	}
	for _, b := range need {
		_, _ = exec.LookPath(b)
	}
	_ = exec.Command(os.Args[0]).Run()   // known only at run time
	_, _ = exec.LookPath("no-such-tool") // deps-check:absent: a missing-tool test
}
