package lifecycle

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"kiln/store"
)

// Boot actions returned by BootFor.
const (
	BootAgent    = "agent"    // boot the in-RAM agent with MachineID and Token
	BootLocal    = "local"    // iPXE exits to the local disk
	BootDiscover = "discover" // unknown machine recorded as discovered; boot the agent with MachineID and Token
)

// Boot is BootFor's decision. Token (64 hex characters, 32 random bytes) is
// set for BootAgent and BootDiscover; only its SHA-256 is stored.
type Boot struct {
	Action    string
	MachineID string
	Token     string
}

// netbootStates are the states in which a machine that allows netboot is
// given the agent.
var netbootStates = []store.MachineState{store.StateRegistered, store.StateDiscovered, store.StateInspecting,
	store.StateAvailable, store.StateProvisioning, store.StateErasing}

// BootFor decides what the machine whose NIC has mac boots (DESIGN.md "Boot
// flow", step 4): the agent with a new per-boot token for machines in
// registered, discovered, inspecting, available, provisioning (build not
// yet complete) or erasing with netboot allowed; the local disk for
// provisioned, failed, quarantined, retired or netboot=false; for an
// unknown MAC, a new discovered record (UnknownMachines=discover) or the
// local disk (exit). A provisioning machine whose build completed
// (finalize succeeded; this is its post-build reboot) gets the local disk
// and becomes provisioned (reason booted_local_disk, actor controller);
// it is never handed the agent again.
// Errors: ErrInvalid for a malformed MAC; store errors (the token write
// needs the leader reachable).
func (c *Controller) BootFor(ctx context.Context, mac string) (Boot, error) {
	hw, err := net.ParseMAC(strings.TrimSpace(mac))
	if err != nil || len(hw) != 6 {
		return Boot{}, fmt.Errorf("%w: mac %q", ErrInvalid, mac)
	}
	mac = hw.String()
	m, err := c.st.MachineByMAC(mac)
	if errors.Is(err, store.ErrNotFound) {
		if c.cfg.UnknownMachines != UnknownDiscover {
			return Boot{Action: BootLocal}, nil
		}
		return c.discover(ctx, mac)
	}
	if err != nil {
		return Boot{}, fmt.Errorf("lifecycle: boot %s: %w", mac, err)
	}
	if buildComplete(m) {
		return c.bootedLocal(ctx, m.ID), nil
	}
	if !hasState(netbootStates, m.State) || (m.Netboot != nil && !*m.Netboot) {
		return Boot{Action: BootLocal, MachineID: m.ID}, nil
	}
	tok, err := c.newToken()
	if err != nil {
		return Boot{}, err
	}
	hash := tokenHash(tok)
	_, err = c.update(ctx, m.ID, store.W{Actor: ActorController, Reason: "boot_token"}, func(cur *store.Machine) error {
		if buildComplete(*cur) {
			return errBuilt
		}
		if !hasState(netbootStates, cur.State) || (cur.Netboot != nil && !*cur.Netboot) {
			return errLocalBoot
		}
		cur.BootTokenHash = hash
		return nil
	})
	if errors.Is(err, errBuilt) {
		return c.bootedLocal(ctx, m.ID), nil
	}
	if errors.Is(err, errLocalBoot) {
		return Boot{Action: BootLocal, MachineID: m.ID}, nil
	}
	if err != nil {
		return Boot{}, err
	}
	return Boot{Action: BootAgent, MachineID: m.ID, Token: tok}, nil
}

var (
	errLocalBoot = errors.New("local boot")
	errBuilt     = errors.New("build complete")
)

// bootedLocal answers the netboot of a machine whose build completed: exit
// to the local disk, and the machine is provisioned (reason
// booted_local_disk). A failed write is logged, not returned: the machine
// must boot its disk either way, and the loop's RebootTimeout check
// (reboot_unobserved) still moves it to provisioned.
func (c *Controller) bootedLocal(ctx context.Context, id string) Boot {
	_, err := c.update(ctx, id, store.W{Actor: ActorController, Reason: ReasonBootedLocalDisk}, func(m *store.Machine) error {
		if !buildComplete(*m) {
			return errNoChange // already moved (another node's BootFor, or the loop)
		}
		m.State = store.StateProvisioned
		m.Reason = ReasonBootedLocalDisk
		m.Message = "netbooted after the build; told to boot its local disk"
		if m.Step != nil {
			m.Step.Deadline = time.Time{}
		}
		return nil
	})
	if err != nil {
		c.logger().Warn("built machine netbooted; could not record provisioned", "machine", id, "err", err)
	}
	return Boot{Action: BootLocal, MachineID: id}
}

// discover records an unknown MAC as a discovered machine (its MAC in
// Intended.NICs so the boot path finds it again) and boots the agent.
func (c *Controller) discover(ctx context.Context, mac string) (Boot, error) {
	tok, err := c.newToken()
	if err != nil {
		return Boot{}, err
	}
	m := store.Machine{
		Name:          "discovered-" + strings.ReplaceAll(mac, ":", ""),
		State:         store.StateDiscovered,
		Reason:        ReasonDiscovered,
		Intended:      store.Hardware{NICs: []store.NIC{{MAC: mac}}},
		BootTokenHash: tokenHash(tok),
	}
	out, err := c.st.PutMachine(ctx, m, store.W{Actor: ActorController, Reason: ReasonDiscovered})
	if err != nil {
		// Another node may have recorded the same MAC concurrently: boot it as known.
		if again, gerr := c.st.MachineByMAC(mac); gerr == nil && again.ID != "" {
			return c.BootFor(ctx, mac)
		}
		return Boot{}, fmt.Errorf("lifecycle: discover %s: %w", mac, err)
	}
	c.logger().Info("discovered unknown machine", "machine", out.ID, "mac", mac)
	return Boot{Action: BootDiscover, MachineID: out.ID, Token: tok}, nil
}

func (c *Controller) newToken() (string, error) {
	var b [32]byte
	if _, err := io.ReadFull(c.cfg.Rand, b[:]); err != nil {
		return "", fmt.Errorf("lifecycle: token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

func tokenHash(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// VerifyAgentToken reports whether sha256(token) equals the machine's
// BootTokenHash (constant-time compare). False for unknown machines and
// empty tokens or hashes.
func (c *Controller) VerifyAgentToken(machineID, token string) bool {
	if machineID == "" || token == "" {
		return false
	}
	m, err := c.st.GetMachine(machineID)
	if err != nil || len(m.BootTokenHash) != sha256.Size*2 {
		return false
	}
	want := []byte(m.BootTokenHash)
	got := []byte(tokenHash(token))
	return subtle.ConstantTimeCompare(want, got) == 1
}

// tokenArg hides a kernel-argument token that an agent message might echo.
var tokenArg = regexp.MustCompile(`(?i)(kiln\.token=|bearer\s+)\S+`)

// sanitize makes agent or BMC text safe to store and show: valid UTF-8,
// control characters (except none) replaced by spaces, tokens redacted.
func sanitize(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			return ' '
		}
		return r
	}, s)
	s = tokenArg.ReplaceAllString(s, "${1}REDACTED")
	return strings.TrimSpace(s)
}

// truncate cuts s to at most n bytes on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
