package ui

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"kiln/api"
	"kiln/api/client"
	"kiln/store"
)

// action is one operator action of the machine page. Every action is
// confirmed on its own page (GET …/confirm/NAME) and then posted with the
// session's CSRF secret; the post is one call of the REST API's route for
// it, with the signed-in token, so the API checks the role again and
// writes the audit event (actor token:NAME, the reason given).
type action struct {
	Name   string // URL segment
	Label  string
	Need   api.Role
	Danger bool
	// Offered: shown for a machine in this state (the API decides anyway).
	Offered func(m api.Machine) bool
}

var actions = []action{
	{Name: "provision", Label: "Provision", Need: api.RoleOperator,
		Offered: func(m api.Machine) bool { return m.State == store.StateAvailable }},
	{Name: "release", Label: "Release", Need: api.RoleOperator, Danger: true,
		Offered: func(m api.Machine) bool { return m.Claim != nil }},
	{Name: "maintenance-on", Label: "Enter maintenance", Need: api.RoleOperator,
		Offered: func(m api.Machine) bool { return m.Maintenance == nil && m.State != store.StateRetired }},
	{Name: "maintenance-off", Label: "Leave maintenance", Need: api.RoleOperator,
		Offered: func(m api.Machine) bool { return m.Maintenance != nil }},
	{Name: "power-on", Label: "Power on", Need: api.RoleOperator,
		Offered: func(m api.Machine) bool { return m.BMC != "" }},
	{Name: "power-off", Label: "Power off", Need: api.RoleOperator, Danger: true,
		Offered: func(m api.Machine) bool { return m.BMC != "" }},
	{Name: "power-cycle", Label: "Power cycle", Need: api.RoleOperator, Danger: true,
		Offered: func(m api.Machine) bool { return m.BMC != "" }},
	{Name: "retire", Label: "Retire", Need: api.RoleAdmin, Danger: true,
		Offered: func(m api.Machine) bool { return m.State != store.StateRetired }},
}

var actionByName = func() map[string]action {
	out := map[string]action{}
	for _, a := range actions {
		out[a.Name] = a
	}
	return out
}()

// actionsFor lists the actions the principal may take on m (none for a viewer).
func actionsFor(m api.Machine, p principal) []action {
	var out []action
	for _, a := range actions {
		if p.may(a.Need) && a.Offered(m) {
			out = append(out, a)
		}
	}
	return out
}

type confirmPage struct {
	M      api.Machine
	A      action
	Images []api.Image
	Reason string
}

func (u *UI) confirm(w http.ResponseWriter, r *http.Request, p principal, cl *client.Client) (string, *layout, error) {
	a, ok := actionByName[r.PathValue("action")]
	if !ok {
		return "", nil, &client.Error{Status: http.StatusNotFound, Detail: api.ErrorDetail{Code: "not_found", Message: "no such action"}}
	}
	if !p.may(a.Need) {
		return "", nil, forbidden(p, a)
	}
	m, err := cl.GetMachine(r.Context(), r.PathValue("id"))
	if err != nil {
		return "", nil, err
	}
	pg := &confirmPage{M: m, A: a}
	if a.Name == "provision" {
		if pg.Images, err = cl.ListImages(r.Context()); err != nil {
			return "", nil, err
		}
	}
	return "confirm", &layout{Title: a.Label + " " + nameOf(m), Nav: "machine", Page: pg}, nil
}

func forbidden(p principal, a action) error {
	return &client.Error{Status: http.StatusForbidden, Detail: api.ErrorDetail{Code: "forbidden",
		Message: fmt.Sprintf("role %s may not %s (needs %s)", p.Role, strings.ToLower(a.Label), a.Need)}}
}

// act is POST /ui/machines/{id}/{action}: the confirmed action.
func (u *UI) act(w http.ResponseWriter, r *http.Request) {
	p, err := u.who(r)
	if err != nil {
		u.toLogin(w, r)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if !checkCSRF(r, p) {
		u.log.Warn("action refused: CSRF check failed", "user", p.Name, "path", r.URL.Path)
		u.render(w, http.StatusForbidden, "error", &layout{Title: "Forbidden",
			Error: "the request did not carry this session's CSRF token (or came from another origin); nothing was done"}, p)
		return
	}
	a, ok := actionByName[r.PathValue("action")]
	if !ok {
		u.fail(w, r, p, &client.Error{Status: http.StatusNotFound, Detail: api.ErrorDetail{Code: "not_found", Message: "no such action"}})
		return
	}
	if !p.may(a.Need) {
		u.log.Warn("action refused: role", "user", p.Name, "role", p.Role, "action", a.Name)
		u.fail(w, r, p, forbidden(p, a))
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		u.fail(w, r, p, &client.Error{Status: http.StatusBadRequest, Detail: api.ErrorDetail{Code: "invalid",
			Message: "the action was not confirmed"}})
		return
	}
	id := r.PathValue("id")
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" {
		reason = "web UI: " + a.Name
	}
	const msg = "via the web UI"
	cl, ctx := u.client(p.Token), r.Context()
	var m api.Machine
	switch a.Name {
	case "provision":
		m, err = cl.Provision(ctx, id, api.ProvisionRequest{Reason: reason, Claim: api.Claim{
			Image: r.PostFormValue("image"), Hostname: strings.TrimSpace(r.PostFormValue("hostname"))}})
	case "release":
		m, err = cl.Release(ctx, id, api.ActionRequest{Reason: reason, Message: msg})
	case "maintenance-on", "maintenance-off":
		on := a.Name == "maintenance-on"
		m, err = cl.SetMaintenance(ctx, id, api.MaintenanceRequest{Maintenance: &on, Reason: reason, Message: msg})
	case "power-on", "power-off", "power-cycle":
		m, err = cl.Power(ctx, id, api.PowerRequest{Action: strings.TrimPrefix(a.Name, "power-"), Reason: reason, Message: msg})
	case "retire":
		m, err = cl.Retire(ctx, id, api.ActionRequest{Reason: reason, Message: msg})
	default:
		err = errors.New("unhandled action " + a.Name)
	}
	if err != nil {
		u.log.Info("action refused by the API", "user", p.Name, "machine", id, "action", a.Name, "err", err)
		var images []api.Image
		if a.Name == "provision" {
			images, _ = cl.ListImages(ctx)
		}
		mm, gerr := cl.GetMachine(ctx, id)
		if gerr != nil {
			u.fail(w, r, p, err)
			return
		}
		status := http.StatusBadRequest
		var ce *client.Error
		if errors.As(err, &ce) {
			status = ce.Status
		}
		u.render(w, status, "confirm", &layout{Title: a.Label + " " + nameOf(mm), Nav: "machine", Error: shortErr(err),
			Page: &confirmPage{M: mm, A: a, Images: images, Reason: r.PostFormValue("reason")}}, p)
		return
	}
	u.log.Info("action", "user", p.Name, "machine", m.ID, "action", a.Name, "state", m.State)
	http.Redirect(w, r, Prefix+"machines/"+m.ID+"?done="+a.Name, http.StatusSeeOther)
}
