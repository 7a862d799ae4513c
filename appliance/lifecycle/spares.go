// Spares (issue 14; DESIGN.md "Spares"): a claimed machine declared
// failed hands its claim to a spare with the same selector (labels),
// hardware class (label kiln.io/class) and rack spread, built by the same
// gated build (Provision); the pool per class is exported
// (kiln_spares_available, kiln_spares_low_threshold) and a spares_low event
// is recorded when it falls to its threshold. Owner of spareState: this
// file only.

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"kiln/store"
)

// LabelClass is the machine label naming its hardware class (spare pools
// are per class; a machine without it is in class DefaultClass).
const (
	LabelClass   = "kiln.io/class"
	DefaultClass = "default"
)

// Reasons of spare writes.
const (
	ReasonSpareAssigned    = "spare_assigned"
	ReasonSpareUnavailable = "spare_unavailable"
	ReasonSparesLow        = "spares_low"
)

func classOf(m store.Machine) string {
	if c := m.Labels[LabelClass]; c != "" {
		return c
	}
	return DefaultClass
}

// isSpare: m may take a failed machine's claim: available, unclaimed, not
// in maintenance, no ladder running.
func isSpare(m store.Machine) bool {
	return m.State == store.StateAvailable && m.Claim == nil && m.Maintenance == nil &&
		(m.Remediation == nil || m.Remediation.Outcome != "")
}

// SparePool is one hardware class's spare count and its low threshold.
type SparePool struct {
	Class     string `json:"class"`
	Available int    `json:"available"`
	Low       int    `json:"low_threshold"`
}

// spareState is this node's memory of which classes it reported low and
// which failed machines it reported without a spare (so each is one event,
// not one per tick). Its own lock.
type spareState struct {
	mu      sync.Mutex
	low     map[string]bool
	noSpare map[string]bool
}

func (s *spareState) flip(m *map[string]bool, key string, v bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *m == nil {
		*m = map[string]bool{}
	}
	was := (*m)[key]
	(*m)[key] = v
	return was != v
}

func (c *Controller) lowFor(class string) int {
	if n, ok := c.cfg.Remediation.SparesLowByClass[class]; ok {
		return n
	}
	return c.cfg.Remediation.SparesLow
}

// sparePools counts the spares of every class seen on a machine or named
// in SparesLowByClass, by class name.
func (c *Controller) sparePools(all []store.Machine) []SparePool {
	n := map[string]int{}
	for cl := range c.cfg.Remediation.SparesLowByClass {
		n[cl] += 0
	}
	for _, m := range all {
		if m.State == store.StateRetired || m.State == store.StateRMA {
			continue
		}
		cl := classOf(m)
		n[cl] += 0
		if isSpare(m) {
			n[cl]++
		}
	}
	out := make([]SparePool, 0, len(n))
	for cl, k := range n {
		out = append(out, SparePool{Class: cl, Available: k, Low: c.lowFor(cl)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Class < out[j].Class })
	return out
}

// refreshSpares exports the pools and records spares_low when a class
// falls to its threshold (once per crossing, on this leader).
func (c *Controller) refreshSpares(ctx context.Context, all []store.Machine) {
	for _, p := range c.sparePools(all) {
		c.rm.spares.WithLabelValues(p.Class).Set(float64(p.Available))
		c.rm.sparesLow.WithLabelValues(p.Class).Set(float64(p.Low))
		low := p.Available <= p.Low
		if c.spares.flip(&c.spares.low, p.Class, low) && low {
			msg := fmt.Sprintf("class %s: %d spare machines available, low threshold %d", p.Class, p.Available, p.Low)
			if err := c.st.AppendEvents(ctx, []store.Event{{Subject: "spares/" + p.Class, Kind: "spares_low",
				Actor: ActorRemediation, Reason: ReasonSparesLow, Message: msg}}); err != nil {
				c.logger().Warn("record spares low", "class", p.Class, "err", err)
			}
			c.logger().Warn("spares low", "class", p.Class, "available", p.Available, "threshold", p.Low)
		}
	}
}

// pickSpare chooses the spare for failed machine m's claim cl among all:
// same class, labels matching cl.Selector, then the rack holding the
// fewest machines of cl's role (rack spread), a rack other than m's on a
// tie, then by ID. ok false: none.
func pickSpare(m store.Machine, cl store.Claim, all []store.Machine) (store.Machine, bool) {
	perRack := map[string]int{}
	for _, x := range all {
		if x.ID != m.ID && x.Claim != nil && x.Claim.Role == cl.Role {
			perRack[x.Rack]++
		}
	}
	var cands []store.Machine
	for _, x := range all {
		if x.ID != m.ID && isSpare(x) && classOf(x) == classOf(m) && matchLabels(x.Labels, cl.Selector) {
			cands = append(cands, x)
		}
	}
	if len(cands) == 0 {
		return store.Machine{}, false
	}
	sort.Slice(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if perRack[a.Rack] != perRack[b.Rack] {
			return perRack[a.Rack] < perRack[b.Rack]
		}
		if (a.Rack == m.Rack) != (b.Rack == m.Rack) {
			return b.Rack == m.Rack
		}
		return a.ID < b.ID
	})
	return cands[0], true
}

// assignSpare gives failed machine m's waiting claim (Remediation.Claim)
// to a spare (pickSpare) through Provision, the same gated build as any
// claim, with Claim.Replaces = m.ID, and records the spare's ID on m
// (Remediation.Spare, reason spare_assigned). No spare: a
// spare_unavailable event once; a later tick tries again.
func (c *Controller) assignSpare(ctx context.Context, m store.Machine, all []store.Machine) error {
	r := m.Remediation
	cl := *r.Claim
	cl.Replaces = m.ID
	spare, ok := pickSpare(m, cl, all)
	if !ok {
		if c.spares.flip(&c.spares.noSpare, m.ID, true) {
			msg := fmt.Sprintf("no spare of class %s matching %v for the claim (role %q) of failed machine %s", classOf(m), cl.Selector, cl.Role, m.ID)
			if err := c.st.AppendEvents(ctx, []store.Event{{Subject: "machine/" + m.ID, Kind: "spare_unavailable",
				Actor: ActorRemediation, Reason: ReasonSpareUnavailable, Message: msg}}); err != nil {
				c.logger().Warn("record spare unavailable", "machine", m.ID, "err", err)
			}
		}
		return nil
	}
	w := store.W{Actor: ActorRemediation, Reason: ReasonSpareAssigned, Message: "replaces failed machine " + m.ID}
	for {
		_, err := c.Provision(ctx, spare.ID, cl, w)
		if err == nil {
			break
		}
		// all is this tick's snapshot: a spare another failed machine took
		// earlier in the tick (or another writer since) is claimed now. Mark
		// it so in the snapshot and take the next candidate.
		var se *StateError
		if !errors.As(err, &se) {
			return fmt.Errorf("lifecycle: spare %s for %s: %w", spare.ID, m.ID, err)
		}
		taken(all, spare.ID, cl)
		if spare, ok = pickSpare(m, cl, all); !ok {
			return nil // none left this tick; a later tick reports it
		}
	}
	taken(all, spare.ID, cl)
	c.spares.flip(&c.spares.noSpare, m.ID, false)
	_, err := c.update(ctx, m.ID, store.W{Actor: ActorRemediation, Reason: ReasonSpareAssigned, Message: "claim moved to spare " + spare.ID},
		func(x *store.Machine) error {
			if x.Remediation == nil || x.Remediation.Spare != "" {
				return errNoChange
			}
			x.Remediation.Spare = spare.ID
			x.Remediation.Claim = nil
			return nil
		})
	c.rm.remediations.WithLabelValues("spare", "assigned").Inc()
	return err
}

// taken marks machine id of the tick's snapshot all as claimed by cl, so
// pickSpare does not offer it to the next failed machine of the same tick.
func taken(all []store.Machine, id string, cl store.Claim) {
	for i := range all {
		if all[i].ID == id {
			c := cl
			all[i].Claim = &c
			return
		}
	}
}
