// Discovery of unknown machines (DESIGN.md "Discovery limits"): BootFor's
// iPXE path and DiscoverDHCP both record through recordDiscovered, under
// discoveryLimiter (a token bucket per node, the site-wide MaxDiscovered
// cap). Owner of discoveryLimiter: this file only.

package lifecycle

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

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

// Labels and actor of records the DHCP path discovers.
const (
	DiscoveredByDHCP = "dhcp"                 // DiscoverDHCP recorded it (value of LabelDiscoveredBy)
	LabelArch        = "kiln.io/arch"         // the client's RFC 4578 architecture, named
	LabelVendorClass = "kiln.io/vendor-class" // the client's option 60, made a label value
	ActorDHCP        = "dhcp"
)

// Discovery drop reasons (label reason of kiln_lifecycle_discoveries_dropped_total).
const (
	dropRate = "rate"
	dropCap  = "cap"
)

// discoveryLimiter is this node's discovery limit (DESIGN.md "Discovery
// limits"): a token bucket of burst tokens refilled at rate per second. Its
// lock is held across one whole discovery (recordDiscovered: the known-MAC
// check, the bucket, the site-wide cap count and the write), so this
// node's discoveries do not interleave; it guards the bucket and nothing
// else.
type discoveryLimiter struct {
	mu     sync.Mutex
	rate   float64 // tokens per second (Config.DiscoverRate)
	burst  float64 // capacity (Config.DiscoverBurst)
	tokens float64
	last   time.Time // zero: the bucket is full
}

// take takes one token at now (mu held); false when the bucket is empty.
func (d *discoveryLimiter) take(now time.Time) bool {
	if d.last.IsZero() {
		d.tokens = d.burst
	} else if dt := now.Sub(d.last).Seconds(); dt > 0 {
		d.tokens = math.Min(d.burst, d.tokens+dt*d.rate)
	}
	d.last = now
	if d.tokens < 1 {
		return false
	}
	d.tokens--
	return true
}

// DiscoverDHCP records an unknown MAC that asked for DHCP as a discovered
// machine (no name, no boot token; labels kiln.io/discovered-by=dhcp,
// kiln.io/arch=arch and kiln.io/vendor-class from vendorClass, reduced to
// what a label value may hold), so the site team sees every server that
// asks. It takes the same discovery limits as BootFor's (Config
// DiscoverRate, DiscoverBurst, MaxDiscovered): over them nothing is
// recorded and created is false with a nil error. A MAC a record already
// has is not recorded again (created false). Errors: ErrInvalid (mac),
// store errors.
func (c *Controller) DiscoverDHCP(ctx context.Context, mac, arch, vendorClass string) (created bool, err error) {
	mac, err = store.ParseMachineMAC(mac)
	if err != nil {
		return false, fmt.Errorf("%w: mac %v", ErrInvalid, err)
	}
	labels := map[string]string{LabelDiscoveredBy: DiscoveredByDHCP}
	if v := labelValue(arch); v != "" {
		labels[LabelArch] = v
	}
	if v := labelValue(vendorClass); v != "" {
		labels[LabelVendorClass] = v
	}
	out, res, err := c.recordDiscovered(ctx, mac, store.W{Actor: ActorDHCP, Reason: ReasonDiscovered},
		func() (store.Machine, error) {
			return store.Machine{State: store.StateDiscovered, Reason: ReasonDiscovered, Labels: labels,
				Intended: store.Hardware{NICs: []store.NIC{{MAC: mac}}}}, nil
		})
	if err != nil || res != discCreated {
		return false, err
	}
	c.logger().Info("discovered unknown machine", "machine", out.ID, "mac", mac, "by", DiscoveredByDHCP)
	return true, nil
}

// labelValue reduces text a machine sent to a label value that
// rules.CheckLabel accepts: printable ASCII without spaces, ',' or '=', at
// most 63 bytes.
func labelValue(s string) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= 63 {
			break
		}
		if r > ' ' && r < 0x7f && r != ',' && r != '=' {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Outcomes of recordDiscovered.
const (
	discCreated = iota // recorded now
	discKnown          // the MAC has a record (before, or written meanwhile)
	discRefused        // over the rate or the cap: nothing recorded
)

// recordDiscovered creates the discovered record build returns for an
// unknown mac, under the discovery limiter's lock so that the cap check and the write are not
// interleaved with another discovery on this node. build runs only once
// the discovery is admitted (within the token bucket and MaxDiscovered).
func (c *Controller) recordDiscovered(ctx context.Context, mac string, w store.W, build func() (store.Machine, error)) (store.Machine, int, error) {
	c.disc.mu.Lock()
	defer c.disc.mu.Unlock()
	if _, err := c.st.MachineByMAC(mac); err == nil {
		return store.Machine{}, discKnown, nil
	}
	if !c.disc.take(c.now()) {
		c.m.discDropped.WithLabelValues(dropRate).Inc()
		c.logger().Debug("discovery refused: rate limit", "mac", mac)
		return store.Machine{}, discRefused, nil
	}
	counts, err := c.st.CountByState()
	if err != nil {
		return store.Machine{}, 0, fmt.Errorf("lifecycle: discover %s: count: %w", mac, err)
	}
	if n := counts[store.StateDiscovered]; n >= c.cfg.MaxDiscovered {
		c.m.discDropped.WithLabelValues(dropCap).Inc()
		c.logger().Debug("discovery refused: discovered cap reached", "mac", mac, "discovered", n)
		return store.Machine{}, discRefused, nil
	}
	m, err := build()
	if err != nil {
		return store.Machine{}, 0, err
	}
	if err := rules.CheckLabels("labels", m.Labels); err != nil {
		return store.Machine{}, 0, fmt.Errorf("lifecycle: discover %s: %w", mac, invalidField(err))
	}
	out, err := c.st.PutMachine(ctx, m, w)
	if err != nil {
		if again, gerr := c.st.MachineByMAC(mac); gerr == nil && again.ID != "" {
			return store.Machine{}, discKnown, nil
		}
		return store.Machine{}, 0, fmt.Errorf("lifecycle: discover %s: %w", mac, err)
	}
	return out, discCreated, nil
}
