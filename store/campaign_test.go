package store

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// put_campaign (36): compare-and-set of a campaign record, with an event
// on create, on each state change and for each machine whose campaign
// state changed (the history the wave limits are checked against).
func TestPutCampaign(t *testing.T) {
	db := testDB(t)
	w := W{Actor: "api:alice", Reason: "campaign_created"}
	c := &Campaign{Meta: Meta{ID: "cmp-1"}, Name: "os-2", Action: CampaignActionOSImage, Image: "img-1", State: CampaignPlanned,
		Limits: CampaignLimits{ClusterPercent: 5, PerRack: 2}, Waves: 2,
		Machines: []CampaignMachine{{ID: "m-1", Rack: "r1", Group: "web", Wave: 1, State: CampaignMachinePending},
			{ID: "m-2", Rack: "r1", Group: "web", Wave: 2, State: CampaignMachinePending}}}
	vals, err := run(t, db, 1, &command{Type: CmdPutCampaign, W: w, Campaign: c})
	if err != nil || len(vals) != 1 {
		t.Fatal(err, len(vals))
	}
	var got Campaign
	if err := json.Unmarshal(vals[0], &got); err != nil || got.ResourceVersion != 1 || len(got.Machines) != 2 {
		t.Fatalf("%v %+v", err, got)
	}
	// A stale version is refused; so are an unknown action and a repeated machine.
	stale := got
	stale.ResourceVersion = 7
	if _, err := run(t, db, 2, &command{Type: CmdPutCampaign, W: w, Campaign: &stale}); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale resource_version: %v", err)
	}
	bad := got
	bad.Action = "nic"
	if _, err := run(t, db, 3, &command{Type: CmdPutCampaign, W: w, Campaign: &bad}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad action: %v", err)
	}
	bad = got
	bad.Machines = []CampaignMachine{got.Machines[0], got.Machines[0]}
	if _, err := run(t, db, 4, &command{Type: CmdPutCampaign, W: w, Campaign: &bad}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("repeated machine: %v", err)
	}
	next := got
	next.Machines = append([]CampaignMachine{}, got.Machines...)
	next.State, next.Wave = CampaignRunning, 1
	next.Machines[0].State = CampaignMachineActive
	if _, err := run(t, db, 5, &command{Type: CmdPutCampaign, W: W{Actor: "controller:campaign", Reason: "campaign_wave"}, Campaign: &next}); err != nil {
		t.Fatal(err)
	}
	var evs []string
	for _, ev := range allEvents(t, db) {
		if ev.Subject == "campaign/cmp-1" {
			evs = append(evs, ev.Kind+":"+ev.From+">"+ev.To+":"+strings.Fields(ev.Message + " x")[0])
		}
	}
	want := "campaign_created:>planned:os-2 campaign_running:planned>running:x campaign_machine:pending>active:machine=m-1"
	if strings.Join(evs, " ") != want {
		t.Fatalf("events\n got %s\nwant %s", strings.Join(evs, " "), want)
	}
	if CmdPutCampaign != 36 || CmdPutCampaign.String() != "put_campaign" {
		t.Fatalf("command number %d %s", CmdPutCampaign, CmdPutCampaign)
	}
}
