// Waking a claimed machine in a site cluster (DESIGN.md "Agent liveness"):
// this node's memory of agents (bootGuard) covers only the agents that talk
// to this node, so on a node of a cluster of several a claim never powers
// the machine at once; the leader's loop (checkClaimWakes) PXE-boots a
// claimed machine that no agent has taken within AgentStaleAfter. Owner of
// claimWakes: this file only.

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"kiln/store"
)

// clusterNodes is the part of *store.Store that names the site's nodes
// (every node with a forward address record, this one included).
type clusterNodes interface {
	NodeIDs() ([]string, error)
}

// multiNode reports whether this controller's store is one node of a
// cluster of several: then a machine's agent may be talking to another
// node, whose memory of it this node does not share. A store that cannot
// tell (a local store) counts as one node.
func (c *Controller) multiNode() bool {
	cn, ok := c.st.(clusterNodes)
	if !ok {
		return false
	}
	ids, err := cn.NodeIDs()
	return err == nil && len(ids) > 1
}

// claimWakes is the leader's memory of the claims it is waiting on: the
// machine's record version when the loop first saw it claimed and
// available, since when, and whether it has woken it. A claim is woken at
// most once per record version; a new leader starts again (at most one
// more wake, AgentStaleAfter after it first sees the claim).
type claimWakes struct {
	mu sync.Mutex
	m  map[string]claimWait
}

type claimWait struct {
	rv    uint64
	since time.Time
	woken bool
}

// due records that machine id is claimed and available at version rv at
// now, and reports whether it has waited at least d without a wake.
func (w *claimWakes) due(id string, rv uint64, now time.Time, d time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[string]claimWait{}
	}
	cw, ok := w.m[id]
	if !ok || cw.rv != rv {
		w.m[id] = claimWait{rv: rv, since: now}
		return d <= 0
	}
	return !cw.woken && now.Sub(cw.since) >= d
}

func (w *claimWakes) woken(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	cw := w.m[id]
	cw.woken = true
	w.m[id] = cw
}

// claimUntaken is the precondition of a claim's wake (bmcWork.still): the
// machine is still available with a claim and this node has not heard its
// agent since. Without it, a wake queued from the loop's snapshot
// power-cycled a machine whose agent took the claim meanwhile, in the
// middle of its build (the fleet simulator's leader kill, 1 of 30
// machines failed agent_restarted).
func (c *Controller) claimUntaken(m store.Machine) string {
	switch {
	case m.State != store.StateAvailable:
		return fmt.Sprintf("the claim was taken: the machine is %s", m.State)
	case m.Claim == nil:
		return "the machine is no longer claimed"
	case c.agentAlive(m.ID):
		return "its agent was heard since the wake was queued"
	}
	return ""
}

// forget drops the machines no longer waiting (not in keep).
func (w *claimWakes) forget(keep map[string]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id := range w.m {
		if !keep[id] {
			delete(w.m, id)
		}
	}
}

// checkClaimWakes (Tick, leader, clusters of several nodes) PXE-boots each
// claimed, available machine with a BMC that no agent has taken for
// AgentStaleAfter since the loop first saw the claim: an agent alive on
// any node polls every AgentPollAfter and would have started the build
// (available → provisioning), so none is running.
func (c *Controller) checkClaimWakes(ctx context.Context) error {
	if c.bmc == nil || !c.multiNode() {
		return nil
	}
	ms, err := c.listAll(store.ListOptions{State: store.StateAvailable})
	if err != nil {
		return err
	}
	now := c.now()
	waiting := map[string]bool{}
	var errs []error
	for _, m := range ms {
		if m.Claim == nil || m.BMC == "" {
			continue
		}
		waiting[m.ID] = true
		if !c.cw.due(m.ID, m.ResourceVersion, now, c.cfg.AgentStaleAfter) || c.agentAlive(m.ID) {
			continue
		}
		id := m.ID
		// ms is a snapshot: re-read, as the agent may have taken the claim
		// since (an agent polling another node, or one whose polls failed
		// through an election); the job checks again before it runs.
		if cur, err := c.st.GetMachine(m.ID); err != nil || c.claimUntaken(cur) != "" {
			continue
		}
		queued, err := c.enqueuePXEBoot(ctx, m, c.claimUntaken, func(ctx context.Context, err error) {
			if err != nil {
				c.logger().Warn("power claimed machine", "machine", id, "err", err)
			}
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if queued {
			c.cw.woken(id)
			c.logger().Info("claimed machine not taken by any agent; PXE-booting it", "machine", id, "waited", c.cfg.AgentStaleAfter)
		}
	}
	c.cw.forget(waiting)
	return errors.Join(errs...)
}
