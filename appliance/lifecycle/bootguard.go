// The boot guard and per-boot tokens (DESIGN.md "The boot guard", "Agent
// liveness"): bootGuard, this node's memory of agents heard, power actions,
// tokens issued or verified and bounded holds; holdBoot's decision;
// token generation, hashing and VerifyAgentToken. Owner of bootGuard: this
// file only (the rest of the package calls seen, issued, agentReset,
// agentAlive and holdBoot).

package lifecycle

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"sync"
	"time"

	"kiln/store"
)

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
	return c.guard.hold(m, c.now(), c.AgentLiveWindow())
}

// issued records that this node handed out the token with hash for id.
func (c *Controller) issued(id, hash string) { c.guard.issued(id, hash) }

// agentReset records that this node is about to power the machine through
// its BMC: any agent running on it is gone from now on.
func (c *Controller) agentReset(id string) { c.guard.reset(id, c.now()) }

// seen records that this node heard machine id's agent now (register,
// task poll or report).
func (c *Controller) seen(id string) { c.guard.seen(id, c.now()) }

// agentAlive reports whether the machine's agent was heard from within AgentStaleAfter.
func (c *Controller) agentAlive(id string) bool {
	t, ok := c.guard.lastHeard(id)
	return ok && c.now().Sub(t) <= c.cfg.AgentStaleAfter
}

// bootGuard is this node's memory of agents and boot tokens, which holdBoot
// decides from (DESIGN.md "The boot guard", "Agent liveness"). All four
// maps are keyed by machine ID and guarded by mu, which no other state
// shares and under which nothing calls out. The memory is per node and is
// lost on restart; the replicated Machine.Step and the bounded "unknown"
// hold cover that.
type bootGuard struct {
	mu sync.Mutex
	// lastSeen: this node last heard the machine's agent (register, task
	// poll, report); forgotten at a power action by this node.
	lastSeen map[string]time.Time
	// resetAt: this node last powered the machine through its BMC (agent gone).
	resetAt map[string]time.Time
	// tokenKnown: hash of the token this node issued or verified (its
	// agent talks to this node, so lastSeen covers it).
	tokenKnown map[string]string
	// holdSince: start of a bounded "unknown liveness" hold.
	holdSince map[string]time.Time
}

// init makes the maps (mu held).
func (g *bootGuard) init() {
	if g.lastSeen == nil {
		g.lastSeen, g.resetAt, g.holdSince = map[string]time.Time{}, map[string]time.Time{}, map[string]time.Time{}
		g.tokenKnown = map[string]string{}
	}
}

// hold is holdBoot's decision for m at now with live window w.
func (g *bootGuard) hold(m store.Machine, now time.Time, w time.Duration) (bool, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	within := func(t time.Time) bool { return !t.IsZero() && now.Sub(t) <= w }
	reset, wasReset := g.resetAt[m.ID]
	seen, wasSeen := g.lastSeen[m.ID] // deleted by reset: only contacts since the last reset
	if wasSeen && within(seen) {
		return true, holdAgentActive
	}
	if m.Step != nil && m.Step.State != stepPending && within(m.Step.At) && (!wasReset || m.Step.At.After(reset)) {
		return true, holdAgentActive
	}
	if m.BootTokenHash == "" || g.tokenKnown[m.ID] == m.BootTokenHash || (wasReset && !wasSeen) {
		delete(g.holdSince, m.ID)
		return false, ""
	}
	since, ok := g.holdSince[m.ID]
	if !ok || now.Sub(since) >= 2*w || now.Before(since) {
		g.holdSince[m.ID] = now // a new hold (an old one expired unused)
		return true, holdUnknown
	}
	if now.Sub(since) < w {
		return true, holdUnknown
	}
	delete(g.holdSince, m.ID)
	return false, ""
}

// issued: this node handed out the token with hash for id (any hold ends).
func (g *bootGuard) issued(id, hash string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	g.tokenKnown[id] = hash
	delete(g.holdSince, id)
}

// verified: this node verified the token with hash for id's agent.
func (g *bootGuard) verified(id, hash string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	g.tokenKnown[id] = hash
}

// reset: this node powers id through its BMC at now.
func (g *bootGuard) reset(id string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	g.resetAt[id] = now
	delete(g.lastSeen, id)
}

// seen: this node heard id's agent at now.
func (g *bootGuard) seen(id string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	g.lastSeen[id] = now
}

// lastHeard is when this node last heard id's agent (ok false: not since
// its last power action, or never).
func (g *bootGuard) lastHeard(id string) (time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.lastSeen[id]
	return t, ok
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
	c.guard.verified(machineID, m.BootTokenHash) // the agent holding it talks to this node
	return true
}
