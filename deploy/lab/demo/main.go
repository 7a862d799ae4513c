// Command demo is the README's first command (`sudo make demo`): it runs the
// end-to-end flow once — a BIOS VM with an IPMI BMC PXE-boots from Kiln, is
// inspected and built with the lab OS release (deploy/lab/labos: layers
// chosen by role and hardware, a per-node layer), boots the written OS and
// is provisioned from its first-boot report — printing each event as it
// happens, and leaves the lab up so you can look around with the CLI.
// -image plain provisions the plain lab image (cidata) instead.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"kiln/deploy/lab/e2e"
)

func main() {
	fw := flag.String("firmware", "bios", "bios or uefi")
	bmcKind := flag.String("bmc", "", "ipmi or redfish (default: ipmi for bios, redfish for uefi)")
	work := flag.String("work", "/tmp/kiln-demo", "scratch directory")
	prefix := flag.String("prefix", "kln", "network namespace prefix (PREFIX-srv, PREFIX-lan)")
	keep := flag.Bool("keep", true, "leave the lab running afterwards (tear down with: make demo-down)")
	image := flag.String("image", "release", "release (the lab OS, provisioned from its first-boot report) or plain (a plain image with cidata)")
	flag.Parse()
	if *image != "release" && *image != "plain" {
		fail(fmt.Errorf("-image %q: release or plain", *image))
	}
	if *bmcKind == "" {
		*bmcKind = map[string]string{"bios": "ipmi", "uefi": "redfish"}[*fw]
	}
	root, err := os.Getwd()
	if err != nil {
		fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("kiln demo: a %s VM and its %s BMC, from powered off to provisioned (%s image)\n", *fw, *bmcKind, *image)
	start := time.Now()
	r, err := e2e.Run(ctx, e2e.Options{
		Root: root, Work: *work, Prefix: *prefix, Firmware: *fw, BMC: *bmcKind,
		DiskMiB: 80, ImageMiB: 24, Release: *image == "release", Timeout: 8 * time.Minute, KeepUp: *keep, Out: os.Stdout,
	})
	e2e.CleanupRelease()
	if err != nil {
		if r != nil && r.Lab != nil && *keep {
			fmt.Printf("\nlab left up for debugging; logs in %s (kiln.log, bmc/serial-*.log)\n", *work)
		}
		fail(err)
	}
	fmt.Printf("\nsummary: machine %s is %s; power-on to %s in %.1f s (whole demo %.0f s)\n",
		r.MachineID, r.FinalState, r.FinalState, r.Seconds, time.Since(start).Seconds())
	if *image == "release" {
		ok := r.Reason == "first_boot_reported" && r.ReleaseProblem == "" && r.SecretLeak == "" && r.OSUp
		fmt.Printf("  layers %s; the written OS booted and reported its first boot (%s)\n", r.LayerChoice, r.Reason)
		fmt.Printf("  disk checked on the host (every layer's digest and verity, the table, the kiln-node hash Kiln recorded): %v%s\n",
			r.ReleaseProblem == "", prefixed(" ", r.ReleaseProblem))
		if !ok {
			fail(fmt.Errorf("the release build is not as it must be: reason %s, disk %q, OS up %v, cluster token found in %q",
				r.Reason, r.ReleaseProblem, r.OSUp, r.SecretLeak))
		}
	} else {
		fmt.Printf("  disk checked on the host byte by byte (image sha256 %s, partition table, cidata, zeros): %v %s; cidata files: %d\n",
			r.ImageSHA256, r.DiskImageOK, r.DiskProblem, len(r.Cidata))
	}
	if *keep {
		kiln := filepath.Join(root, "bin/kiln")
		env := fmt.Sprintf("KILN_TOKEN_FILE=%s/kiln-data/admin.token", *work)
		// The commands are printed to be pasted: with sudo when the demo was
		// started through sudo, without it in a root shell (a root-only box
		// may have no sudo at all).
		sudo := "sudo "
		if os.Geteuid() == 0 && os.Getenv("SUDO_USER") == "" {
			sudo = ""
		}
		fmt.Printf("\nlook around (Kiln keeps running in netns %s-srv):\n", *prefix)
		fmt.Printf("  %sip netns exec %s-srv env %s %s machines list\n", sudo, *prefix, env, kiln)
		fmt.Printf("  %sip netns exec %s-srv env %s %s machines get %s -o yaml\n", sudo, *prefix, env, kiln, r.MachineID)
		fmt.Printf("  %sip netns exec %s-srv env %s %s events\n", sudo, *prefix, env, kiln)
		fmt.Printf("  %sip netns exec %s-srv env %s %s status\n", sudo, *prefix, env, kiln)
		fmt.Printf("tear down: %smake demo-down\n", sudo)
	}
}

// prefixed is p+s, or "" for an empty s.
func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kiln demo:", err)
	os.Exit(1)
}
