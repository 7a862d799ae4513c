package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"kiln/api"
	"kiln/api/client"
	"kiln/store"
)

// layout is what every page's template gets.
type layout struct {
	Title  string
	Nav    string // overview | racks | machine
	User   string
	Role   api.Role
	CanAct bool // operator or admin: action buttons are shown
	CSRF   string
	// Cursor is the event index the page's live updates start after: the
	// newest resource_version among the records the page shows (an event's
	// index is its command's raft index, so every event after it is newer
	// than everything on the page).
	Cursor uint64
	Live   string // what the script updates: overview | rack | machine
	Flash  string
	Error  string
	Page   any
}

// pageFunc renders one page for a signed-in principal.
type pageFunc func(w http.ResponseWriter, r *http.Request, p principal, cl *client.Client) (string, *layout, error)

// page wraps a pageFunc: a request without a valid session is sent to the
// sign-in page (with where it was going); an API error becomes a page with
// the API's status and message.
func (u *UI) page(f pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := u.who(r)
		if err != nil {
			u.toLogin(w, r)
			return
		}
		name, l, err := f(w, r, p, u.client(p.Token))
		if err != nil {
			u.fail(w, r, p, err)
			return
		}
		u.render(w, http.StatusOK, name, l, p)
	}
}

func (u *UI) toLogin(w http.ResponseWriter, r *http.Request) {
	q := "login?next=" + url.QueryEscape(r.URL.RequestURI())
	if _, err := r.Cookie(CookieName); err == nil {
		q += "&expired=1" // a cookie that no longer opens: expired, or its token removed
		u.clearSession(w)
	}
	http.Redirect(w, r, Prefix+q, http.StatusSeeOther)
}

// fail answers an error of a page: the API's status (401 → sign-in).
func (u *UI) fail(w http.ResponseWriter, r *http.Request, p principal, err error) {
	status, msg := http.StatusInternalServerError, err.Error()
	var ce *client.Error
	if errors.As(err, &ce) {
		status, msg = ce.Status, ce.Message()
		if ce.Status == http.StatusUnauthorized {
			u.toLogin(w, r)
			return
		}
	}
	if status >= 500 {
		u.log.Warn("page failed", "path", r.URL.Path, "err", err)
	}
	u.render(w, status, "error", &layout{Title: http.StatusText(status), Error: msg}, p)
}

func (u *UI) render(w http.ResponseWriter, status int, name string, l *layout, p principal) {
	t := u.pages[name]
	if t == nil {
		http.Error(w, "no template "+name, http.StatusInternalServerError)
		return
	}
	l.User, l.Role, l.CSRF = p.Name, p.Role, p.CSRF
	l.CanAct = p.Role != "" && p.may(api.RoleOperator)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if err := t.Execute(w, l); err != nil {
		u.log.Warn("render", "page", name, "err", err)
	}
}

// ---- overview

type overviewPage struct {
	Status      api.SiteStatus
	States      []stateCount
	Members     []api.ClusterMember
	MembersErr  string
	Remediation *api.RemediationStatus
	RemedErr    string
	Racks       []rackSummary
	RackNames   map[string]string // rack ID → name, for the failures
	// Campaigns not completed, newest first (the section shows only when
	// the site has any: issue 18 "campaigns when they exist").
	Campaigns    []api.Campaign
	CampaignsErr string
}

type stateCount struct {
	State store.MachineState
	N     int
}

type rackSummary struct {
	ID, Name, Row string
	Total         int
	States        []stateCount
	Warnings      int
}

func (u *UI) overview(w http.ResponseWriter, r *http.Request, p principal, cl *client.Client) (string, *layout, error) {
	ctx := r.Context()
	st, err := cl.SiteStatus(ctx)
	if err != nil {
		return "", nil, err
	}
	pg := &overviewPage{Status: st}
	for _, s := range store.AllStates {
		pg.States = append(pg.States, stateCount{s, st.Counts[s]})
	}
	if pg.Members, err = cl.ClusterMembers(ctx); err != nil {
		pg.MembersErr = shortErr(err)
	}
	if rs, err := cl.RemediationStatus(ctx); err != nil {
		pg.RemedErr = shortErr(err)
	} else {
		pg.Remediation = &rs
	}
	if cs, err := cl.ListCampaigns(ctx); err != nil {
		pg.CampaignsErr = shortErr(err)
	} else {
		for i := len(cs) - 1; i >= 0; i-- {
			if cs[i].State != "completed" {
				pg.Campaigns = append(pg.Campaigns, cs[i])
			}
		}
	}
	h, err := u.loadHall(ctx, cl)
	if err != nil {
		return "", nil, err
	}
	pg.RackNames = map[string]string{}
	for _, rk := range h.Racks {
		pg.RackNames[rk.ID] = rk.Name
		rs := rackSummary{ID: rk.ID, Name: rk.Name, Row: rk.Row}
		n := map[store.MachineState]int{}
		for _, m := range rk.all {
			n[m.State]++
			rs.Total++
			if len(m.Diff) > 0 {
				rs.Warnings++
			}
		}
		for _, s := range store.AllStates {
			if n[s] > 0 {
				rs.States = append(rs.States, stateCount{s, n[s]})
			}
		}
		pg.Racks = append(pg.Racks, rs)
	}
	return "overview", &layout{Title: "Site overview", Nav: "overview", Cursor: h.cursor, Live: "overview", Page: pg}, nil
}

func shortErr(err error) string {
	var ce *client.Error
	if errors.As(err, &ce) {
		return fmt.Sprintf("%d %s", ce.Status, ce.Message())
	}
	return err.Error()
}

// ---- racks

// hallPage is every rack of the site (the hall at a glance) or one rack.
type hallPage struct {
	Racks    []*rackView
	Machines int
	One      bool
}

// rackView is a rack elevation: its slots from the top unit down.
type rackView struct {
	ID, Name, Row, Site string
	Units               int
	Recorded            bool // a rack record exists (else the machines name a rack Kiln has no record of)
	Slots               []slot
	Unplaced            []cell // no rack unit, or above the rack's height
	Conflicts           int    // units holding more than one machine
	N                   int    // machines in the rack
	all                 []api.Machine
}

type slot struct {
	U     int
	Cells []cell
}

// cell is one machine in a slot.
type cell struct {
	ID, Name string
	State    store.MachineState
	Reason   string
	Warn     string // the intended-vs-discovered differences, "" when none
	Blocking bool
	Step     string
	Progress int // percent; -1 when the step reports none
	Maint    bool
}

func cellOf(m api.Machine) cell {
	c := cell{ID: m.ID, Name: m.Name, State: m.State, Reason: m.Reason, Progress: -1, Maint: m.Maintenance != nil}
	if c.Name == "" {
		c.Name = m.ID
	}
	if len(m.Diff) > 0 {
		var fs []string
		for _, d := range m.Diff {
			fs = append(fs, d.Field)
			c.Blocking = c.Blocking || d.Blocking
		}
		c.Warn = fmt.Sprintf("%d difference(s) from intended: %s", len(m.Diff), strings.Join(fs, ", "))
	}
	if m.Step != nil && (m.State == store.StateProvisioning || m.State == store.StateInspecting || m.State == store.StateErasing) {
		c.Step = m.Step.Step
		if m.Step.Progress > 0 {
			c.Progress = int(m.Step.Progress * 100)
		}
	}
	return c
}

// DefaultRackUnits is the height drawn for a rack with no Units.
const DefaultRackUnits = 42

type hall struct {
	Racks    []*rackView
	machines int
	cursor   uint64
}

// loadHall reads every rack and machine and places the machines.
func (u *UI) loadHall(ctx context.Context, cl *client.Client) (*hall, error) {
	racks, err := cl.ListRacks(ctx, "")
	if err != nil {
		return nil, err
	}
	ms, err := cl.ListAllMachines(ctx, client.MachineQuery{Limit: api.MaxListLimitCap})
	if err != nil {
		return nil, err
	}
	h := &hall{machines: len(ms)}
	byKey := map[string]*rackView{}
	for _, rk := range racks {
		rv := &rackView{ID: rk.ID, Name: rk.Name, Row: rk.Row, Site: rk.Site, Units: rk.Units, Recorded: true}
		h.Racks = append(h.Racks, rv)
		byKey[rk.ID] = rv
		if _, dup := byKey[rk.Name]; !dup {
			byKey[rk.Name] = rv
		}
		h.cursor = max(h.cursor, rk.ResourceVersion)
	}
	for _, m := range ms {
		h.cursor = max(h.cursor, m.ResourceVersion)
		if m.Rack == "" {
			continue
		}
		rv := byKey[m.Rack]
		if rv == nil {
			rv = &rackView{ID: m.Rack, Name: m.Rack}
			byKey[m.Rack] = rv
			h.Racks = append(h.Racks, rv)
		}
		rv.all = append(rv.all, m)
		rv.N++
	}
	for _, rv := range h.Racks {
		rv.place()
	}
	sort.SliceStable(h.Racks, func(i, j int) bool {
		a, b := h.Racks[i], h.Racks[j]
		if a.Row != b.Row {
			return a.Row < b.Row
		}
		return a.Name < b.Name
	})
	return h, nil
}

// place lays the rack's machines out in its units (U1 at the bottom).
func (rv *rackView) place() {
	if rv.Units == 0 {
		rv.Units = DefaultRackUnits
		for _, m := range rv.all {
			if !rv.Recorded {
				rv.Units = max(rv.Units, m.RackUnit)
			}
		}
	}
	at := make([][]cell, rv.Units+1)
	for _, m := range rv.all {
		if m.RackUnit < 1 || m.RackUnit > rv.Units {
			rv.Unplaced = append(rv.Unplaced, cellOf(m))
			continue
		}
		at[m.RackUnit] = append(at[m.RackUnit], cellOf(m))
	}
	rv.Slots = make([]slot, 0, rv.Units)
	for uu := rv.Units; uu >= 1; uu-- {
		if len(at[uu]) > 1 {
			rv.Conflicts++
		}
		rv.Slots = append(rv.Slots, slot{U: uu, Cells: at[uu]})
	}
}

func (u *UI) hall(w http.ResponseWriter, r *http.Request, p principal, cl *client.Client) (string, *layout, error) {
	h, err := u.loadHall(r.Context(), cl)
	if err != nil {
		return "", nil, err
	}
	return "racks", &layout{Title: "Racks", Nav: "racks", Cursor: h.cursor, Live: "rack",
		Page: &hallPage{Racks: h.Racks, Machines: h.machines}}, nil
}

func (u *UI) rack(w http.ResponseWriter, r *http.Request, p principal, cl *client.Client) (string, *layout, error) {
	id := r.PathValue("id")
	h, err := u.loadHall(r.Context(), cl)
	if err != nil {
		return "", nil, err
	}
	for _, rv := range h.Racks {
		if rv.ID == id {
			return "racks", &layout{Title: "Rack " + rv.Name, Nav: "racks", Cursor: h.cursor, Live: "rack",
				Page: &hallPage{Racks: []*rackView{rv}, Machines: rv.N, One: true}}, nil
		}
	}
	return "", nil, &client.Error{Status: http.StatusNotFound, Detail: api.ErrorDetail{Code: "not_found",
		Message: fmt.Sprintf("no rack %q", id)}}
}

// ---- machine

type machinePage struct {
	M          api.Machine
	RackName   string
	Hardware   []hwRow
	Jobs       []api.Job
	Leases     []api.Lease
	LeaseErr   string
	Events     []api.Event
	EventsMore bool // older events of the machine were not searched
	Images     []api.Image
	Actions    []action
}

// hwRow is one field of the intended-vs-discovered table.
type hwRow struct {
	Field, Intended, Discovered string
	Differs, Blocking           bool
}

func (u *UI) machine(w http.ResponseWriter, r *http.Request, p principal, cl *client.Client) (string, *layout, error) {
	ctx := r.Context()
	pg, err := u.loadMachine(ctx, cl, r.PathValue("id"))
	if err != nil {
		return "", nil, err
	}
	pg.Actions = actionsFor(pg.M, p)
	l := &layout{Title: "Machine " + nameOf(pg.M), Nav: "machine", Cursor: pg.M.ResourceVersion, Live: "machine", Page: pg}
	if d := r.URL.Query().Get("done"); d != "" {
		if a, ok := actionByName[d]; ok {
			l.Flash = fmt.Sprintf("%s accepted by the API; the machine is %s. This page follows it live.", a.Label, pg.M.State)
		}
	}
	if len(pg.Events) > 0 {
		l.Cursor = max(l.Cursor, pg.Events[0].Index)
	}
	return "machine", l, nil
}

func nameOf(m api.Machine) string {
	if m.Name != "" {
		return m.Name
	}
	return m.ID
}

func (u *UI) loadMachine(ctx context.Context, cl *client.Client, id string) (*machinePage, error) {
	m, err := cl.GetMachine(ctx, id)
	if err != nil {
		return nil, err
	}
	pg := &machinePage{M: m, Hardware: hardwareRows(m), RackName: m.Rack}
	if m.Rack != "" {
		if rk, err := cl.GetRack(ctx, m.Rack); err == nil {
			pg.RackName = rk.Name
		}
	}
	if pg.Jobs, err = cl.ListJobs(ctx, id); err != nil {
		return nil, err
	}
	if ll, err := cl.Leases(ctx, false); err != nil {
		pg.LeaseErr = shortErr(err)
	} else {
		macs := map[string]bool{}
		for _, n := range m.Intended.NICs {
			macs[strings.ToLower(n.MAC)] = true
		}
		if m.Discovered != nil {
			for _, n := range m.Discovered.NICs {
				macs[strings.ToLower(n.MAC)] = true
			}
		}
		for _, l := range ll.Items {
			if macs[strings.ToLower(l.MAC)] {
				pg.Leases = append(pg.Leases, l)
			}
		}
	}
	if pg.Events, pg.EventsMore, err = history(ctx, cl, "machine/"+id); err != nil {
		return nil, err
	}
	if pg.Images, err = cl.ListImages(ctx); err != nil {
		return nil, err
	}
	return pg, nil
}

// History bounds: the machine page reads the feed filtered to the
// machine (GET /v1/events?subject=) from the oldest retained event, at most
// historyPages answers of up to historyPage events (each answer scans a
// bounded stretch of the feed), keeping the newest historyKeep.
const (
	historyPage  = 1000
	historyPages = 50
	historyKeep  = 100
)

// history returns the subject's newest events, newest first, and whether
// the search stopped before the end of the feed.
func history(ctx context.Context, cl *client.Client, subject string) ([]api.Event, bool, error) {
	var keep []api.Event
	after := uint64(0)
	newestFirst := func() []api.Event {
		for i, j := 0, len(keep)-1; i < j; i, j = i+1, j-1 {
			keep[i], keep[j] = keep[j], keep[i]
		}
		return keep
	}
	for i := 0; i < historyPages; i++ {
		el, err := cl.Events(ctx, client.EventQuery{After: after, Limit: historyPage, Subject: subject})
		if err != nil {
			return nil, false, err
		}
		keep = append(keep, el.Events...)
		if len(keep) > historyKeep {
			keep = keep[len(keep)-historyKeep:]
		}
		if el.Next == after {
			return newestFirst(), false, nil
		}
		after = el.Next
	}
	return newestFirst(), true, nil
}

func hardwareRows(m api.Machine) []hwRow {
	in := m.Intended
	var d store.Hardware
	has := m.Discovered != nil
	if has {
		d = *m.Discovered
	}
	diff := map[string]store.FieldDiff{}
	for _, x := range m.Diff {
		diff[x.Field] = x
	}
	str := func(v string) string { return v }
	num := func(n int) string {
		if n == 0 {
			return ""
		}
		return fmt.Sprint(n)
	}
	rows := []hwRow{
		{Field: "serial", Intended: str(in.Serial), Discovered: str(d.Serial)},
		{Field: "vendor", Intended: in.Vendor, Discovered: d.Vendor},
		{Field: "model", Intended: in.Model, Discovered: d.Model},
		{Field: "uuid", Intended: in.UUID, Discovered: d.UUID},
		{Field: "cpus", Intended: num(in.CPUs), Discovered: num(d.CPUs)},
		{Field: "memory_bytes", Intended: bytesText(in.MemoryBytes), Discovered: bytesText(d.MemoryBytes)},
		{Field: "disks", Intended: disksText(in.Disks), Discovered: disksText(d.Disks)},
		{Field: "nics", Intended: nicsText(in.NICs), Discovered: nicsText(d.NICs)},
		{Field: "gpus", Intended: num(in.GPUs), Discovered: num(d.GPUs)},
		{Field: "bmc_address", Intended: in.BMCAddress, Discovered: d.BMCAddress},
		{Field: "bmc_mac", Intended: in.BMCMAC, Discovered: d.BMCMAC},
		{Field: "firmware", Intended: in.Firmware, Discovered: d.Firmware},
	}
	for i := range rows {
		for f, x := range diff {
			if f == rows[i].Field || strings.HasPrefix(f, rows[i].Field+"[") || strings.HasPrefix(f, rows[i].Field+".") ||
				(rows[i].Field == "memory_bytes" && f == "memory") {
				rows[i].Differs = true
				rows[i].Blocking = rows[i].Blocking || x.Blocking
			}
		}
		if !has {
			rows[i].Discovered = "—"
		}
	}
	return rows
}

func bytesText(n uint64) string {
	if n == 0 {
		return ""
	}
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for x := n / unit; x >= unit; x /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func disksText(ds []store.Disk) string {
	var out []string
	for _, d := range ds {
		s := d.Name
		if d.SizeBytes > 0 {
			s += " " + bytesText(d.SizeBytes)
		}
		if d.Serial != "" {
			s += " (" + d.Serial + ")"
		}
		out = append(out, strings.TrimSpace(s))
	}
	return strings.Join(out, "; ")
}

func nicsText(ns []store.NIC) string {
	var out []string
	for _, n := range ns {
		out = append(out, n.MAC)
	}
	return strings.Join(out, ", ")
}

// since is for templates: a time as "3m ago".
func since(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := time.Since(t).Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return t.UTC().Format("2006-01-02 15:04")
}
