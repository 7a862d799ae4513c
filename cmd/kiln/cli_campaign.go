package main

import (
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"kiln/api"
	"kiln/appliance/lifecycle/waves"
)

// Campaigns (issue 17): `kiln campaign plan|create|start|status|halt|resume`
// (appliance/lifecycle/DESIGN.md "Campaigns").

func campaignCmd(o *cliOpts) *cobra.Command {
	c := &cobra.Command{Use: "campaign", Short: "Roll a change (OS image, firmware, BIOS) over selected machines in waves that halt on failure"}
	c.AddCommand(campaignPlanCmd(o))
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
				return fmt.Errorf("plan: --fleet is required in this build (the server-side plan comes with /v1/campaigns)")
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
