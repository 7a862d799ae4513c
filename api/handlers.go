package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// Handlers are thin: validate, call Backend, map errors (errorHandler).

func who(c echo.Context) principal {
	p, _ := c.Get(ctxPrincipal).(principal)
	return p
}

func (s *Server) w(c echo.Context, reason, msg string) store.W {
	return store.W{Actor: who(c).actor(), Reason: reason, Message: msg}
}

func notFound(kind, id string) error { return fmt.Errorf("%w: %s %q", store.ErrNotFound, kind, id) }

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, Status{Status: "ok"})
}

func (s *Server) readyz(c echo.Context) error {
	h := s.b.Health()
	if !h.Ready {
		return c.JSON(http.StatusServiceUnavailable, Status{Status: "not_ready", Leader: h.Leader})
	}
	return c.JSON(http.StatusOK, Status{Status: "ok", Leader: h.Leader})
}

func (s *Server) siteStatus(c echo.Context) error {
	counts, err := s.b.CountByState()
	if err != nil {
		return err
	}
	st := SiteStatus{Time: time.Now().UTC(), Counts: make(map[store.MachineState]int, len(store.AllStates)),
		Failures: []MachineSummary{}, Images: []ImageVersion{}}
	for _, state := range store.AllStates {
		st.Counts[state] = counts[state]
		st.Total += counts[state]
	}
	failed, _, err := s.b.ListMachines(store.ListOptions{State: store.StateFailed, Limit: FailuresInStatus})
	if err != nil {
		return err
	}
	for _, m := range failed {
		st.Failures = append(st.Failures, MachineSummary{ID: m.ID, Name: m.Name, Rack: m.Rack, State: m.State,
			Reason: m.Reason, Message: m.Message, Updated: m.UpdatedAt})
	}
	imgs, err := s.b.ListImages()
	if err != nil {
		return err
	}
	for _, im := range imgs {
		st.Images = append(st.Images, ImageVersion{ID: im.ID, Name: im.Name, Version: im.Version, SHA256: im.SHA256})
	}
	st.Raft = s.b.Health()
	st.Version = st.Raft.Version
	return c.JSON(http.StatusOK, st)
}

// ---- sites and racks

func (s *Server) listSites(c echo.Context) error {
	items, err := s.b.ListSites()
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, SiteList{Items: views(items, siteView)})
}

func (s *Server) getSite(c echo.Context) error {
	items, err := s.b.ListSites()
	if err != nil {
		return err
	}
	for _, it := range items {
		if it.ID == c.Param("id") {
			return c.JSON(http.StatusOK, siteView(it))
		}
	}
	return notFound("site", c.Param("id"))
}

// checkText applies the free-text rule (rules.CheckText) to one field.
func checkText(field, v string, max int) error {
	if err := rules.CheckText(v, max); err != nil {
		return invalid(field, "%v", err)
	}
	return nil
}

// firstErr returns the first non-nil error.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func validateSite(sp SiteSpec) error {
	if strings.TrimSpace(sp.Name) == "" {
		return invalid("name", "required")
	}
	if sp.ID != "" && !idRe.MatchString(sp.ID) {
		return invalid("id", "must match %s", idRe)
	}
	return firstErr(checkText("name", sp.Name, rules.MaxTextLen),
		checkText("description", sp.Description, rules.MaxDescriptionLen))
}

func (s *Server) createSite(c echo.Context) error {
	var sp SiteSpec
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &sp, false); err != nil {
		return err
	}
	if err := validateSite(sp); err != nil {
		return err
	}
	if sp.ResourceVersion != 0 {
		return invalid("resource_version", "must be absent on create; use PUT /v1/sites/{id} to update")
	}
	out, err := s.b.PutSite(c.Request().Context(), store.Site{Meta: store.Meta{ID: sp.ID}, Name: sp.Name,
		Description: sp.Description}, s.w(c, "", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, siteView(out))
}

func (s *Server) updateSite(c echo.Context) error {
	var sp SiteSpec
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &sp, false); err != nil {
		return err
	}
	if sp.ID != "" && sp.ID != c.Param("id") {
		return invalid("id", "does not match the path")
	}
	sp.ID = c.Param("id")
	if err := validateSite(sp); err != nil {
		return err
	}
	if sp.ResourceVersion == 0 {
		return invalid("resource_version", "required on update")
	}
	out, err := s.b.PutSite(c.Request().Context(), store.Site{Meta: store.Meta{ID: sp.ID, ResourceVersion: sp.ResourceVersion},
		Name: sp.Name, Description: sp.Description}, s.w(c, "", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, siteView(out))
}

func (s *Server) listRacks(c echo.Context) error {
	items, err := s.b.ListRacks()
	if err != nil {
		return err
	}
	out := []Rack{}
	site := c.QueryParam("site")
	for _, r := range items {
		if site == "" || r.Site == site {
			out = append(out, rackView(r))
		}
	}
	return c.JSON(http.StatusOK, RackList{Items: out})
}

func (s *Server) getRack(c echo.Context) error {
	items, err := s.b.ListRacks()
	if err != nil {
		return err
	}
	for _, it := range items {
		if it.ID == c.Param("id") {
			return c.JSON(http.StatusOK, rackView(it))
		}
	}
	return notFound("rack", c.Param("id"))
}

func validateRack(rs RackSpec) error {
	switch {
	case strings.TrimSpace(rs.Name) == "":
		return invalid("name", "required")
	case strings.TrimSpace(rs.Site) == "":
		return invalid("site", "required")
	case rs.Units < 0 || rs.Units > 100:
		return invalid("units", "must be 0..100 (rack units)")
	case rs.ID != "" && !idRe.MatchString(rs.ID):
		return invalid("id", "must match %s", idRe)
	}
	return firstErr(checkText("name", rs.Name, rules.MaxTextLen), checkText("site", rs.Site, rules.MaxTextLen),
		checkText("row", rs.Row, rules.MaxTextLen))
}

func (s *Server) createRack(c echo.Context) error {
	var rs RackSpec
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &rs, false); err != nil {
		return err
	}
	if err := validateRack(rs); err != nil {
		return err
	}
	if rs.ResourceVersion != 0 {
		return invalid("resource_version", "must be absent on create; use PUT /v1/racks/{id} to update")
	}
	out, err := s.b.PutRack(c.Request().Context(), store.Rack{Meta: store.Meta{ID: rs.ID}, Site: rs.Site,
		Name: rs.Name, Row: rs.Row, Units: rs.Units}, s.w(c, "", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, rackView(out))
}

func (s *Server) updateRack(c echo.Context) error {
	var rs RackSpec
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &rs, false); err != nil {
		return err
	}
	if rs.ID != "" && rs.ID != c.Param("id") {
		return invalid("id", "does not match the path")
	}
	rs.ID = c.Param("id")
	if err := validateRack(rs); err != nil {
		return err
	}
	if rs.ResourceVersion == 0 {
		return invalid("resource_version", "required on update")
	}
	out, err := s.b.PutRack(c.Request().Context(), store.Rack{Meta: store.Meta{ID: rs.ID, ResourceVersion: rs.ResourceVersion},
		Site: rs.Site, Name: rs.Name, Row: rs.Row, Units: rs.Units}, s.w(c, "", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rackView(out))
}

// ---- machines

var (
	idRe  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	hexRe = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// queryInt parses an optional integer query parameter within [lo, hi].
func queryInt(c echo.Context, name string, def, lo, hi int) (int, error) {
	v := c.QueryParam(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, invalid(name, "must be an integer in %d..%d", lo, hi)
	}
	return n, nil
}

// validateLabels applies the label rule (rules.CheckLabel) to each label,
// in key order so that the first bad label named is always the same.
func validateLabels(field string, l map[string]string) error {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := rules.CheckLabel(k, l[k]); err != nil {
			return invalid(field+"."+k, "%v", err)
		}
	}
	return nil
}

// normMAC checks a machine MAC by the store's one rule (store.ParseMachineMAC:
// EUI-48, unicast, not all zeros) and returns its lower-case colon form.
func normMAC(field, s string) (string, error) {
	m, err := store.ParseMachineMAC(s)
	if err != nil {
		return "", invalid(field, "%v", err)
	}
	return m, nil
}

// validateHardware checks and normalises intended hardware in place.
func validateHardware(field string, h *store.Hardware) error {
	t := func(name, v string) error { return checkText(field+"."+name, v, rules.MaxTextLen) }
	if err := firstErr(t("serial", h.Serial), t("vendor", h.Vendor), t("model", h.Model), t("uuid", h.UUID),
		t("firmware", h.Firmware)); err != nil {
		return err
	}
	if h.BMCAddress != "" {
		if err := rules.CheckHostPort(h.BMCAddress); err != nil {
			return invalid(field+".bmc_address", "%v", err)
		}
	}
	for i, d := range h.Disks {
		f := fmt.Sprintf("disks[%d].", i)
		if err := firstErr(t(f+"name", d.Name), t(f+"serial", d.Serial), t(f+"wwn", d.WWN), t(f+"model", d.Model)); err != nil {
			return err
		}
	}
	if h.CPUs < 0 {
		return invalid(field+".cpus", "must not be negative")
	}
	if h.GPUs < 0 {
		return invalid(field+".gpus", "must not be negative")
	}
	seen := map[string]bool{}
	for i := range h.NICs {
		if err := t(fmt.Sprintf("nics[%d].name", i), h.NICs[i].Name); err != nil {
			return err
		}
		f := fmt.Sprintf("%s.nics[%d].mac", field, i)
		m, err := normMAC(f, h.NICs[i].MAC)
		if err != nil {
			return err
		}
		if seen[m] {
			return invalid(f, "duplicate MAC %s", m)
		}
		seen[m] = true
		h.NICs[i].MAC = m
	}
	if h.BMCMAC != "" {
		m, err := normMAC(field+".bmc_mac", h.BMCMAC)
		if err != nil {
			return err
		}
		h.BMCMAC = m
	}
	return nil
}

func validateMachineFields(rackUnit int, labels map[string]string, h *store.Hardware, mode store.BootMode, ip string) error {
	if rackUnit < 0 || rackUnit > 100 {
		return invalid("rack_unit", "must be 0..100")
	}
	if err := validateLabels("labels", labels); err != nil {
		return err
	}
	if h != nil {
		if err := validateHardware("intended", h); err != nil {
			return err
		}
	}
	switch mode {
	case "", store.BootModeUEFI, store.BootModeLegacy:
	default:
		return invalid("boot_mode", "must be uefi or legacy")
	}
	if ip != "" {
		a, err := netip.ParseAddr(ip)
		if err != nil || !a.Is4() {
			return invalid("ipv4", "%q is not an IPv4 address", ip)
		}
	}
	return nil
}

// validateMachineText checks a machine's name (rules.CheckName, the rule
// import applies) and its other free-text fields (rules.CheckText).
func validateMachineText(name, site, rack, bootOverride string, rd store.DiskRule) error {
	if name != "" {
		if err := rules.CheckName(name); err != nil {
			return invalid("name", "%v", err)
		}
	}
	return firstErr(checkText("site", site, rules.MaxTextLen), checkText("rack", rack, rules.MaxTextLen),
		checkText("boot_override", bootOverride, rules.MaxTextLen),
		checkText("root_disk.serial", rd.Serial, rules.MaxTextLen), checkText("root_disk.wwn", rd.WWN, rules.MaxTextLen))
}

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

// consistentReader is implemented by backends that can make a read current
// (the store's Barrier: forwarded to the leader, then wait for the local
// replica to apply). Reads default to the local replica.
type consistentReader interface {
	Barrier(ctx context.Context) error
}

// maybeBarrier honours ?consistent=true (documented in /v1/openapi.json).
func (s *Server) maybeBarrier(c echo.Context) error {
	switch c.QueryParam("consistent") {
	case "", "false":
		return nil
	case "true":
	default:
		return invalid("consistent", "want true or false")
	}
	cr, ok := s.b.(consistentReader)
	if !ok {
		return nil // the backend's reads are always current
	}
	return cr.Barrier(c.Request().Context())
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
	if err := validateMachineText(sp.Name, sp.Site, sp.Rack, sp.BootOverride, sp.RootDisk); err != nil {
		return err
	}
	if err := validateMachineFields(sp.RackUnit, sp.Labels, &sp.Intended, sp.BootMode, sp.IPv4); err != nil {
		return err
	}
	if len(sp.Intended.NICs) == 0 && sp.Intended.Serial == "" {
		return invalid("intended.nics", "a machine needs at least one NIC MAC or a serial")
	}
	m := store.Machine{Name: sp.Name, Site: sp.Site, Rack: sp.Rack, RackUnit: sp.RackUnit, Labels: sp.Labels,
		Intended: sp.Intended, RootDisk: sp.RootDisk, Wipe: sp.Wipe, BootMode: sp.BootMode, IPv4: sp.IPv4,
		BootOverride: sp.BootOverride, Netboot: sp.Netboot, State: store.StateRegistered}
	out, err := s.b.PutMachine(c.Request().Context(), m, s.w(c, "created", ""))
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
	if p.ResourceVersion == 0 {
		return invalid("resource_version", "required: the resource_version you read")
	}
	m, err := s.b.GetMachine(c.Param("id"))
	if err != nil {
		return err
	}
	if m.ResourceVersion != p.ResourceVersion {
		return fmt.Errorf("%w: machine %s is at resource_version %d, not %d; GET it and retry",
			store.ErrConflict, m.ID, m.ResourceVersion, p.ResourceVersion)
	}
	set := func(dst *string, v *string) {
		if v != nil {
			*dst = *v
		}
	}
	set(&m.Name, p.Name)
	set(&m.Site, p.Site)
	set(&m.Rack, p.Rack)
	set(&m.IPv4, p.IPv4)
	set(&m.BootOverride, p.BootOverride)
	if p.RackUnit != nil {
		m.RackUnit = *p.RackUnit
	}
	if p.Labels != nil {
		m.Labels = *p.Labels
	}
	if p.Intended != nil {
		m.Intended = *p.Intended
	}
	if p.RootDisk != nil {
		m.RootDisk = *p.RootDisk
	}
	if p.Wipe != nil {
		m.Wipe = *p.Wipe
	}
	if p.BootMode != nil {
		m.BootMode = *p.BootMode
	}
	if p.Netboot != nil {
		m.Netboot = p.Netboot
	}
	var hw *store.Hardware
	if p.Intended != nil {
		hw = &m.Intended
	}
	if err := validateMachineText(m.Name, m.Site, m.Rack, m.BootOverride, m.RootDisk); err != nil {
		return err
	}
	if err := validateMachineFields(m.RackUnit, m.Labels, hw, m.BootMode, m.IPv4); err != nil {
		return err
	}
	out, err := s.b.PutMachine(c.Request().Context(), m, s.w(c, "intended_updated", ""))
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

func validateClaim(field string, cl *store.Claim) error {
	if cl.Image == "" {
		return invalid(field+".image", "required: an image ID from GET /v1/images")
	}
	if cl.Hostname != "" {
		if err := rules.CheckHostname(cl.Hostname); err != nil {
			return invalid(field+".hostname", "%v", err)
		}
	}
	if err := checkText(field+".role", cl.Role, rules.MaxTextLen); err != nil {
		return err
	}
	return validateLabels(field+".labels", cl.Labels)
}

// validateWhy checks the free-text reason and message a client gives for an action.
func validateWhy(reason, message string) error {
	return firstErr(checkText("reason", reason, rules.MaxTextLen), checkText("message", message, rules.MaxDescriptionLen))
}

func (s *Server) provision(c echo.Context) error {
	var req ProvisionRequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, false); err != nil {
		return err
	}
	cl := storeClaim(req.Claim)
	if err := firstErr(validateClaim("claim", &cl), validateWhy(req.Reason, "")); err != nil {
		return err
	}
	m, err := s.b.Provision(c.Request().Context(), c.Param("id"), cl, s.w(c, req.Reason, ""))
	if err != nil {
		return err
	}
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
	if err := validateLabels("labels", req.Labels); err != nil {
		return err
	}
	cl := storeClaim(req.Claim)
	if err := validateClaim("claim", &cl); err != nil {
		return err
	}
	cl.Role = req.Role
	ms, err := s.b.ClaimMachines(c.Request().Context(), req.Role, req.Labels, req.Count, cl, s.w(c, req.Reason, ""))
	if err != nil {
		return err
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
func (s *Server) erase(c echo.Context) error   { return s.action(c, s.b.Erase) }
func (s *Server) inspect(c echo.Context) error { return s.action(c, s.b.Inspect) }

func (s *Server) enrollBMC(c echo.Context) error {
	var req BMCEnrollRequest
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &req, false); err != nil {
		return err
	}
	if req.Driver == "" {
		req.Driver = "auto"
	}
	switch {
	case req.Address == "":
		return invalid("address", "required: host or host:port of the BMC")
	case rules.CheckHostPort(req.Address) != nil:
		return invalid("address", "%v", rules.CheckHostPort(req.Address))
	case rules.CheckText(req.Username, rules.MaxTextLen) != nil:
		return invalid("username", "%v", rules.CheckText(req.Username, rules.MaxTextLen))
	case req.Driver != "redfish" && req.Driver != "ipmi" && req.Driver != "auto":
		return invalid("driver", "%q is not redfish|ipmi|auto", req.Driver)
	case req.Username == "":
		return invalid("username", "required")
	case req.Password == "":
		return invalid("password", "required")
	}
	b := store.BMC{Address: req.Address, Driver: req.Driver, Username: req.Username,
		InsecureTLS: req.InsecureTLS, CACertPEM: req.CACertPEM}
	out, err := s.b.EnrollBMC(c.Request().Context(), c.Param("id"), b, req.Password, s.w(c, "bmc_enrolled", ""))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, bmcView(out))
}

// ---- images

func (s *Server) listImages(c echo.Context) error {
	items, err := s.b.ListImages()
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ImageList{Items: views(items, imageView)})
}

func (s *Server) getImage(c echo.Context) error {
	im, err := s.b.GetImage(c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, imageView(im))
}

type countingReader struct {
	r io.Reader
	n func(int)
}

func (cr countingReader) Read(p []byte) (int, error) {
	n, err := cr.r.Read(p)
	cr.n(n)
	return n, err
}

// uploadImage streams the request body (the image bytes) to the backend.
// Metadata comes in the query: name, version, sha256 (hex of the raw
// bytes), format (raw|gzip|zstd, default raw), size (bytes of the raw
// content, 1..store.MaxImageSize: required for gzip and zstd, optional for
// raw), source. POST lets the store choose the ID (201). PUT
// /v1/images/{id} uploads under that ID: 201 when it is new; when an image
// with that ID exists with the same name, version, format and sha256, 200
// with that image and the body is not read (idempotent); any other image
// there is 409 (images are immutable).
func (s *Server) uploadImage(c echo.Context) error {
	q := c.QueryParams()
	meta := store.Image{Meta: store.Meta{ID: c.Param("id")}, Name: q.Get("name"), Version: q.Get("version"),
		SHA256: strings.ToLower(q.Get("sha256")), Format: q.Get("format"), Source: q.Get("source")}
	if meta.Format == "" {
		meta.Format = "raw"
	}
	if v := q.Get("size"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 || n > store.MaxImageSize {
			return invalid("size", "must be the raw content's length in bytes: an integer 1..%d (16 TiB)", uint64(store.MaxImageSize))
		}
		meta.Size = n
	}
	switch {
	case meta.Name == "":
		return invalid("name", "required query parameter")
	case meta.Version == "":
		return invalid("version", "required query parameter")
	case !hexRe.MatchString(meta.SHA256):
		return invalid("sha256", "required: 64 hex digits (sha256sum of the image)")
	case meta.Format != "raw" && meta.Format != "gzip" && meta.Format != "zstd":
		return invalid("format", "%q is not raw|gzip|zstd", meta.Format)
	case meta.Format != "raw" && meta.Size == 0:
		return invalid("size", "required for a %s image: the length in bytes of its decompressed content", meta.Format)
	case meta.ID != "" && !idRe.MatchString(meta.ID):
		return invalid("id", "must match %s", idRe)
	}
	if err := firstErr(checkText("version", meta.Version, rules.MaxTextLen),
		checkText("source", meta.Source, rules.MaxDescriptionLen)); err != nil {
		return err
	}
	if meta.Source == "" {
		meta.Source = "upload"
	}
	status := http.StatusCreated
	if meta.ID != "" {
		if _, err := s.b.GetImage(meta.ID); err == nil {
			status = http.StatusOK // the backend returns it if it is the same image, else a conflict
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	body := countingReader{r: c.Request().Body, n: func(n int) { s.m.uploadBytes.Add(float64(n)) }}
	im, err := s.b.UploadImage(c.Request().Context(), meta, body, s.w(c, "image_uploaded", ""))
	if err != nil {
		return err
	}
	return c.JSON(status, imageView(im))
}

func (s *Server) deleteImage(c echo.Context) error {
	if err := s.b.DeleteImage(c.Request().Context(), c.Param("id"), s.w(c, "image_deleted", "")); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// ---- jobs and events

func (s *Server) listJobs(c echo.Context) error {
	items, err := s.b.ListJobs(c.QueryParam("machine"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, JobList{Items: views(items, jobView)})
}

func (s *Server) getJob(c echo.Context) error {
	j, err := s.b.GetJob(c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, jobView(j))
}

// events serves ?after=CURSOR&limit=N&wait=DURATION. With wait, an empty
// answer is held until an event arrives or the wait (capped at
// MaxEventWait) ends; then it returns what there is (possibly nothing).
func (s *Server) events(c echo.Context) error {
	var after uint64
	if v := c.QueryParam("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return invalid("after", "must be an event index (unsigned integer)")
		}
		after = n
	}
	limit, err := queryInt(c, "limit", s.cfg.DefaultListLimit, 1, s.cfg.MaxListLimit)
	if err != nil {
		return err
	}
	var wait time.Duration
	if v := c.QueryParam("wait"); v != "" {
		if wait, err = time.ParseDuration(v); err != nil || wait < 0 {
			return invalid("wait", "must be a duration like 30s")
		}
		wait = min(wait, s.cfg.MaxEventWait)
	}
	read := func() ([]store.Event, error) {
		if after == math.MaxUint64 {
			// No event follows the largest index, and a backend seeking
			// to after+1 would wrap to 0 and return the whole log.
			return nil, nil
		}
		return s.b.Events(after, limit)
	}
	evs, err := read()
	if err != nil {
		return err
	}
	if len(evs) == 0 && wait > 0 {
		ctx, cancel := context.WithTimeout(c.Request().Context(), wait)
		defer cancel()
		for len(evs) == 0 {
			if err := s.b.WaitEvents(ctx, after); err != nil {
				if ctx.Err() != nil && c.Request().Context().Err() == nil {
					break // the wait ended with nothing new: answer empty
				}
				return err
			}
			if evs, err = read(); err != nil {
				return err
			}
		}
	}
	out := EventList{Events: views(evs, eventView), Next: after}
	if len(evs) > 0 {
		out.Next = evs[len(evs)-1].Index
	}
	return c.JSON(http.StatusOK, out)
}

// ---- agent protocol (package agentapi)

func (s *Server) agentRegister(c echo.Context) error {
	p, err := s.authAgent(c)
	if err != nil {
		return err
	}
	var reg agentapi.Registration
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &reg, false); err != nil {
		return err
	}
	if err := s.bodyMachine(p, reg.MachineID); err != nil {
		return err
	}
	reg.MachineID = p.Machine
	t, err := s.b.AgentRegister(c.Request().Context(), p.Machine, reg)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, t)
}

func (s *Server) agentTask(c echo.Context) error {
	p, err := s.authAgent(c)
	if err != nil {
		return err
	}
	t, err := s.b.AgentTask(c.Request().Context(), p.Machine)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, t)
}

var knownSteps = map[string]bool{
	agentapi.StepInspect: true, agentapi.StepCheck: true, agentapi.StepWrite: true, agentapi.StepVerify: true,
	agentapi.StepStage: true, agentapi.StepFinalize: true, agentapi.StepReboot: true, agentapi.StepErase: true,
}

// validateReport checks a step report against the closed enums and
// sanitises its message (control characters → space, truncated to
// agentapi.MaxMessageLen bytes on a UTF-8 boundary).
func validateReport(r *agentapi.Report) error {
	if !knownSteps[r.Step] {
		return invalid("step", "%q is not a known step", r.Step)
	}
	switch r.State {
	case agentapi.StateStarted, agentapi.StateRunning, agentapi.StateSucceeded, agentapi.StateFailed:
	default:
		return invalid("state", "%q is not started|running|succeeded|failed", r.State)
	}
	if r.Reason != agentapi.ReasonNone {
		ok := false
		for _, x := range agentapi.Reasons {
			ok = ok || x == r.Reason
		}
		if !ok {
			return invalid("reason", "%q is not a known reason", r.Reason)
		}
	}
	if r.State == agentapi.StateFailed && r.Reason == agentapi.ReasonNone {
		return invalid("reason", "required when state is failed")
	}
	if r.Progress < 0 || r.Progress > 1 || r.Progress != r.Progress {
		return invalid("progress", "must be 0..1")
	}
	r.Message = rules.SanitizeText(r.Message, agentapi.MaxMessageLen)
	return nil
}

func (s *Server) agentReport(c echo.Context) error {
	p, err := s.authAgent(c)
	if err != nil {
		return err
	}
	var rep agentapi.Report
	if err := decodeJSON(c, s.cfg.MaxJSONBytes, &rep, false); err != nil {
		return err
	}
	if err := s.bodyMachine(p, rep.MachineID); err != nil {
		return err
	}
	rep.MachineID = p.Machine
	if err := validateReport(&rep); err != nil {
		return err
	}
	if err := s.b.AgentReport(c.Request().Context(), p.Machine, rep); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
