package httpboot

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"
)

// Boot actions (Boot.Action).
const (
	ActionAgent    = "agent"    // boot the in-RAM environment for inspection/provisioning
	ActionLocal    = "local"    // exit to the local disk (provisioned, or netboot not allowed)
	ActionDiscover = "discover" // boot the agent for an unknown machine
)

// Backend supplies machine state to the script renderer. The appliance
// implements it over its local store replica (boot-path reads never wait for
// the raft leader).
type Backend interface {
	// BootFor returns what machine mac should boot now. The appliance issues
	// the per-boot token. Errors: ErrUnknownMachine (wrapped) if no machine
	// has this MAC; any other error is treated as transient.
	BootFor(ctx context.Context, mac net.HardwareAddr) (Boot, error)
}

// Boot is what one machine boots now.
type Boot struct {
	// Action is ActionAgent, ActionLocal or ActionDiscover. A machine that
	// may not netboot gets ActionLocal (never an HTTP error).
	Action string
	// MachineID becomes kiln.machine (charset [A-Za-z0-9._:-], ≤128 bytes).
	MachineID string
	// Token becomes kiln.token (charset [A-Za-z0-9._~+/=-], ≤512 bytes).
	Token string
	// ExtraArgs are appended to the kernel command line (argument whitelist).
	ExtraArgs []string
	// Hostname is only shown on the console; characters outside
	// [A-Za-z0-9.-] are replaced by '_'.
	Hostname string
}

// ScriptParams are the server-wide values the renderer needs.
type ScriptParams struct {
	BaseURL      string        // this server, no trailing slash
	AgentURL     string        // kiln.url
	KernelArgs   []string      // for every agent boot
	FetchTimeout time.Duration // iPXE --timeout per fetch
	FetchRetries int           // attempts before reboot
	RetryDelay   time.Duration // sleep between attempts
}

// Kernel argument keys, mirrored from kiln/api/agentapi (ArgURL, ArgMachine,
// ArgToken); httpboot imports nothing of Kiln's, and a test checks they match.
const (
	argURL     = "kiln.url"
	argMachine = "kiln.machine"
	argToken   = "kiln.token"
)

// Whitelists. iPXE expands ${...}, splits on whitespace and treats "||",
// "&&", "#" and a leading ":" specially; none of $ { } space & | # ; " ' \
// or control bytes are allowed in any value placed in a script.
func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func allIn(s string, max int, extra string) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isAlnum(s[i]) && strings.IndexByte(extra, s[i]) < 0 {
			return false
		}
	}
	return true
}

func safeURL(s string) bool       { return allIn(s, 512, "._:/=,+@%~-") }
func safeArg(s string) bool       { return allIn(s, 512, "._:/=,+@%~-") }
func safeMachineID(s string) bool { return allIn(s, 128, "._:-") }
func safeToken(s string) bool     { return allIn(s, 512, "._~+/=-") }

// reservedArg reports whether a sets one of the keys only the renderer may
// set (kiln.url, kiln.machine, kiln.token, initrd), which would let a label
// override the machine identity or token.
func reservedArg(a string) bool {
	key, _, _ := strings.Cut(a, "=")
	switch key {
	case argURL, argMachine, argToken, "initrd":
		return true
	}
	return false
}

// displayName maps a hostname to a console-safe string.
func displayName(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	b := []byte(s)
	for i, c := range b {
		if !isAlnum(c) && c != '.' && c != '-' {
			b[i] = '_'
		}
	}
	return string(b)
}

// Script renders the iPXE script for one boot. It returns ErrUnsafeValue if a
// value fails its whitelist and ErrBadAction for an unknown Action; callers
// then serve LocalScript instead. The output is deterministic.
//
// The agent script fetches the kernel and initramfs with --timeout and
// retries kernel+initrd+boot FetchRetries times, sleeping RetryDelay between
// attempts, then reboots (never falls through to a half-written disk).
// It never re-runs "dhcp"/"ifconf"/"autoboot": the interface is already
// configured when this script runs, and re-running configuration with all
// configurators would wait ~12 s for IPv6 router advertisements (iPXE's
// ipv6 configurator); see DESIGN.md.
func Script(p ScriptParams, b Boot) (string, error) {
	switch b.Action {
	case ActionLocal:
		return LocalScript(displayName(b.Hostname)), nil
	case ActionAgent, ActionDiscover:
	default:
		return "", fmt.Errorf("%w: %q", ErrBadAction, b.Action)
	}
	if !safeURL(p.BaseURL) || !safeURL(p.AgentURL) {
		return "", fmt.Errorf("%w: base or agent URL", ErrUnsafeValue)
	}
	args := []string{"initrd=initramfs", argURL + "=" + p.AgentURL}
	if b.Action == ActionAgent || b.MachineID != "" {
		if !safeMachineID(b.MachineID) {
			return "", fmt.Errorf("%w: machine id", ErrUnsafeValue)
		}
		args = append(args, argMachine+"="+b.MachineID)
	}
	if b.Action == ActionAgent || b.Token != "" {
		if !safeToken(b.Token) {
			return "", fmt.Errorf("%w: token", ErrUnsafeValue)
		}
		args = append(args, argToken+"="+b.Token)
	}
	for _, a := range append(append([]string(nil), p.KernelArgs...), b.ExtraArgs...) {
		if !safeArg(a) || reservedArg(a) {
			return "", fmt.Errorf("%w: kernel argument", ErrUnsafeValue)
		}
		args = append(args, a)
	}
	tries := p.FetchRetries
	if tries < 1 {
		tries = 1
	}
	timeoutMS := p.FetchTimeout.Milliseconds()
	if timeoutMS < 1000 {
		timeoutMS = 1000
	}
	delay := int((p.RetryDelay + time.Second - 1) / time.Second)
	who := "machine " + b.MachineID
	if b.MachineID == "" {
		who = "discovery"
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "#!ipxe\n")
	fmt.Fprintf(&sb, "# kiln: action=%s\n", b.Action)
	fmt.Fprintf(&sb, "echo Kiln: provisioning environment for %s host %s\n", who, displayName(b.Hostname))
	fmt.Fprintf(&sb, "set kiln-try:int32 0\n")
	fmt.Fprintf(&sb, ":kiln-retry\n")
	fmt.Fprintf(&sb, "iseq ${kiln-try} %d && goto kiln-fail ||\n", tries)
	fmt.Fprintf(&sb, "inc kiln-try\n")
	fmt.Fprintf(&sb, "imgfree\n")
	fmt.Fprintf(&sb, "kernel --name vmlinuz --timeout %d %s/env/vmlinuz %s || goto kiln-wait\n", timeoutMS, p.BaseURL, strings.Join(args, " "))
	fmt.Fprintf(&sb, "initrd --name initramfs --timeout %d %s/env/initramfs || goto kiln-wait\n", timeoutMS, p.BaseURL)
	fmt.Fprintf(&sb, "boot || goto kiln-wait\n")
	fmt.Fprintf(&sb, ":kiln-wait\n")
	fmt.Fprintf(&sb, "echo Kiln: attempt ${kiln-try} of %d failed, retrying in %d s\n", tries, delay)
	fmt.Fprintf(&sb, "sleep %d\n", delay)
	fmt.Fprintf(&sb, "goto kiln-retry\n")
	fmt.Fprintf(&sb, ":kiln-fail\n")
	fmt.Fprintf(&sb, "echo Kiln: giving up after %d attempts, rebooting\n", tries)
	fmt.Fprintf(&sb, "sleep 10\n")
	fmt.Fprintf(&sb, "reboot\n")
	return sb.String(), nil
}

// LocalScript is the script that leaves iPXE for the local disk. It ends
// with "exit 1": a failed boot, so control returns to the firmware, which
// tries its next boot device (UEFI: the next Boot#### in BootOrder; SeaBIOS
// and most BIOSes: the next device in their boot list). The status must be
// non-zero: a chained iPXE (ipxe.efi, undionly.kpxe from ipxedust) runs this
// script from its embedded one as "autoboot || exit", and a plain "exit"
// (status 0) reads there as a successful boot, so the embedded script goes
// on to DHCP and chain this script again and ends at an iPXE shell instead
// of the disk (seen with OVMF in the HA lab). (A BIOS that halts after a
// failed network boot would need "sanboot --no-describe --drive 0x80"; Kiln
// uses the exit for both.) host must already be display-safe.
func LocalScript(host string) string {
	return "#!ipxe\n# kiln: action=local\necho Kiln: booting " + host + " from local disk\nexit 1\n"
}

// retryScript is served when the Backend fails transiently: the machine waits
// and fetches its script again instead of falling through to the disk.
func retryScript(baseURL, mac string, delay int) string {
	return fmt.Sprintf("#!ipxe\n# kiln: action=retry\necho Kiln: state unavailable, retrying in %d s\nsleep %d\nchain --replace --autofree %s/ipxe/%s || reboot\n",
		delay, delay, baseURL, mac)
}
