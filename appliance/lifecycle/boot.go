package lifecycle

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"kiln/appliance/lifecycle/rules"
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

// BootFor decides what the machine whose NIC has mac boots (top-level
// DESIGN.md "Boot flow", step 4; DESIGN.md "The boot guard"): the agent with
// a new per-boot token for machines in registered, discovered, inspecting,
// available, provisioning (build not yet complete) or erasing with netboot
// allowed; the local disk for provisioned, failed, quarantined, retired or
// netboot=false; for an unknown MAC, a new discovered record
// (UnknownMachines=discover, within the discovery rate and cap) or the local
// disk (exit, or discovery refused). A provisioning machine whose build
// completed (finalize succeeded; this is its post-build reboot) gets the
// local disk and becomes provisioned (reason booted_local_disk, actor
// controller); it is never handed the agent again.
//
// A live agent is never displaced: while the machine's agent has been
// heard from within AgentLiveWindow (see holdBoot), BootFor issues no
// token, leaves BootTokenHash alone and returns ErrAgentActive; the
// caller serves a script that sleeps and fetches /ipxe/{mac} again. Once
// the agent is stale (the machine really rebooted, or the agent died), a
// new token is issued.
//
// Errors: ErrInvalid for a MAC store.ParseMachineMAC refuses (malformed,
// group or all-zero); ErrAgentActive (retry later);
// store errors (the token write needs the leader reachable).
func (c *Controller) BootFor(ctx context.Context, mac string) (Boot, error) {
	mac, err := store.ParseMachineMAC(mac)
	if err != nil {
		return Boot{}, fmt.Errorf("%w: mac %v", ErrInvalid, err)
	}
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
	if held, why := c.holdBoot(m); held {
		c.m.bootHolds.WithLabelValues(why).Inc()
		return Boot{}, fmt.Errorf("%w: machine %s (%s)", ErrAgentActive, m.ID, why)
	}
	tok, err := c.newToken()
	if err != nil {
		return Boot{}, err
	}
	hash := tokenHash(tok)
	prevHash := m.BootTokenHash
	_, err = c.update(ctx, m.ID, store.W{Actor: ActorController, Reason: "boot_token"}, func(cur *store.Machine) error {
		if buildComplete(*cur) {
			return errBuilt
		}
		if !hasState(netbootStates, cur.State) || (cur.Netboot != nil && !*cur.Netboot) {
			return errLocalBoot
		}
		if cur.BootTokenHash != prevHash {
			// Another BootFor (this node or another) issued a token since
			// the liveness decision: that boot owns the machine now.
			return errTokenRaced
		}
		cur.BootTokenHash = hash
		return nil
	})
	if errors.Is(err, errTokenRaced) {
		c.m.bootHolds.WithLabelValues(holdRaced).Inc()
		return Boot{}, fmt.Errorf("%w: machine %s (%s)", ErrAgentActive, m.ID, holdRaced)
	}
	if errors.Is(err, errBuilt) {
		return c.bootedLocal(ctx, m.ID), nil
	}
	if errors.Is(err, errLocalBoot) {
		return Boot{Action: BootLocal, MachineID: m.ID}, nil
	}
	if err != nil {
		return Boot{}, err
	}
	c.issued(m.ID, hash)
	return Boot{Action: BootAgent, MachineID: m.ID, Token: tok}, nil
}

var (
	errLocalBoot  = errors.New("local boot")
	errBuilt      = errors.New("build complete")
	errTokenRaced = errors.New("token issued concurrently")
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

// discover records an unknown MAC as a discovered machine and boots the
// agent. The record follows the DHCP path's convention (DiscoverDHCP):
// no Name, label kiln.io/discovered-by=ipxe, the MAC in
// Intended.NICs so the boot path finds it again. Discovery is limited per
// node by a token bucket (DiscoverRate/s, DiscoverBurst) and site-wide by
// MaxDiscovered machines in state discovered; a refused discovery answers
// like UnknownMachines=exit (BootLocal, nothing recorded) and counts in
// kiln_lifecycle_discoveries_dropped_total{reason="rate"|"cap"}.
func (c *Controller) discover(ctx context.Context, mac string) (Boot, error) {
	b, known, err := c.discoverLocked(ctx, mac)
	if known {
		// Recorded meanwhile (another request, node or the DHCP path): boot it as known.
		return c.BootFor(ctx, mac)
	}
	return b, err
}

// discoverLocked records mac as discovered with a new boot token
// (recordDiscovered: under the discovery limits). known: the MAC has a
// record now.
func (c *Controller) discoverLocked(ctx context.Context, mac string) (b Boot, known bool, err error) {
	var tok string
	out, res, err := c.recordDiscovered(ctx, mac, store.W{Actor: ActorController, Reason: ReasonDiscovered},
		func() (store.Machine, error) {
			var err error
			if tok, err = c.newToken(); err != nil {
				return store.Machine{}, err
			}
			return store.Machine{
				State:         store.StateDiscovered,
				Reason:        ReasonDiscovered,
				Labels:        map[string]string{LabelDiscoveredBy: DiscoveredByIPXE},
				Intended:      store.Hardware{NICs: []store.NIC{{MAC: mac}}},
				BootTokenHash: tokenHash(tok),
			}, nil
		})
	switch {
	case err != nil:
		return Boot{}, false, err
	case res == discKnown:
		return Boot{}, true, nil
	case res == discRefused:
		return Boot{Action: BootLocal}, false, nil
	}
	c.issued(out.ID, out.BootTokenHash)
	c.logger().Info("discovered unknown machine", "machine", out.ID, "mac", mac)
	return Boot{Action: BootDiscover, MachineID: out.ID, Token: tok}, false, nil
}

// Labels of discovered records.
const (
	LabelDiscoveredBy = "kiln.io/discovered-by" // which path recorded the machine: "dhcp" or "ipxe"
	DiscoveredByIPXE  = "ipxe"                  // BootFor (GET /ipxe/{mac}) recorded it
)

// Discovery drop reasons (label reason of kiln_lifecycle_discoveries_dropped_total).
const (
	dropRate = "rate"
	dropCap  = "cap"
)

// discoverToken takes one token from the discovery bucket (capacity
// DiscoverBurst, refilled at DiscoverRate per second); false when empty.
func (c *Controller) discoverToken() bool {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.discLast.IsZero() {
		c.discTokens = float64(c.cfg.DiscoverBurst)
	} else if dt := now.Sub(c.discLast).Seconds(); dt > 0 {
		c.discTokens = math.Min(float64(c.cfg.DiscoverBurst), c.discTokens+dt*c.cfg.DiscoverRate)
	}
	c.discLast = now
	if c.discTokens < 1 {
		return false
	}
	c.discTokens--
	return true
}

// Boot-hold reasons (label reason of kiln_lifecycle_boots_held_total).
const (
	holdAgentActive = "agent_active" // the agent was heard from within AgentLiveWindow
	holdUnknown     = "unknown"      // this node cannot tell; held for at most AgentLiveWindow
	holdRaced       = "raced"        // another BootFor issued a token meanwhile
)

// AgentLiveWindow is how long after the agent's last register, task poll
// or report BootFor still treats it as running and refuses to issue a new
// token: max(AgentStaleAfter, 2×AgentHeartbeat), so an agent in a long
// write step, which reports every AgentHeartbeat, stays live.
func (c *Controller) AgentLiveWindow() time.Duration {
	return max(c.cfg.AgentStaleAfter, 2*c.cfg.AgentHeartbeat)
}

// holdBoot decides whether BootFor must not issue a new token for m (a
// known machine in a netboot state) because an agent may still be running
// with the current one. The agent is live when, after this node last
// power-cycled the machine through its BMC (which kills any agent):
//   - this node heard it (register, task poll, report) within
//     AgentLiveWindow, or
//   - the replicated record shows an agent step (Machine.Step not pending)
//     recorded within AgentLiveWindow, by any node.
//
// With neither, a machine with no token outstanding is never held. When a
// token is outstanding and this node's memory covers it (this node issued
// the current token, verified it for the agent, or power-cycled the
// machine since), the agent is stale and a token is issued. Otherwise this
// node cannot tell (the agent talks to another node, or this node
// restarted): the boot is held conservatively, but bounded — the first
// such request starts a hold that releases AgentLiveWindow later, so a
// genuinely rebooted machine retrying every few seconds gets its token
// within one window.
func (c *Controller) holdBoot(m store.Machine) (bool, string) {
	now := c.now()
	w := c.AgentLiveWindow()
	c.mu.Lock()
	defer c.mu.Unlock()
	within := func(t time.Time) bool { return !t.IsZero() && now.Sub(t) <= w }
	reset, wasReset := c.resetAt[m.ID]
	seen, wasSeen := c.lastSeen[m.ID] // deleted by agentReset: only contacts since the last reset
	if wasSeen && within(seen) {
		return true, holdAgentActive
	}
	if m.Step != nil && m.Step.State != stepPending && within(m.Step.At) && (!wasReset || m.Step.At.After(reset)) {
		return true, holdAgentActive
	}
	if m.BootTokenHash == "" || c.tokenKnown[m.ID] == m.BootTokenHash || (wasReset && !wasSeen) {
		delete(c.holdSince, m.ID)
		return false, ""
	}
	since, ok := c.holdSince[m.ID]
	if !ok || now.Sub(since) >= 2*w || now.Before(since) {
		c.holdSince[m.ID] = now // a new hold (an old one expired unused)
		return true, holdUnknown
	}
	if now.Sub(since) < w {
		return true, holdUnknown
	}
	delete(c.holdSince, m.ID)
	return false, ""
}

// issued records that this node handed out the token with hash for id.
func (c *Controller) issued(id, hash string) {
	c.mu.Lock()
	c.tokenKnown[id] = hash
	delete(c.holdSince, id)
	c.mu.Unlock()
}

// agentReset records that this node is about to power the machine through
// its BMC: any agent running on it is gone from now on.
func (c *Controller) agentReset(id string) {
	c.mu.Lock()
	c.resetAt[id] = c.now()
	delete(c.lastSeen, id)
	c.mu.Unlock()
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
	if subtle.ConstantTimeCompare(want, got) != 1 {
		return false
	}
	c.mu.Lock()
	c.tokenKnown[machineID] = m.BootTokenHash // the agent holding it talks to this node
	c.mu.Unlock()
	return true
}

// tokenArg hides a kernel-argument token that an agent message might echo.
var tokenArg = regexp.MustCompile(`(?i)(kiln\.token=|bearer\s+)\S+`)

// sanitize makes agent or BMC text safe to store and show: valid UTF-8,
// every character free text may not hold (rules.TextRune) replaced by a
// space, tokens redacted. Length is the caller's (truncate).
func sanitize(s string) string {
	s = rules.SanitizeText(s, -1)
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
