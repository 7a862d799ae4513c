// BootFor, the netboot decision for a MAC (top-level DESIGN.md "Boot flow"):
// agent with a new token, local disk, or discovery of an unknown MAC. It
// asks the boot guard (bootguard.go) before it issues a token and the
// discovery limiter (discovery.go) before it records an unknown MAC.

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

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
// allowed, and for failed and quarantined machines whatever netboot says
// (never told to boot a disk that may hold a failed build; issue 15); the
// local disk for provisioned, retired, rma or netboot=false; for an unknown MAC, a new discovered record
// (UnknownMachines=discover, within the discovery rate and cap) or the local
// disk (exit, or discovery refused). A provisioning machine whose build
// completed (finalize succeeded; this is its post-build reboot) gets the
// local disk and becomes provisioned (reason booted_local_disk, actor
// controller) — a plain image's build; a release build's gets the local
// disk and stays provisioning until its first-boot report (firstboot.go).
// It is never handed the agent again.
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
		return c.bootedLocal(ctx, m), nil
	}
	if !bootsAgent(m) {
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
		if !bootsAgent(*cur) {
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
		return c.bootedLocal(ctx, m), nil
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

// agentStates are the states in which a machine gets the agent whatever
// its netboot flag says (issue 15): a failed or quarantined machine is
// never told to boot its disk (its disk may hold a failed build); it
// netboots into the environment, whose agent waits.
var agentStates = []store.MachineState{store.StateFailed, store.StateQuarantined}

// bootsAgent reports whether m netboots the agent (BootFor): a netboot
// state with netboot allowed, or one of agentStates.
func bootsAgent(m store.Machine) bool {
	if hasState(agentStates, m.State) {
		return true
	}
	return hasState(netbootStates, m.State) && (m.Netboot == nil || *m.Netboot)
}

var (
	errLocalBoot  = errors.New("local boot")
	errBuilt      = errors.New("build complete")
	errTokenRaced = errors.New("token issued concurrently")
)

// bootedLocal answers the netboot of a machine whose build completed: exit
// to the local disk, and the machine is provisioned (reason
// booted_local_disk); this node forgets the build's agent (agentReset). A failed write is logged, not returned: the machine
// must boot its disk either way, and the loop's RebootTimeout check
// (reboot_unobserved) still moves it to provisioned.
//
// A release build (awaitsFirstBoot, issue 15) is told to boot its disk
// too, but stays provisioning: provisioned comes only from its first-boot
// report (firstboot.go), or failed by FirstBootTimeout.
func (c *Controller) bootedLocal(ctx context.Context, m store.Machine) Boot {
	id := m.ID
	// The machine netbooted after its build: the agent that ran the build
	// rebooted it and is gone, so its last reports must not hold the next
	// netboot (a release or an RMA right after the build) for
	// AgentLiveWindow, nor make RMA think an agent will take the erase.
	c.agentReset(id)
	if awaitsFirstBoot(m) {
		return Boot{Action: BootLocal, MachineID: id}
	}
	_, err := c.update(ctx, id, store.W{Actor: ActorController, Reason: ReasonBootedLocalDisk}, func(m *store.Machine) error {
		if !buildComplete(*m) || awaitsFirstBoot(*m) {
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
