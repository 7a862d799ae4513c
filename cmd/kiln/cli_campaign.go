package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"kiln/api"
	"kiln/api/client"
	"kiln/appliance/lifecycle/waves"
)

// Campaigns (issue 17): `kiln campaign plan|create|start|status|halt|resume`
// (appliance/lifecycle/DESIGN.md "Campaigns").

func campaignCmd(o *cliOpts) *cobra.Command {
	c := &cobra.Command{Use: "campaign", Short: "Roll a change (OS image, firmware, BIOS) over selected machines in waves that halt on failure"}
	c.AddCommand(campaignPlanCmd(o))
	c.AddCommand(campaignAPICmds(o)...)
	return c
}

// planFlags are the flags shared by plan and create.
type planFlags struct {
	fleet, action, image, baseline string
	labels, claims, racks, sites   []string
	bios                           map[string]string
	percent                        float64
	perRack, maxParallel, maxFail  int
	serial                         bool
}

func (p *planFlags) add(c *cobra.Command) {
	f := c.Flags()
	f.StringVar(&p.action, "action", "os_image", "the change: os_image, firmware or bios")
	f.StringVar(&p.image, "image", "", "os_image: the image ID the claims move to")
	f.StringVar(&p.baseline, "baseline", "", "firmware: the baseline to bring the machines to")
	f.StringToStringVar(&p.bios, "bios", nil, "bios: attributes to set, NAME=VALUE,…")
	f.StringSliceVar(&p.labels, "label", nil, "select machines with label KEY=VALUE (repeatable)")
	f.StringSliceVar(&p.claims, "claim", nil, "select machines holding a claim of this role (repeatable)")
	f.StringSliceVar(&p.racks, "rack", nil, "select machines of this rack ID (repeatable)")
	f.StringSliceVar(&p.sites, "site", nil, "select machines of this site ID (repeatable)")
	f.Float64Var(&p.percent, "cluster-percent", waves.DefaultClusterPercent, "at most this % of any claim's machines out at once (at least 1)")
	f.IntVar(&p.perRack, "per-rack", waves.DefaultPerRack, "at most this many machines of one rack out at once")
	f.IntVar(&p.maxFail, "max-failures", 0, "halt when more machines than this have failed")
}

// request is the API request of the flags.
func (p *planFlags) request(name string) api.CampaignRequest {
	sel := api.CampaignSelector{Claims: p.claims, Racks: p.racks, Sites: p.sites}
	for _, kv := range p.labels {
		k, v, _ := strings.Cut(kv, "=")
		if sel.Labels == nil {
			sel.Labels = map[string]string{}
		}
		sel.Labels[k] = v
	}
	return api.CampaignRequest{Name: name, Action: p.action, Image: p.image, Baseline: p.baseline, BIOS: p.bios, Selector: sel,
		Limits: api.CampaignLimits{ClusterPercent: p.percent, PerRack: p.perRack, MaxFailures: p.maxFail, MaxParallel: p.maxParallel}}
}

func campaignPlanCmd(o *cliOpts) *cobra.Command {
	var p planFlags
	c := &cobra.Command{
		Use:   "plan",
		Short: "Compute the waves and the time to finish: of the selected machines (through the API), or of a synthetic fleet (--fleet, offline)",
		Long: `Compute a campaign's waves and its time to finish.

With --fleet the fleet is synthetic and the plan is computed here, without a server:
  kiln campaign plan --fleet sites=6,racks=50,per-rack=40,clusters=4
(layout=packed, the default, racks a cluster's machines together; layout=striped puts every
cluster in every rack). Step durations are then the stated defaults.

Without --fleet the server plans the machines the selector picks, with the step durations it
has measured (recent drains, reinspections and reprovisions) where it has them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if p.fleet == "" {
				return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.CampaignPlan, error) {
					return cl.PlanCampaign(ctx, p.request("plan"))
				}, planTable)
			}
			f, err := waves.ParseFleet(p.fleet)
			if err != nil {
				return err
			}
			if p.action != "os_image" && p.action != "firmware" && p.action != "bios" {
				return fmt.Errorf("--action %q: want os_image, firmware or bios", p.action)
			}
			plan := waves.Compute(f.Machines(), nil, waves.Limits{ClusterPercent: p.percent, PerRack: p.perRack, MaxParallel: p.maxParallel},
				waves.DefaultSteps(p.action), !p.serial)
			v := api.PlanView(plan, p.maxFail)
			return render(cmd.OutOrStdout(), o.output, v, planTable(v))
		},
	}
	p.add(c)
	c.Flags().StringVar(&p.fleet, "fleet", "", "plan a synthetic fleet offline: sites=N,racks=N,per-rack=N,clusters=N[,layout=packed|striped] (racks and clusters per site)")
	c.Flags().IntVar(&p.maxParallel, "max-parallel", 0, "at most this many machines of one site at once (0: no bound)")
	c.Flags().BoolVar(&p.serial, "sites-serial", false, "one site after another (default: every site at once)")
	return c
}

func planTable(v api.CampaignPlan) func(*tabwriter.Writer) {
	return func(tw *tabwriter.Writer) {
		row(tw, "MACHINES:", strconv.Itoa(v.Machines))
		row(tw, "LIMITS:", fmt.Sprintf("%g%% of a cluster (at least 1), %d per rack", v.Limits.ClusterPercent, v.Limits.PerRack))
		mode := "in parallel (each site its own waves)"
		if !v.SitesParallel {
			mode = "one after another"
		}
		row(tw, "SITES:", fmt.Sprintf("%d, %s", len(v.Sites), mode))
		for _, s := range v.Steps {
			row(tw, "STEP:", s.Name, s.Duration, s.Source)
		}
		row(tw, "WAVE:", v.WaveDuration+" (the steps in sequence; a wave's machines in parallel)")
		row(tw, "WAVES:", strconv.Itoa(v.Waves))
		row(tw, "CRITICAL PATH:", v.CriticalPath)
		row(tw, "TOTAL:", v.Total)
		row(tw, "")
		row(tw, "SITE", "MACHINES", "RACKS", "CLUSTERS", "WAVES", "LOWER BOUND", "LARGEST WAVE", "TIME", "BINDING")
		for _, s := range v.Sites {
			row(tw, dash(s.Site), strconv.Itoa(s.Machines), strconv.Itoa(s.Racks), strconv.Itoa(s.Groups), strconv.Itoa(s.Waves),
				strconv.Itoa(s.LowerBound), strconv.Itoa(s.MaxWave), s.Total, s.Binding)
		}
	}
}

// campaignAPICmds are the commands over /v1/campaigns: create, start,
// status, halt, resume.
func campaignAPICmds(o *cliOpts) []*cobra.Command {
	var p planFlags
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a campaign: the selected machines with their waves (planned; nothing is touched until `kiln campaign start`)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Campaign, error) {
				return cl.CreateCampaign(ctx, p.request(args[0]))
			}, campaignTable)
		},
	}
	p.add(create)
	var reason, message string
	why := func(c *cobra.Command) *cobra.Command {
		c.Flags().StringVar(&reason, "reason", "", "why (recorded in the event log)")
		c.Flags().StringVar(&message, "message", "", "free-text note")
		return c
	}
	act := func(use, short string, f func(*client.Client, context.Context, string, api.ActionRequest) (api.Campaign, error)) *cobra.Command {
		return why(&cobra.Command{
			Use: use + " NAME", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Campaign, error) {
					return f(cl, ctx, args[0], api.ActionRequest{Reason: reason, Message: message})
				}, campaignTable)
			},
		})
	}
	status := &cobra.Command{
		Use:   "status [NAME]",
		Short: "Show a campaign (its waves and every machine), or list the campaigns",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return show(o, cmd, func(ctx context.Context, cl *client.Client) ([]api.Campaign, error) {
					return cl.ListCampaigns(ctx)
				}, campaignsTable)
			}
			return show(o, cmd, func(ctx context.Context, cl *client.Client) (api.Campaign, error) {
				return cl.GetCampaign(ctx, args[0])
			}, campaignTable)
		},
	}
	return []*cobra.Command{create, status,
		act("start", "Start a planned campaign: the leader takes its waves", (*client.Client).StartCampaign),
		act("halt", "Halt a campaign: no further machine is taken out (those out finish)", (*client.Client).HaltCampaign),
		act("resume", "Resume a halted campaign (its failures are forgotten; failed machines are not tried again)", (*client.Client).ResumeCampaign),
	}
}

func campaignsTable(list []api.Campaign) func(*tabwriter.Writer) {
	return func(tw *tabwriter.Writer) {
		row(tw, "ID", "NAME", "ACTION", "STATE", "WAVE", "MACHINES", "DONE", "FAILED", "ACTIVE")
		for _, c := range list {
			row(tw, c.ID, c.Name, c.Action, c.State, fmt.Sprintf("%d/%d", c.Wave, c.Waves), strconv.Itoa(len(c.Machines)),
				strconv.Itoa(c.Counts["done"]), strconv.Itoa(c.Counts["failed"]), strconv.Itoa(c.Counts["active"]))
		}
	}
}

func campaignTable(c api.Campaign) func(*tabwriter.Writer) {
	return func(tw *tabwriter.Writer) {
		row(tw, "CAMPAIGN:", c.Name+" ("+c.ID+")")
		target := c.Image
		switch c.Action {
		case "firmware":
			target = c.Baseline
		case "bios":
			var kv []string
			for k, v := range c.BIOS {
				kv = append(kv, k+"="+v)
			}
			target = strings.Join(kv, ",")
		}
		row(tw, "CHANGE:", c.Action+" "+target)
		row(tw, "LIMITS:", fmt.Sprintf("%g%% of a claim (at least 1), %d per rack, halt above %d failures", c.Limits.ClusterPercent, c.Limits.PerRack, c.Limits.MaxFailures))
		row(tw, "STATE:", c.State+" "+dash(c.Message))
		row(tw, "WAVE:", fmt.Sprintf("%d of %d", c.Wave, c.Waves))
		row(tw, "MACHINES:", fmt.Sprintf("%d: %d done, %d active, %d pending, %d failed, %d skipped", len(c.Machines), c.Counts["done"],
			c.Counts["active"], c.Counts["pending"], c.Counts["failed"], c.Counts["skipped"]))
		row(tw, "")
		row(tw, "WAVE", "MACHINE", "RACK", "CLAIM", "STATE", "STARTED", "ENDED", "WHY")
		t := func(x time.Time) string {
			if x.IsZero() {
				return "-"
			}
			return x.Format(time.RFC3339)
		}
		for _, m := range c.Machines {
			row(tw, strconv.Itoa(m.Wave), m.ID, dash(m.Rack), dash(m.Group), m.State, t(m.Started), t(m.Ended), dash(m.Why))
		}
	}
}
