package store

import (
	"encoding/json"
	"fmt"
	"time"
)

// Campaigns (issue 17): a change rolled over selected machines in waves
// (appliance/lifecycle/DESIGN.md "Campaigns"). The record lives in bucket
// campaigns, one per campaign ID, written only by command 36
// (put_campaign, compare-and-set): the lifecycle's campaign controller
// runs on the leader and keeps its whole state here (which machine is in
// which wave, started when, done or failed), so a new leader resumes it
// from the record alone.

// Campaign states.
const (
	CampaignPlanned   = "planned"   // created; nothing touched yet
	CampaignRunning   = "running"   // waves are being taken
	CampaignHalted    = "halted"    // failures above the threshold, or an operator: no machine is started
	CampaignCompleted = "completed" // every machine done, failed or skipped
)

// Campaign machine states.
const (
	CampaignMachinePending = "pending" // not started
	CampaignMachineActive  = "active"  // taken out: drained, the change being applied
	CampaignMachineDone    = "done"    // healthy again with the change
	CampaignMachineFailed  = "failed"  // the change failed on it (Why)
	CampaignMachineSkipped = "skipped" // never started (Why: maintenance, no claim, left the selection)
)

// Campaign actions.
const (
	CampaignActionOSImage  = "os_image" // the claim's image changes to Image; each machine is reprovisioned
	CampaignActionFirmware = "firmware" // the machine's firmware is brought to Baseline (through the BMC)
	CampaignActionBIOS     = "bios"     // the BIOS attributes BIOS are set (through the BMC)
)

// Campaign is one campaign's record (command 36).
type Campaign struct {
	Meta
	Name   string `json:"name"`
	Action string `json:"action"`
	// Image is the target image ID (os_image).
	Image string `json:"image,omitempty"`
	// Baseline names the target firmware baseline (firmware).
	Baseline string `json:"baseline,omitempty"`
	// BIOS is the BIOS attributes to set (bios).
	BIOS     map[string]string `json:"bios,omitempty"`
	Selector CampaignSelector  `json:"selector"`
	Limits   CampaignLimits    `json:"limits"`

	State   string `json:"state"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Wave is the wave in progress (1-based; 0 before the first). Waves is
	// how many the plan has.
	Wave  int `json:"wave"`
	Waves int `json:"waves"`
	// Failures counts the machines failed since the start or the last
	// resume; above Limits.MaxFailures the campaign halts.
	Failures  int               `json:"failures"`
	Machines  []CampaignMachine `json:"machines"`
	StartedAt time.Time         `json:"started_at,omitempty"`
	HaltedAt  time.Time         `json:"halted_at,omitempty"`
	EndedAt   time.Time         `json:"ended_at,omitempty"`
}

// CampaignSelector picks the machines: every non-empty field must match
// (labels all equal; claim role, rack and site one of the lists).
type CampaignSelector struct {
	Labels map[string]string `json:"labels,omitempty"`
	Claims []string          `json:"claims,omitempty"` // claim roles
	Racks  []string          `json:"racks,omitempty"`
	Sites  []string          `json:"sites,omitempty"`
}

// CampaignLimits bound what is out of service at once. ClusterPercent:
// at most this percentage of any claim's machines (by role), at least 1;
// PerRack: at most this many machines of one rack; MaxFailures: the
// campaign halts when more machines than this have failed.
type CampaignLimits struct {
	ClusterPercent float64 `json:"cluster_percent"`
	PerRack        int     `json:"per_rack"`
	MaxFailures    int     `json:"max_failures"`
}

// CampaignMachine is one selected machine's place in the campaign. Group
// is its claim's role; BaseAttempt the machine's remediation attempt
// number when the campaign took it (a run with a higher number is the
// campaign's).
type CampaignMachine struct {
	ID          string    `json:"id"`
	Site        string    `json:"site,omitempty"`
	Rack        string    `json:"rack,omitempty"`
	Group       string    `json:"group,omitempty"`
	Wave        int       `json:"wave"`
	State       string    `json:"state"`
	BaseAttempt int       `json:"base_attempt,omitempty"`
	Started     time.Time `json:"started,omitempty"`
	Ended       time.Time `json:"ended,omitempty"`
	Why         string    `json:"why,omitempty"`
	// Step and StepAt are the firmware and bios actions' progress on the
	// machine (drain, apply, settle) and when it began.
	Step   string    `json:"step,omitempty"`
	StepAt time.Time `json:"step_at,omitempty"`
}

var campaignStates = map[string]bool{CampaignPlanned: true, CampaignRunning: true, CampaignHalted: true, CampaignCompleted: true}
var campaignMachineStates = map[string]bool{CampaignMachinePending: true, CampaignMachineActive: true,
	CampaignMachineDone: true, CampaignMachineFailed: true, CampaignMachineSkipped: true}

// validCampaign is the store's check of a campaign record (the lifecycle
// checks the rest: the image exists, the limits are sane).
func validCampaign(c *Campaign) error {
	if c.ID == "" || c.Name == "" {
		return fmt.Errorf("%w: campaign needs id and name", ErrInvalid)
	}
	switch c.Action {
	case CampaignActionOSImage, CampaignActionFirmware, CampaignActionBIOS:
	default:
		return fmt.Errorf("%w: campaign %s: action %q: want os_image, firmware or bios", ErrInvalid, c.ID, c.Action)
	}
	if !campaignStates[c.State] {
		return fmt.Errorf("%w: campaign %s: state %q", ErrInvalid, c.ID, c.State)
	}
	seen := map[string]bool{}
	for i, m := range c.Machines {
		if m.ID == "" || seen[m.ID] || !campaignMachineStates[m.State] {
			return fmt.Errorf("%w: campaign %s: machine %d (%q, state %q): empty, repeated or unknown state", ErrInvalid, c.ID, i, m.ID, m.State)
		}
		seen[m.ID] = true
	}
	return nil
}

// putCampaign is CmdPutCampaign: compare-and-set of the campaign record,
// with events for what changed: "campaign_created" on create, the
// campaign's state change (kind "campaign_" + the new state: running,
// halted, completed), and one "campaign_machine" event per machine whose
// campaign state changed (From/To the states, Message
// "machine=… rack=… group=… wave=…") — the history the limits are checked
// against.
func putCampaign(a *applyCtx, c *Campaign) ([]byte, error) {
	if err := validCampaign(c); err != nil {
		return nil, err
	}
	old, err := casPrepare[Campaign](a, bCampaigns, "campaign", c)
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	if err := a.tx.Bucket(bCampaigns).Put([]byte(c.ID), raw); err != nil {
		return nil, err
	}
	subj := "campaign/" + c.ID
	if old == nil {
		if err := a.event(Event{Subject: subj, Kind: "campaign_created", To: c.State, Message: c.Name}); err != nil {
			return nil, err
		}
	} else if old.State != c.State {
		if err := a.event(Event{Subject: subj, Kind: "campaign_" + c.State, From: old.State, To: c.State,
			Reason: orStr(a.w.Reason, c.Reason), Message: orStr(a.w.Message, c.Message)}); err != nil {
			return nil, err
		}
	}
	was := map[string]string{}
	if old != nil {
		for _, m := range old.Machines {
			was[m.ID] = m.State
		}
	}
	for _, m := range c.Machines {
		from, ok := was[m.ID]
		if ok && from == m.State {
			continue
		}
		if !ok && m.State == CampaignMachinePending {
			continue // the plan itself: no event per machine
		}
		ev := Event{Subject: subj, Kind: "campaign_machine", From: from, To: m.State, Reason: orStr(a.w.Reason, ""),
			Message: fmt.Sprintf("machine=%s rack=%s group=%s wave=%d", m.ID, m.Rack, m.Group, m.Wave)}
		if m.Why != "" {
			ev.Message += " why=" + m.Why
		}
		if len(ev.Message) > 512 {
			ev.Message = ev.Message[:512]
		}
		if err := a.event(ev); err != nil {
			return nil, err
		}
	}
	return raw, nil
}
