package api

import (
	"context"
	"mime"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"kiln/appliance/lifecycle"
	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// Machines: list, get, create, PATCH of intended fields, import, claim and
// the lifecycle actions (provision, release, erase, inspect). Every write goes
// to the domain, which applies the machine field rules (package rules).

func (s *Server) listMachines(c echo.Context) error {
	if err := s.maybeBarrier(c); err != nil {
		return err
	}
	limit, err := queryInt(c, "limit", s.cfg.DefaultListLimit, 1, s.cfg.MaxListLimit)
	if err != nil {
		return err
	}
	opt := store.ListOptions{State: store.MachineState(c.QueryParam("state")), Rack: c.QueryParam("rack"),
		After: c.QueryParam("after"), Limit: limit}
	if opt.State != "" && !opt.State.Valid() {
		return invalid("state", "%q is not a machine state", opt.State)
	}
	for _, kv := range c.QueryParams()["label"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return invalid("label", "%q: want key=value", kv)
		}
		if opt.Labels == nil {
			opt.Labels = map[string]string{}
		}
		opt.Labels[k] = v
	}
	items, next, err := s.b.ListMachines(opt)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, MachineList{Items: machineViews(items, who(c).Role), Next: next})
}

func (s *Server) getMachine(c echo.Context) error {
	if err := s.maybeBarrier(c); err != nil {
		return err
	}
	m, err := s.b.GetMachine(c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, machineView(m, who(c).Role))
}

func (s *Server) createMachine(c echo.Context) error {
	var sp MachineSpec
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &sp, false); err != nil {
		return err
	}
	out, err := s.b.CreateMachine(c.Request().Context(), lifecycle.Intended{Name: sp.Name, Site: sp.Site, Rack: sp.Rack,
		RackUnit: sp.RackUnit, Labels: sp.Labels, Hardware: sp.Intended, RootDisk: sp.RootDisk, Wipe: sp.Wipe,
		BootMode: sp.BootMode, IPv4: sp.IPv4, BootOverride: sp.BootOverride, Netboot: sp.Netboot}, s.w(c, "created", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, machineView(out, who(c).Role))
}

func (s *Server) patchMachine(c echo.Context) error {
	var p MachinePatch
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &p, false); err != nil {
		return err
	}
	out, err := s.b.UpdateIntended(c.Request().Context(), c.Param("id"), lifecycle.IntendedPatch{
		ResourceVersion: p.ResourceVersion, Name: p.Name, Site: p.Site, Rack: p.Rack, RackUnit: p.RackUnit,
		Labels: p.Labels, Hardware: p.Intended, RootDisk: p.RootDisk, Wipe: p.Wipe, BootMode: p.BootMode,
		IPv4: p.IPv4, BootOverride: p.BootOverride, Netboot: p.Netboot}, s.w(c, "intended_updated", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, machineView(out, who(c).Role))
}

func (s *Server) importMachines(c echo.Context) error {
	format := c.QueryParam("format")
	if format == "" {
		mt, _, _ := mime.ParseMediaType(c.Request().Header.Get(echo.HeaderContentType))
		switch mt {
		case "text/csv":
			format = "csv"
		case echo.MIMEApplicationJSON:
			format = "json"
		}
	}
	switch format {
	case "csv", "json", "netbox":
	case "":
		return invalid("format", "required: ?format=csv|json|netbox (or Content-Type text/csv or application/json)")
	default:
		return invalid("format", "%q is not csv|json|netbox", format)
	}
	body := http.MaxBytesReader(c.Response(), c.Request().Body, s.cfg.MaxImportBytes)
	res, err := s.b.Import(c.Request().Context(), body, format, s.w(c, "imported", ""))
	if err != nil {
		return err
	}
	ids := res.IDs
	if ids == nil {
		ids = []string{}
	}
	return c.JSON(http.StatusCreated, ImportResult{Created: res.Created, IDs: ids})
}

func (s *Server) provision(c echo.Context) error {
	var req ProvisionRequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, false); err != nil {
		return err
	}
	if err := validateWhy(req.Reason, ""); err != nil {
		return err
	}
	m, err := s.b.Provision(c.Request().Context(), c.Param("id"), storeClaim(req.Claim), s.w(c, req.Reason, ""))
	if err != nil {
		return err
	}
	weakTokenWarning(c, m)
	return c.JSON(http.StatusAccepted, machineView(m, who(c).Role))
}

func (s *Server) claimMachines(c echo.Context) error {
	var req ClaimRequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, false); err != nil {
		return err
	}
	if req.Role == "" {
		return invalid("role", "required")
	}
	if err := firstErr(checkText("role", req.Role, rules.MaxTextLen), validateWhy(req.Reason, "")); err != nil {
		return err
	}
	if req.Count < 1 || req.Count > s.cfg.MaxListLimit {
		return invalid("count", "must be 1..%d", s.cfg.MaxListLimit)
	}
	if err := rules.CheckLabels("labels", req.Labels); err != nil {
		return err
	}
	cl := storeClaim(req.Claim)
	cl.Role = req.Role
	ms, err := s.b.ClaimMachines(c.Request().Context(), req.Role, req.Labels, req.Count, cl, s.w(c, req.Reason, ""))
	if err != nil {
		return err
	}
	if len(ms) > 0 {
		weakTokenWarning(c, ms[0])
	}
	return c.JSON(http.StatusAccepted, ClaimResponse{Items: machineViews(ms, who(c).Role)})
}

// action runs a body-optional lifecycle action on one machine.
func (s *Server) action(c echo.Context, f func(context.Context, string, store.W) (store.Machine, error)) error {
	var req ActionRequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, true); err != nil {
		return err
	}
	if err := validateWhy(req.Reason, req.Message); err != nil {
		return err
	}
	m, err := f(c.Request().Context(), c.Param("id"), s.w(c, req.Reason, req.Message))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, machineView(m, who(c).Role))
}

func (s *Server) release(c echo.Context) error { return s.action(c, s.b.Release) }

func (s *Server) erase(c echo.Context) error { return s.action(c, s.b.Erase) }

func (s *Server) inspect(c echo.Context) error { return s.action(c, s.b.Inspect) }

// weakTokenWarning sets an HTTP Warning (RFC 9111 §5.5, code 299) when the
// claim's cluster token was accepted below ~128 bits of estimated entropy
// (issue 15; rules.TokenBits). The answer's cluster.token_weak says the same.
func weakTokenWarning(c echo.Context, m store.Machine) {
	if m.Claim != nil && m.Claim.Cluster != nil && m.Claim.Cluster.TokenWeak {
		c.Response().Header().Set("Warning", `299 kiln "cluster_token: accepted, but its estimated entropy is below 128 bits; use a random token"`)
	}
}
