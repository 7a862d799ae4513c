// The operator's transitions (DESIGN.md "Transitions and their owners"):
// Provision, ClaimMachines, Release, Erase, Inspect, and the BMC power
// sequence each one may start (powerIntoAgent, powerDone). Every write goes
// through update (update.go); the BMC sequences through the job queue
// (jobs.go).

package lifecycle

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// sealClusterToken (issue 15) seals the write-only cluster token of cl's
// cluster block with Config.Sealer, stores it as a secret under a fresh
// key (TokenRef) and clears it from the claim, so no record, event, log
// line or view ever holds it. A token of less than rules.WarnTokenBits
// estimated entropy is accepted with a warning (logged without the token;
// TokenWeak in the claim). A block without a token keeps its TokenRef.
func (c *Controller) sealClusterToken(ctx context.Context, cl *store.Claim) error {
	if cl.Cluster == nil || cl.Cluster.Token == "" {
		return nil
	}
	if c.cfg.Sealer == nil {
		return ErrNoSealer
	}
	cc := *cl.Cluster
	tok := []byte(cc.Token)
	cc.Token = ""
	cc.TokenWeak = rules.TokenBits(string(tok)) < rules.WarnTokenBits
	if cc.TokenWeak {
		c.logger().Warn("cluster token accepted, but its estimated entropy is below the recommended bits; use a random token",
			"estimated_bits", int(rules.TokenBits(string(tok))), "recommended_bits", rules.WarnTokenBits)
	}
	sealed, err := c.cfg.Sealer.Seal(tok)
	clear(tok)
	if err != nil {
		return fmt.Errorf("lifecycle: seal cluster token: %w", err)
	}
	var nonce [8]byte
	if _, err := io.ReadFull(c.cfg.Rand, nonce[:]); err != nil {
		return fmt.Errorf("lifecycle: cluster token key: %w", err)
	}
	key := clusterTokenKey(hex.EncodeToString(nonce[:]))
	if err := c.st.PutSecret(ctx, key, sealed, store.W{Actor: ActorController, Reason: "cluster_token"}); err != nil {
		return fmt.Errorf("lifecycle: store cluster token: %w", err)
	}
	cc.TokenRef = key
	cl.Cluster = &cc
	return nil
}

// checkClaim applies the claim rule (rules.CheckClaim). That its image
// exists is the store's rule, checked when the claim is written
// (store.PutMachine), so that a concurrent DeleteImage cannot slip in
// between.
func (c *Controller) checkClaim(cl store.Claim) error {
	return invalidField(rules.CheckClaim("claim", cl))
}

// Provision places claim c on available machine id (its agent then starts
// the gated build, see AgentTask). When the machine's agent has not been
// heard from recently and the machine has a BMC, it is PXE-booted
// (boot_pxe, power_cycle jobs). Errors: ErrInvalid (claim), *StateError
// (not available, or already claimed), store.ErrInvalid (claim.image names
// no stored image), store errors.
func (c *Controller) Provision(ctx context.Context, id string, cl store.Claim, w store.W) (store.Machine, error) {
	if err := c.checkClaim(cl); err != nil {
		return store.Machine{}, err
	}
	if err := c.sealClusterToken(ctx, &cl); err != nil {
		return store.Machine{}, err
	}
	w = withDefaults(w, ReasonClaimed)
	m, err := c.update(ctx, id, w, func(m *store.Machine) error {
		if m.State != store.StateAvailable {
			return &StateError{Op: "provision", Machine: id, State: m.State, Want: []store.MachineState{store.StateAvailable}}
		}
		if m.Claim != nil {
			return &StateError{Op: "provision", Machine: id, State: m.State, Want: []store.MachineState{store.StateAvailable},
				Claimed: true, ClaimedImage: m.Claim.Image}
		}
		claim := cl
		if cl.Cluster != nil {
			cc := *cl.Cluster
			claim.Cluster = &cc
		}
		m.Claim = &claim
		clearConditions(m, store.HealthSourceOwner, store.HealthSourceKiln) // about an earlier claim
		return nil
	})
	if err != nil {
		return m, err
	}
	c.wakeForClaim(ctx, m)
	return m, nil
}

// wakeForClaim PXE-boots a claimed machine whose agent is not running. On
// a node of a cluster of several it does nothing: the agent may be polling
// another node (this node's memory cannot tell), and only the leader runs
// BMC jobs; the leader's loop wakes the machine if no agent takes the
// claim within AgentStaleAfter (checkClaimWakes, claimwake.go).
func (c *Controller) wakeForClaim(ctx context.Context, m store.Machine) {
	if m.BMC == "" || c.bmc == nil || c.agentAlive(m.ID) || c.multiNode() {
		return
	}
	id := m.ID
	if _, err := c.enqueuePXEBoot(ctx, m, c.claimUntaken, func(ctx context.Context, err error) {
		if err != nil {
			c.logger().Warn("power claimed machine", "machine", id, "err", err)
		}
	}); err != nil {
		c.logger().Warn("queue power for claimed machine", "machine", id, "err", err)
	}
}

// maxClaim bounds ClaimMachines' n.
const maxClaim = 1000

// ClaimMachines claims n available, unclaimed machines whose labels match
// labels (all-or-nothing, one store command), each with claim cl and Role
// role. Machines are picked across racks round-robin (fewest per rack),
// then by ID. Errors: ErrInvalid, ErrNotEnough, store errors.
func (c *Controller) ClaimMachines(ctx context.Context, role string, labels map[string]string, n int, cl store.Claim, w store.W) ([]store.Machine, error) {
	if n < 1 || n > maxClaim {
		return nil, fmt.Errorf("%w: n %d: want 1..%d", ErrInvalid, n, maxClaim)
	}
	if err := c.checkClaim(cl); err != nil {
		return nil, err
	}
	if err := c.sealClusterToken(ctx, &cl); err != nil {
		return nil, err
	}
	w = withDefaults(w, ReasonClaimed)
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		avail, err := c.listAll(store.ListOptions{State: store.StateAvailable, Labels: labels})
		if err != nil {
			return nil, err
		}
		var free []store.Machine
		for _, m := range avail {
			if m.Claim == nil && m.State == store.StateAvailable && matchLabels(m.Labels, labels) {
				free = append(free, m)
			}
		}
		if len(free) < n {
			return nil, fmt.Errorf("%w: want %d with labels %v, %d free", ErrNotEnough, n, labels, len(free))
		}
		picked := spreadPick(free, n)
		for i := range picked {
			claim := cl
			if cl.Cluster != nil {
				cc := *cl.Cluster
				claim.Cluster = &cc
			}
			claim.Role = role
			if len(labels) > 0 {
				// The selector is kept: a spare that replaces this machine
				// must match it (spares.go).
				claim.Selector = make(map[string]string, len(labels))
				for k, v := range labels {
					claim.Selector[k] = v
				}
			}
			picked[i].Claim = &claim
			clearConditions(&picked[i], store.HealthSourceOwner, store.HealthSourceKiln) // about an earlier claim
		}
		out, err := c.st.PutMachines(ctx, picked, w)
		if errors.Is(err, store.ErrConflict) {
			last = err
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lifecycle: claim %d machines: %w", n, err)
		}
		for _, m := range out {
			c.wakeForClaim(ctx, m)
		}
		return out, nil
	}
	return nil, fmt.Errorf("lifecycle: claim %d machines: %w", n, last)
}

func matchLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// spreadPick takes n machines round-robin over racks (racks in name order,
// machines by ID), so a claim does not concentrate on one rack.
func spreadPick(ms []store.Machine, n int) []store.Machine {
	byRack := map[string][]store.Machine{}
	var racks []string
	for _, m := range ms {
		if _, ok := byRack[m.Rack]; !ok {
			racks = append(racks, m.Rack)
		}
		byRack[m.Rack] = append(byRack[m.Rack], m)
	}
	sort.Strings(racks)
	for _, r := range racks {
		l := byRack[r]
		sort.Slice(l, func(i, j int) bool { return l[i].ID < l[j].ID })
	}
	out := make([]store.Machine, 0, n)
	for i := 0; len(out) < n; i++ {
		for _, r := range racks {
			if i < len(byRack[r]) && len(out) < n {
				out = append(out, byRack[r][i])
			}
		}
	}
	return out
}

// Release gives a machine back: provisioned or failed → erasing (reason
// released; the claim is dropped, the agent erases the disks, then the
// machine is available again). An available machine whose build has not
// started just loses its claim. With a BMC the machine is PXE-booted.
// Errors: *StateError, store errors.
func (c *Controller) Release(ctx context.Context, id string, w store.W) (store.Machine, error) {
	w = withDefaults(w, ReasonReleased)
	cur, err := c.st.GetMachine(id)
	if err != nil {
		return store.Machine{}, fmt.Errorf("lifecycle: release %s: %w", id, err)
	}
	if cur.State == store.StateAvailable && cur.Claim != nil {
		return c.update(ctx, id, w, func(m *store.Machine) error {
			if m.State != store.StateAvailable {
				return &StateError{Op: "release", Machine: id, State: m.State, Want: []store.MachineState{store.StateAvailable}}
			}
			m.Claim = nil
			return nil
		})
	}
	return c.startErase(ctx, "release", id, []store.MachineState{store.StateProvisioned, store.StateFailed}, w)
}

// Erase moves an available, failed, quarantined or provisioned machine to
// erasing (reason erase_requested); the agent wipes its disks, then it is
// available, or inspecting when it must be inspected again first (see
// AgentReport). A quarantined machine's hardware is not trusted: it is
// erasing with reason erase_quarantined (whatever reason w gives; w's
// reason and message still go to the transition event), and that reason
// is the durable marker that sends it to inspection after the erase.
// Errors: *StateError, store errors.
func (c *Controller) Erase(ctx context.Context, id string, w store.W) (store.Machine, error) {
	return c.startErase(ctx, "erase", id, []store.MachineState{store.StateAvailable, store.StateFailed,
		store.StateQuarantined, store.StateProvisioned}, withDefaults(w, ReasonEraseRequested))
}

func (c *Controller) startErase(ctx context.Context, op, id string, from []store.MachineState, w store.W) (store.Machine, error) {
	now := c.now()
	wasAvailable := false
	m, err := c.update(ctx, id, w, func(m *store.Machine) error {
		if !hasState(from, m.State) {
			return &StateError{Op: op, Machine: id, State: m.State, Want: from}
		}
		wasAvailable = m.State == store.StateAvailable
		m.Reason, m.Message = w.Reason, w.Message
		if m.State == store.StateQuarantined {
			m.Reason = ReasonEraseQuarantined
		}
		m.State = store.StateErasing
		m.Claim = nil
		clearConditions(m, store.HealthSourceOwner) // the owner's conditions end with its claim
		m.Step = pendingStep(agentapi.StepErase, now, now.Add(c.cfg.BootTimeout))
		return nil
	})
	if err != nil {
		return m, err
	}
	if !(wasAvailable && c.agentAlive(id)) {
		c.powerIntoAgent(ctx, m, store.StateErasing)
	}
	return m, nil
}

// reinspectAfterErase says why a machine whose erase just succeeded must be
// inspected again before it may be available ("" = it need not): it was
// erased from quarantine (reason erase_quarantined), or the hardware on
// record (the last registration, the erase boot's included) is missing or
// has a blocking difference from the intended fields.
func reinspectAfterErase(m store.Machine) string {
	switch {
	case m.Reason == ReasonEraseQuarantined:
		return "it was quarantined"
	case m.Discovered == nil:
		return "no inspection on record"
	case len(blocking(m.Diff)) > 0:
		return "blocking difference in " + strings.Join(blocking(m.Diff), ", ")
	}
	return ""
}

// Inspect (re)inspects a machine: registered, discovered, available
// (unclaimed), failed or quarantined → inspecting (reason
// inspection_requested). An agent heard within AgentStaleAfter gets the
// inspect task at its next poll (AgentTask) and registers again with its
// inventory; otherwise, with a BMC, the machine is PXE-booted (boot_pxe,
// power_cycle jobs). Errors: *StateError, store errors.
func (c *Controller) Inspect(ctx context.Context, id string, w store.W) (store.Machine, error) {
	w = withDefaults(w, ReasonInspectionRequested)
	now := c.now()
	from := []store.MachineState{store.StateRegistered, store.StateDiscovered, store.StateAvailable, store.StateFailed, store.StateQuarantined}
	m, err := c.update(ctx, id, w, func(m *store.Machine) error {
		if !hasState(from, m.State) {
			return &StateError{Op: "inspect", Machine: id, State: m.State, Want: from}
		}
		if m.Claim != nil && m.State == store.StateAvailable {
			return &StateError{Op: "inspect", Machine: id, State: m.State, Want: from, Claimed: true, ClaimedImage: m.Claim.Image}
		}
		m.State = store.StateInspecting
		m.Reason, m.Message = w.Reason, w.Message
		m.Step = pendingStep("inspect", now, now.Add(c.cfg.BootTimeout))
		return nil
	})
	if err != nil {
		return m, err
	}
	if !c.agentAlive(id) {
		c.powerIntoAgent(ctx, m, store.StateInspecting)
	}
	return m, nil
}

// powerIntoAgent PXE-boots m through its BMC (if any); a BMC failure fails
// the machine if it is still waiting in state.
func (c *Controller) powerIntoAgent(ctx context.Context, m store.Machine, state store.MachineState) {
	if m.BMC == "" || c.bmc == nil {
		return
	}
	if _, err := c.enqueuePXEBoot(ctx, m, waitingIn(state), c.powerDone(m.ID, state)); err != nil {
		c.logger().Warn("queue power", "machine", m.ID, "err", err)
	}
}

// powerDone is the onDone of a power sequence started for a machine
// already moved to state: a BMC failure fails the machine (reason
// bmc_failed) if it is still waiting for its agent in that state.
func (c *Controller) powerDone(id string, state store.MachineState) func(ctx context.Context, err error) {
	return func(ctx context.Context, bmcErr error) {
		if bmcErr == nil {
			return
		}
		msg := truncate(sanitize(bmcErr.Error()), 256)
		_, err := c.update(ctx, id, store.W{Actor: ActorController, Reason: ReasonBMCFailed, Message: msg}, func(m *store.Machine) error {
			if m.State != state || m.Step == nil || m.Step.State != stepPending {
				return errNoChange
			}
			m.State = store.StateFailed
			m.Message = msg
			m.Step.State, m.Step.Reason = string(JobFailed), ReasonBMCFailed
			return nil
		})
		if err != nil {
			c.logger().Warn("record BMC failure", "machine", id, "err", err)
		}
	}
}
