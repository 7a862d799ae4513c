// Drain before disruption (issue 14; DESIGN.md "Drain"): before the
// ladder's first disruptive step on a claimed machine, a drain request on
// the machine (Machine.Drain) and, when the claim names one, a webhook
// POST; the ladder waits for DrainAck or DrainTimeout, then proceeds or
// holds (DrainPolicy).

package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"kiln/store"
)

// Reasons of drain writes.
const (
	ReasonDrainRequested = "drain_requested"
	ReasonDrainAcked     = "drain_acked"
	ReasonDrainTimeout   = "drain_timeout"
	ReasonDrainWebhook   = "drain_webhook"
)

// DrainRequest is the body of the drain webhook POST (JSON): the machine,
// its claim's host name and role, the step that waits, why, until when
// the ladder waits, and the path to acknowledge on (POST, operator token).
type DrainRequest struct {
	Machine  string    `json:"machine"`
	Name     string    `json:"name,omitempty"`
	Hostname string    `json:"hostname,omitempty"`
	Role     string    `json:"role,omitempty"`
	Step     string    `json:"step"`
	Reason   string    `json:"reason"`
	Deadline time.Time `json:"deadline"`
	Policy   string    `json:"policy"` // what happens at the deadline: proceed | hold
	AckPath  string    `json:"ack_path"`
}

// drainWanted: a drain is asked before step on m (claimed, drain enabled).
func (c *Controller) drainWanted(m store.Machine) bool {
	return m.Claim != nil && c.cfg.Remediation.DrainTimeout > 0
}

// newDrain is the drain record asked before step.
func (c *Controller) newDrain(m store.Machine, step, why string, now time.Time) *store.Drain {
	d := &store.Drain{Step: step, Reason: truncate(why, 256), Requested: now, Deadline: now.Add(c.cfg.Remediation.DrainTimeout)}
	if m.Claim != nil {
		d.Webhook = m.Claim.DrainWebhook
	}
	return d
}

// sendDrainWebhook POSTs m's drain request to its webhook (bounded by
// WebhookTimeout) and records the outcome in Drain.WebhookResult. It runs
// in its own goroutine; the ladder never waits for it.
func (c *Controller) sendDrainWebhook(ctx context.Context, m store.Machine) {
	d := m.Drain
	if d == nil || d.Webhook == "" {
		return
	}
	req := DrainRequest{Machine: m.ID, Name: m.Name, Step: d.Step, Reason: d.Reason, Deadline: d.Deadline,
		Policy: c.cfg.Remediation.DrainPolicy, AckPath: "/v1/machines/" + m.ID + "/drain/ack"}
	if m.Claim != nil {
		req.Hostname, req.Role = m.Claim.Hostname, m.Claim.Role
	}
	body, _ := json.Marshal(req)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, c.cfg.Remediation.WebhookTimeout)
		defer cancel()
		result := ""
		hr, err := http.NewRequestWithContext(cctx, http.MethodPost, d.Webhook, bytes.NewReader(body))
		if err == nil {
			hr.Header.Set("Content-Type", "application/json")
			var resp *http.Response
			if resp, err = c.httpc.Do(hr); err == nil {
				resp.Body.Close()
				result = resp.Status
			}
		}
		if err != nil {
			result = "error: " + truncate(sanitize(err.Error()), 200)
		}
		wctx, wcancel := afterStop(ctx)
		defer wcancel()
		_, uerr := c.update(wctx, m.ID, store.W{Actor: ActorRemediation, Reason: ReasonDrainWebhook, Message: result}, func(x *store.Machine) error {
			if x.Drain == nil || !x.Drain.Requested.Equal(d.Requested) {
				return errNoChange
			}
			x.Drain.WebhookResult = result
			return nil
		})
		if uerr != nil {
			c.logger().Warn("record drain webhook", "machine", m.ID, "err", uerr)
		}
	}()
}

// DrainAck records the owner's acknowledgement of machine id's drain
// request (POST /v1/machines/{id}/drain/ack): the ladder — or the
// campaign, for a drain of a campaign's firmware or bios change (step
// "campaign/<id>") — goes on with the step that waited at the next tick.
// Errors: *StateError (no drain is pending: none asked, already
// acknowledged, or the ladder moved on), store errors.
func (c *Controller) DrainAck(ctx context.Context, id string, w store.W) (store.Machine, error) {
	w = withDefaults(w, ReasonDrainAcked)
	now := c.now()
	return c.update(ctx, id, w, func(m *store.Machine) error {
		r := m.Remediation
		campaign := m.Drain != nil && strings.HasPrefix(m.Drain.Step, "campaign/")
		if m.Drain == nil || !m.Drain.Acked.IsZero() || (!campaign && (r == nil || r.Outcome != "" || r.Step != StepDrain)) {
			return &StateError{Op: "drain ack (no drain pending)", Machine: id, State: m.State, Want: []store.MachineState{store.StateRemediating}}
		}
		m.Drain.Acked, m.Drain.AckedBy = now, w.Actor
		return nil
	})
}

// drainMessage describes d for the ladder's step record.
func drainMessage(d *store.Drain, policy string) string {
	switch {
	case d == nil:
		return "no drain asked"
	case !d.Acked.IsZero():
		return fmt.Sprintf("drain acknowledged by %s", d.AckedBy)
	default:
		return fmt.Sprintf("drain not acknowledged by %s; policy %s", d.Deadline.Format(time.RFC3339), policy)
	}
}
