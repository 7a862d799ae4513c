// Package waves is the campaign planner (issue 17): it splits the machines
// a campaign selects into waves that keep to the campaign's limits — at
// most a percentage of any claim's machines (a cluster) and at most so
// many machines of one rack out of service at once — and computes how long
// the campaign takes from per-step durations. It is pure (no store, no
// clock): the lifecycle's campaign controller uses it for the wave of each
// machine, `kiln campaign plan` and POST /v1/campaigns/plan for the
// estimate, and `kiln campaign plan --fleet` for a synthetic fleet. The
// arithmetic is explained in appliance/lifecycle/DESIGN.md "Campaigns".
package waves

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// Default limits (the requirement's): 5 % of a claim, 2 per rack.
const (
	DefaultClusterPercent = 5.0
	DefaultPerRack        = 2
)

// Machine is one machine to change: its site, rack and group (the claim
// role, the "cluster" whose share out of service is limited).
type Machine struct {
	ID    string `json:"id"`
	Site  string `json:"site,omitempty"`
	Rack  string `json:"rack,omitempty"`
	Group string `json:"group,omitempty"`
}

// Limits bound what is out of service at once. ClusterPercent of a
// group's machines (rounded down, at least 1); PerRack machines of one
// rack (0: DefaultPerRack); MaxParallel machines of one site (0: no bound).
type Limits struct {
	ClusterPercent float64 `json:"cluster_percent"`
	PerRack        int     `json:"per_rack"`
	MaxParallel    int     `json:"max_parallel,omitempty"`
}

// WithDefaults fills the zero fields with the defaults.
func (l Limits) WithDefaults() Limits {
	if l.ClusterPercent <= 0 {
		l.ClusterPercent = DefaultClusterPercent
	}
	if l.PerRack <= 0 {
		l.PerRack = DefaultPerRack
	}
	return l
}

// GroupCap is how many of a group of size machines may be out at once:
// ClusterPercent of size rounded down, at least 1. The small epsilon
// keeps 5 % of 500 at 25 despite binary floating point.
func (l Limits) GroupCap(size int) int {
	l = l.WithDefaults()
	n := int(math.Floor(l.ClusterPercent*float64(size)/100 + 1e-9))
	return max(n, 1)
}

// Step is one step of changing one machine, with its duration and where
// the duration comes from ("measured: median of N …" or "default").
type Step struct {
	Name     string        `json:"name"`
	Duration time.Duration `json:"duration"`
	Source   string        `json:"source"`
}

// DefaultSteps is the stated default duration of each step of an action
// (os_image, firmware, bios), used when Kiln has measured none: drain =
// the remediation drain timeout (10 m, the bound when an owner does not
// acknowledge); reinspect = PXE boot into the agent and inspection (5 m);
// reprovision = the gated build, the boot of the new disk and the settle
// time (12 m + 3 m + 2 m); firmware = an UpdateService task and the
// reset that applies it (20 m + 5 m); bios = the settings applied on reset
// and read back (8 m); settle = remediation settle (2 m).
func DefaultSteps(action string) []Step {
	d := func(n string, m int) Step {
		return Step{Name: n, Duration: time.Duration(m) * time.Minute, Source: "default"}
	}
	switch action {
	case "firmware":
		return []Step{d("drain", 10), d("firmware", 25), d("settle", 2)}
	case "bios":
		return []Step{d("drain", 10), d("bios", 8), d("settle", 2)}
	}
	return []Step{d("drain", 10), d("reinspect", 5), d("reprovision", 17)}
}

// StepsDuration is the sum of steps: one machine's time out of service,
// and so one wave's (a wave's machines run in parallel).
func StepsDuration(steps []Step) time.Duration {
	var t time.Duration
	for _, s := range steps {
		t += s.Duration
	}
	return t
}

// SitePlan is one site's share of a plan.
type SitePlan struct {
	Site     string `json:"site"`
	Machines int    `json:"machines"`
	Racks    int    `json:"racks"`
	Groups   int    `json:"groups"`
	Waves    int    `json:"waves"`
	// LowerBound is the fewest waves any plan can have: the largest of
	// ceil(group size / group cap), ceil(rack size / per rack) and
	// ceil(machines / max parallel). Binding names what sets it.
	LowerBound int    `json:"lower_bound"`
	Binding    string `json:"binding"`
	// MaxWave is the largest wave's size; Total the site's time.
	MaxWave int           `json:"max_wave"`
	Total   time.Duration `json:"total"`
}

// Plan is a computed campaign plan.
type Plan struct {
	Machines      int           `json:"machines"`
	Limits        Limits        `json:"limits"`
	Steps         []Step        `json:"steps"`
	WaveDuration  time.Duration `json:"wave_duration"`
	SitesParallel bool          `json:"sites_parallel"`
	Sites         []SitePlan    `json:"sites"`
	// Waves is the campaign's wave count: the most of any site when sites
	// run in parallel, their sum otherwise. Total is Waves × WaveDuration.
	Waves int           `json:"waves"`
	Total time.Duration `json:"total"`
	// CriticalPath names the chain that sets Total: the site with the
	// most waves (parallel) or every site in turn (serial), and within it
	// the group or rack that forces the waves.
	CriticalPath string `json:"critical_path"`
	// Assign is each machine's wave (1-based, within its site).
	Assign map[string]int `json:"-"`
}

// Compute plans ms under l with steps. groupSize is the size of each
// group (keyed site + "/" + group) counting every machine of the claim,
// selected or not; nil or a missing key: the selected machines of it.
func Compute(ms []Machine, groupSize map[string]int, l Limits, steps []Step, sitesParallel bool) Plan {
	l = l.WithDefaults()
	p := Plan{Machines: len(ms), Limits: l, Steps: steps, WaveDuration: StepsDuration(steps), SitesParallel: sitesParallel,
		Assign: make(map[string]int, len(ms))}
	bySite := map[string][]Machine{}
	for _, m := range ms {
		bySite[m.Site] = append(bySite[m.Site], m)
	}
	sites := make([]string, 0, len(bySite))
	for s := range bySite {
		sites = append(sites, s)
	}
	sort.Strings(sites)
	crit := -1
	for _, s := range sites {
		sp := planSite(s, bySite[s], groupSize, l, p.Assign)
		sp.Total = time.Duration(sp.Waves) * p.WaveDuration
		p.Sites = append(p.Sites, sp)
		if sitesParallel {
			if sp.Waves > p.Waves {
				p.Waves, crit = sp.Waves, len(p.Sites)-1
			}
		} else {
			p.Waves += sp.Waves
		}
	}
	p.Total = time.Duration(p.Waves) * p.WaveDuration
	switch {
	case len(p.Sites) == 0:
		p.CriticalPath = "no machines selected"
	case sitesParallel:
		sp := p.Sites[crit]
		p.CriticalPath = fmt.Sprintf("site %s: %d waves × %s (%s)", siteName(sp.Site), sp.Waves, fmtDur(p.WaveDuration), sp.Binding)
	default:
		parts := make([]string, len(p.Sites))
		for i, sp := range p.Sites {
			parts[i] = fmt.Sprintf("%s %d", siteName(sp.Site), sp.Waves)
		}
		p.CriticalPath = fmt.Sprintf("every site in turn (waves %s) × %s", strings.Join(parts, " + "), fmtDur(p.WaveDuration))
	}
	return p
}

func siteName(s string) string {
	if s == "" {
		return "(this site)"
	}
	return s
}

// planSite assigns the waves of one site's machines: a greedy fill, each
// wave taking first the machines whose group or rack needs the most waves
// still (so the binding constraint is never left for last), within the
// group caps, the per-rack limit and MaxParallel.
func planSite(site string, ms []Machine, groupSize map[string]int, l Limits, assign map[string]int) SitePlan {
	gkey := func(m Machine) string { return m.Site + "/" + m.Group }
	remG, remR := map[string]int{}, map[string]int{}
	for _, m := range ms {
		remG[gkey(m)]++
		remR[m.Rack]++
	}
	capG := map[string]int{}
	for g, n := range remG {
		size := n
		if s, ok := groupSize[g]; ok && s >= n {
			size = s
		}
		capG[g] = l.GroupCap(size)
	}
	sp := SitePlan{Site: site, Machines: len(ms), Racks: len(remR), Groups: len(remG)}
	// The lower bound and what sets it.
	names := func(m map[string]int) []string {
		out := make([]string, 0, len(m))
		for k := range m {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	var gW, rW, pW int
	var gWhy, rWhy, pWhy string
	for _, g := range names(remG) {
		if w := ceilDiv(remG[g], capG[g]); w > gW {
			gW, gWhy = w, fmt.Sprintf("cluster %s: %d machines, %g%% = %d out at once → %d waves",
				strings.TrimPrefix(g, site+"/"), remG[g], l.ClusterPercent, capG[g], w)
		}
	}
	for _, r := range names(remR) {
		if w := ceilDiv(remR[r], l.PerRack); w > rW {
			rW, rWhy = w, fmt.Sprintf("rack %s: %d machines, %d out at once → %d waves", r, remR[r], l.PerRack, w)
		}
	}
	if l.MaxParallel > 0 {
		pW = ceilDiv(len(ms), l.MaxParallel)
		pWhy = fmt.Sprintf("max parallel %d of %d machines → %d waves", l.MaxParallel, len(ms), pW)
	}
	sp.LowerBound = max(gW, rW, pW)
	var why []string
	for _, b := range []struct {
		w   int
		why string
	}{{gW, gWhy}, {rW, rWhy}, {pW, pWhy}} {
		if b.w == sp.LowerBound && b.w > 0 {
			why = append(why, b.why)
		}
	}
	sp.Binding = strings.Join(why, "; ")
	pending := append([]Machine(nil), ms...)
	sort.Slice(pending, func(i, j int) bool { return pending[i].ID < pending[j].ID })
	for wave := 1; len(pending) > 0; wave++ {
		need := func(m Machine) float64 {
			return math.Max(float64(remG[gkey(m)])/float64(capG[gkey(m)]), float64(remR[m.Rack])/float64(l.PerRack))
		}
		sort.SliceStable(pending, func(i, j int) bool { return need(pending[i]) > need(pending[j]) })
		inG, inR := map[string]int{}, map[string]int{}
		taken := 0
		rest := pending[:0:0]
		for _, m := range pending {
			g := gkey(m)
			if inG[g] >= capG[g] || inR[m.Rack] >= l.PerRack || (l.MaxParallel > 0 && taken >= l.MaxParallel) {
				rest = append(rest, m)
				continue
			}
			inG[g]++
			inR[m.Rack]++
			taken++
			assign[m.ID] = wave
		}
		for _, m := range pending {
			if assign[m.ID] == wave {
				remG[gkey(m)]--
				remR[m.Rack]--
			}
		}
		sp.MaxWave = max(sp.MaxWave, taken)
		sp.Waves = wave
		pending = rest
	}
	if sp.Binding == "" {
		sp.Binding = "no limit binds"
	}
	return sp
}

func ceilDiv(a, b int) int {
	if b <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

// fmtDur prints d as "10h40m" (minutes, no seconds when whole).
func fmtDur(d time.Duration) string {
	s := d.Round(time.Second).String()
	s = strings.TrimSuffix(s, "0s")
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// FormatDuration is fmtDur for callers (the CLI's tables).
func FormatDuration(d time.Duration) string { return fmtDur(d) }
