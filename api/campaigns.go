package api

import (
	"time"

	"kiln/appliance/lifecycle/waves"
)

// CampaignStep is one step of changing one machine and its duration.
type CampaignStep struct {
	Name     string  `json:"name"`
	Duration string  `json:"duration"` // Go duration, e.g. "17m0s"
	Seconds  float64 `json:"seconds"`
	Source   string  `json:"source"` // "default" or "measured: …"
}

// CampaignLimits are a campaign's limits (at most ClusterPercent of any
// claim, at least 1; at most PerRack of one rack; MaxFailures failures
// before the campaign halts; MaxParallel per site, planner only, 0: none).
type CampaignLimits struct {
	ClusterPercent float64 `json:"cluster_percent"`
	PerRack        int     `json:"per_rack"`
	MaxFailures    int     `json:"max_failures"`
	MaxParallel    int     `json:"max_parallel,omitempty"`
}

// CampaignSitePlan is one site's share of a plan: its waves, the fewest
// any plan can have (lower_bound) and the limit that sets it (binding).
type CampaignSitePlan struct {
	Site       string  `json:"site"`
	Machines   int     `json:"machines"`
	Racks      int     `json:"racks"`
	Groups     int     `json:"groups"`
	Waves      int     `json:"waves"`
	LowerBound int     `json:"lower_bound"`
	Binding    string  `json:"binding"`
	MaxWave    int     `json:"max_wave"`
	Total      string  `json:"total"`
	Seconds    float64 `json:"seconds"`
}

// CampaignPlan is the planner's answer (POST /v1/campaigns/plan, `kiln
// campaign plan`): the waves and the time to finish.
type CampaignPlan struct {
	Machines      int                `json:"machines"`
	Limits        CampaignLimits     `json:"limits"`
	Steps         []CampaignStep     `json:"steps"`
	WaveDuration  string             `json:"wave_duration"`
	WaveSeconds   float64            `json:"wave_seconds"`
	SitesParallel bool               `json:"sites_parallel"`
	Waves         int                `json:"waves"`
	Total         string             `json:"total"`
	TotalSeconds  float64            `json:"total_seconds"`
	CriticalPath  string             `json:"critical_path"`
	Sites         []CampaignSitePlan `json:"sites"`
}

// PlanView is the wire form of a computed plan (maxFailures is the
// campaign's, which the planner does not use).
func PlanView(p waves.Plan, maxFailures int) CampaignPlan {
	d := func(t time.Duration) string { return waves.FormatDuration(t) }
	out := CampaignPlan{Machines: p.Machines, Limits: CampaignLimits{ClusterPercent: p.Limits.ClusterPercent, PerRack: p.Limits.PerRack,
		MaxFailures: maxFailures, MaxParallel: p.Limits.MaxParallel},
		Steps: []CampaignStep{}, WaveDuration: d(p.WaveDuration), WaveSeconds: p.WaveDuration.Seconds(), SitesParallel: p.SitesParallel,
		Waves: p.Waves, Total: d(p.Total), TotalSeconds: p.Total.Seconds(), CriticalPath: p.CriticalPath, Sites: []CampaignSitePlan{}}
	for _, s := range p.Steps {
		out.Steps = append(out.Steps, CampaignStep{Name: s.Name, Duration: d(s.Duration), Seconds: s.Duration.Seconds(), Source: s.Source})
	}
	for _, s := range p.Sites {
		out.Sites = append(out.Sites, CampaignSitePlan{Site: s.Site, Machines: s.Machines, Racks: s.Racks, Groups: s.Groups, Waves: s.Waves,
			LowerBound: s.LowerBound, Binding: s.Binding, MaxWave: s.MaxWave, Total: d(s.Total), Seconds: s.Total.Seconds()})
	}
	return out
}
