package api

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"kiln/appliance/lifecycle"
	"kiln/appliance/lifecycle/waves"
	"kiln/store"
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

// The campaign routes (issue 17; appliance/lifecycle/DESIGN.md
// "Campaigns"), served by the Backend's CampaignBackend methods
// (lifecycle.Service). {id} is a campaign's ID or name.
//
//	GET  /v1/campaigns              → 200 []Campaign (viewer)
//	POST /v1/campaigns/plan         CampaignRequest → 200 CampaignPlan (viewer: computes, writes nothing)
//	POST /v1/campaigns              CampaignRequest → 201 Campaign (operator; planned, nothing touched)
//	GET  /v1/campaigns/{id}         → 200 Campaign (viewer)
//	POST /v1/campaigns/{id}/start   ActionRequest → 200 Campaign (operator)
//	POST /v1/campaigns/{id}/halt    ActionRequest → 200 Campaign (operator)
//	POST /v1/campaigns/{id}/resume  ActionRequest → 200 Campaign (operator)

// CampaignBackend is what the campaign routes need (part of Backend;
// lifecycle.Service implements it). Errors as Backend's: lifecycle.ErrInvalid
// (400), store.ErrNotFound (404), store.ErrConflict (409: the campaign's
// state does not allow the action, or the name is taken).
type CampaignBackend interface {
	PlanCampaign(spec lifecycle.CampaignSpec) (waves.Plan, error)
	CreateCampaign(ctx context.Context, spec lifecycle.CampaignSpec, w store.W) (store.Campaign, error)
	StartCampaign(ctx context.Context, ref string, w store.W) (store.Campaign, error)
	HaltCampaign(ctx context.Context, ref string, w store.W) (store.Campaign, error)
	ResumeCampaign(ctx context.Context, ref string, w store.W) (store.Campaign, error)
	GetCampaign(ref string) (store.Campaign, error)
	ListCampaigns() ([]store.Campaign, error)
}

// CampaignSelector picks a campaign's machines: every non-empty field must
// match (labels all equal; claim role, rack ID and site ID one of the lists).
type CampaignSelector struct {
	Labels map[string]string `json:"labels,omitempty"`
	Claims []string          `json:"claims,omitempty"`
	Racks  []string          `json:"racks,omitempty"`
	Sites  []string          `json:"sites,omitempty"`
}

// CampaignRequest is the body of POST /v1/campaigns and /v1/campaigns/plan.
// Action: os_image (Image: the image ID the claims move to), firmware
// (Baseline) or bios (BIOS attributes). Limits: zero fields take the
// defaults (5 % of a claim, 2 per rack, 0 failures tolerated).
type CampaignRequest struct {
	Name     string            `json:"name"`
	Action   string            `json:"action"`
	Image    string            `json:"image,omitempty"`
	Baseline string            `json:"baseline,omitempty"`
	BIOS     map[string]string `json:"bios,omitempty"`
	Selector CampaignSelector  `json:"selector"`
	Limits   CampaignLimits    `json:"limits"`
	Reason   string            `json:"reason,omitempty"`
	Message  string            `json:"message,omitempty"`
}

// CampaignMachine is one machine's place in a campaign.
type CampaignMachine struct {
	ID      string    `json:"id"`
	Site    string    `json:"site,omitempty"`
	Rack    string    `json:"rack,omitempty"`
	Group   string    `json:"group,omitempty"` // the claim's role
	Wave    int       `json:"wave"`
	State   string    `json:"state"` // pending | active | done | failed | skipped
	Started time.Time `json:"started,omitzero"`
	Ended   time.Time `json:"ended,omitzero"`
	Why     string    `json:"why,omitempty"`
}

// Campaign is a campaign's wire form (store.Campaign).
type Campaign struct {
	ID              string            `json:"id"`
	ResourceVersion uint64            `json:"resource_version"`
	Name            string            `json:"name"`
	Action          string            `json:"action"`
	Image           string            `json:"image,omitempty"`
	Baseline        string            `json:"baseline,omitempty"`
	BIOS            map[string]string `json:"bios,omitempty"`
	Selector        CampaignSelector  `json:"selector"`
	Limits          CampaignLimits    `json:"limits"`
	State           string            `json:"state"` // planned | running | halted | completed
	Reason          string            `json:"reason,omitempty"`
	Message         string            `json:"message,omitempty"`
	Wave            int               `json:"wave"`
	Waves           int               `json:"waves"`
	Failures        int               `json:"failures"`
	Counts          map[string]int    `json:"counts"` // machines per campaign state
	CreatedAt       time.Time         `json:"created_at"`
	StartedAt       time.Time         `json:"started_at,omitzero"`
	HaltedAt        time.Time         `json:"halted_at,omitzero"`
	EndedAt         time.Time         `json:"ended_at,omitzero"`
	Machines        []CampaignMachine `json:"machines"`
}

func campaignView(c store.Campaign) Campaign {
	out := Campaign{ID: c.ID, ResourceVersion: c.ResourceVersion, Name: c.Name, Action: c.Action, Image: c.Image, Baseline: c.Baseline,
		BIOS: c.BIOS, Selector: CampaignSelector(c.Selector),
		Limits: CampaignLimits{ClusterPercent: c.Limits.ClusterPercent, PerRack: c.Limits.PerRack, MaxFailures: c.Limits.MaxFailures},
		State:  c.State, Reason: c.Reason, Message: c.Message, Wave: c.Wave, Waves: c.Waves, Failures: c.Failures,
		Counts: map[string]int{}, CreatedAt: c.CreatedAt, StartedAt: c.StartedAt, HaltedAt: c.HaltedAt, EndedAt: c.EndedAt,
		Machines: []CampaignMachine{}}
	for _, m := range c.Machines {
		out.Counts[m.State]++
		out.Machines = append(out.Machines, CampaignMachine{ID: m.ID, Site: m.Site, Rack: m.Rack, Group: m.Group, Wave: m.Wave,
			State: m.State, Started: m.Started, Ended: m.Ended, Why: m.Why})
	}
	return out
}

func (r CampaignRequest) spec() lifecycle.CampaignSpec {
	return lifecycle.CampaignSpec{Name: r.Name, Action: r.Action, Image: r.Image, Baseline: r.Baseline, BIOS: r.BIOS,
		Selector:    store.CampaignSelector(r.Selector),
		Limits:      store.CampaignLimits{ClusterPercent: r.Limits.ClusterPercent, PerRack: r.Limits.PerRack, MaxFailures: r.Limits.MaxFailures},
		MaxParallel: r.Limits.MaxParallel}
}

func (s *Server) campaignRoutes(view, op echo.MiddlewareFunc) {
	s.e.GET("/v1/campaigns", s.listCampaigns, view)
	s.e.POST("/v1/campaigns/plan", s.planCampaign, view)
	s.e.POST("/v1/campaigns", s.createCampaign, op)
	s.e.GET("/v1/campaigns/:id", s.getCampaign, view)
	s.e.POST("/v1/campaigns/:id/start", s.campaignAct(CampaignBackend.StartCampaign), op)
	s.e.POST("/v1/campaigns/:id/halt", s.campaignAct(CampaignBackend.HaltCampaign), op)
	s.e.POST("/v1/campaigns/:id/resume", s.campaignAct(CampaignBackend.ResumeCampaign), op)
}

// campaignDocOps documents the campaign routes (appended to docOps).
func campaignDocOps() []docOp {
	return []docOp{
		{Method: "GET", Path: "/v1/campaigns", Summary: "List the campaigns", Role: RoleViewer, Status: 200, Resp: []Campaign{}},
		{Method: "POST", Path: "/v1/campaigns/plan", Summary: "Plan a campaign: its waves under the limits and the time to finish (writes nothing)",
			Role: RoleViewer, Body: CampaignRequest{}, Status: 200, Resp: CampaignPlan{}},
		{Method: "POST", Path: "/v1/campaigns", Summary: "Create a campaign (planned: every selected machine with its wave; nothing is touched until start)",
			Role: RoleOperator, Body: CampaignRequest{}, Status: 201, Resp: Campaign{}},
		{Method: "GET", Path: "/v1/campaigns/{id}", Summary: "A campaign's status: state, wave, failures, every machine", Role: RoleViewer, Status: 200, Resp: Campaign{}},
		{Method: "POST", Path: "/v1/campaigns/{id}/start", Summary: "Start a planned campaign", Role: RoleOperator, Body: ActionRequest{}, Status: 200, Resp: Campaign{}},
		{Method: "POST", Path: "/v1/campaigns/{id}/halt", Summary: "Halt a campaign: no further machine is taken out", Role: RoleOperator, Body: ActionRequest{}, Status: 200, Resp: Campaign{}},
		{Method: "POST", Path: "/v1/campaigns/{id}/resume", Summary: "Resume a halted campaign (its failures are forgotten; failed machines are not tried again)",
			Role: RoleOperator, Body: ActionRequest{}, Status: 200, Resp: Campaign{}},
	}
}

func (s *Server) listCampaigns(c echo.Context) error {
	list, err := s.b.ListCampaigns()
	if err != nil {
		return err
	}
	out := make([]Campaign, 0, len(list))
	for _, x := range list {
		out = append(out, campaignView(x))
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) campaignRequest(c echo.Context) (CampaignRequest, error) {
	var req CampaignRequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, false); err != nil {
		return req, err
	}
	return req, validateWhy(req.Reason, req.Message)
}

func (s *Server) planCampaign(c echo.Context) error {
	req, err := s.campaignRequest(c)
	if err != nil {
		return err
	}
	if req.Name == "" {
		req.Name = "plan"
	}
	p, err := s.b.PlanCampaign(req.spec())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, PlanView(p, req.Limits.MaxFailures))
}

func (s *Server) createCampaign(c echo.Context) error {
	req, err := s.campaignRequest(c)
	if err != nil {
		return err
	}
	camp, err := s.b.CreateCampaign(c.Request().Context(), req.spec(), s.w(c, "", why(req.Reason, req.Message)))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, campaignView(camp))
}

func (s *Server) getCampaign(c echo.Context) error {
	camp, err := s.b.GetCampaign(c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, campaignView(camp))
}

func (s *Server) campaignAct(f func(CampaignBackend, context.Context, string, store.W) (store.Campaign, error)) echo.HandlerFunc {
	return func(c echo.Context) error {
		req, err := s.actionBody(c)
		if err != nil {
			return err
		}
		if err := validateWhy(req.Reason, req.Message); err != nil {
			return err
		}
		camp, err := f(s.b, c.Request().Context(), c.Param("id"), s.w(c, "", why(req.Reason, req.Message)))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, campaignView(camp))
	}
}
