package api

import (
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"kiln/api/agentapi"
)

// The OpenAPI 3.0 document is built from the table below, written by hand
// beside (not from) the route registrations in server.go; schemas come from
// the Go types by reflection so they cannot drift from the wire.
// TestOpenAPIMatchesRoutes walks echo's routes and this table both ways.

type docParam struct {
	Name, Desc, Type string // Type: string | integer
	Repeat           bool
}

type docOp struct {
	Method, Path string // OpenAPI path template, e.g. /v1/machines/{id}
	Summary      string
	Role         Role // "" = no auth
	Query        []docParam
	Body         any    // JSON request body type (zero value), or nil
	RawBody      string // non-JSON request body media type
	Status       int
	AlsoStatus   int // a second success status with the same body, or 0
	Resp         any // response body type, nil for no body
	RespType     string
}

var (
	pID         = docParam{Name: "id"}
	pLimit      = docParam{Name: "limit", Type: "integer", Desc: "page size (items)"}
	pConsistent = docParam{Name: "consistent", Type: "boolean", Desc: "true: read only after this node has applied everything the leader has committed (a raft barrier through the leader); default: the local replica"}
	pAfterS     = docParam{Name: "after", Type: "string", Desc: "cursor: the next value of the previous page"}
	pImageQuery = []docParam{
		{Name: "name", Type: "string", Desc: "image name (required)"},
		{Name: "version", Type: "string", Desc: "image version (required)"},
		{Name: "sha256", Type: "string", Desc: "hex SHA-256 of the raw image bytes, decompressed for gzip and zstd (required)"},
		{Name: "format", Type: "string", Desc: "raw | gzip | zstd (default raw)"},
		{Name: "size", Type: "integer", Desc: "bytes of the raw (decompressed) content, 1 to 17592186044416 (16 TiB); required for gzip and zstd. The body must decode in its format to exactly this many bytes with this sha256, else 400 and nothing is kept"},
		{Name: "source", Type: "string", Desc: "where it came from (free text)"},
	}
)

var docOps = []docOp{
	{Method: "GET", Path: "/healthz", Summary: "Liveness", Status: 200, Resp: Status{}},
	{Method: "GET", Path: "/readyz", Summary: "Readiness (503 until the store is ready)", Status: 200, Resp: Status{}},
	{Method: "GET", Path: "/metrics", Summary: "Prometheus metrics", Status: 200, RespType: "text/plain"},
	{Method: "GET", Path: "/v1/openapi.json", Summary: "This document", Status: 200, RespType: "application/json"},
	{Method: "GET", Path: "/v1/site/status", Summary: "Site status for central: counts by state, failures, versions, raft health", Role: RoleViewer, Status: 200, Resp: SiteStatus{}},

	{Method: "GET", Path: "/v1/sites", Summary: "List sites", Role: RoleViewer, Status: 200, Resp: SiteList{}},
	{Method: "POST", Path: "/v1/sites", Summary: "Create a site", Role: RoleAdmin, Body: SiteSpec{}, Status: 201, Resp: Site{}},
	{Method: "GET", Path: "/v1/sites/{id}", Summary: "Get a site", Role: RoleViewer, Status: 200, Resp: Site{}},
	{Method: "PUT", Path: "/v1/sites/{id}", Summary: "Update a site (resource_version required, 409 on conflict)", Role: RoleAdmin, Body: SiteSpec{}, Status: 200, Resp: Site{}},

	{Method: "GET", Path: "/v1/racks", Summary: "List racks", Role: RoleViewer, Query: []docParam{{Name: "site", Type: "string", Desc: "only racks of this site"}}, Status: 200, Resp: RackList{}},
	{Method: "POST", Path: "/v1/racks", Summary: "Create a rack", Role: RoleAdmin, Body: RackSpec{}, Status: 201, Resp: Rack{}},
	{Method: "GET", Path: "/v1/racks/{id}", Summary: "Get a rack", Role: RoleViewer, Status: 200, Resp: Rack{}},
	{Method: "PUT", Path: "/v1/racks/{id}", Summary: "Update a rack (resource_version required, 409 on conflict)", Role: RoleAdmin, Body: RackSpec{}, Status: 200, Resp: Rack{}},

	{Method: "GET", Path: "/v1/machines", Summary: "List machines, filtered and paginated", Role: RoleViewer, Query: []docParam{
		{Name: "state", Type: "string", Desc: "lifecycle state"}, {Name: "rack", Type: "string", Desc: "rack ID"},
		{Name: "label", Type: "string", Desc: "key=value; repeat for AND", Repeat: true}, pLimit, pAfterS}, Status: 200, Resp: MachineList{}},
	{Method: "POST", Path: "/v1/machines", Summary: "Create one registered machine", Role: RoleAdmin, Body: MachineSpec{}, Status: 201, Resp: Machine{}},
	{Method: "POST", Path: "/v1/machines/import", Summary: "Import a purchase record / rack plan (all or nothing)", Role: RoleAdmin,
		Query: []docParam{{Name: "format", Type: "string", Desc: "csv | json | netbox"}}, RawBody: "text/csv", Status: 201, Resp: ImportResult{}},
	{Method: "POST", Path: "/v1/machines/claim", Summary: "Claim N available machines by role and labels, and provision them", Role: RoleOperator, Body: ClaimRequest{}, Status: 202, Resp: ClaimResponse{}},
	{Method: "GET", Path: "/v1/machines/{id}", Summary: "Get a machine", Role: RoleViewer, Query: []docParam{pConsistent}, Status: 200, Resp: Machine{}},
	{Method: "PATCH", Path: "/v1/machines/{id}", Summary: "Update intended fields (resource_version required, 409 on conflict)", Role: RoleAdmin, Body: MachinePatch{}, Status: 200, Resp: Machine{}},
	{Method: "POST", Path: "/v1/machines/{id}/provision", Summary: "Provision an available machine with a claim", Role: RoleOperator, Body: ProvisionRequest{}, Status: 202, Resp: Machine{}},
	{Method: "POST", Path: "/v1/machines/{id}/release", Summary: "Release a machine (erase, then available)", Role: RoleOperator, Body: ActionRequest{}, Status: 202, Resp: Machine{}},
	{Method: "POST", Path: "/v1/machines/{id}/erase", Summary: "Erase a machine's disks", Role: RoleOperator, Body: ActionRequest{}, Status: 202, Resp: Machine{}},
	{Method: "POST", Path: "/v1/machines/{id}/inspect", Summary: "(Re)inspect a machine", Role: RoleOperator, Body: ActionRequest{}, Status: 202, Resp: Machine{}},
	{Method: "POST", Path: "/v1/machines/{id}/bmc", Summary: "Enroll the machine's BMC (password write-only)", Role: RoleAdmin, Body: BMCEnrollRequest{}, Status: 201, Resp: BMC{}},

	{Method: "GET", Path: "/v1/images", Summary: "List images", Role: RoleViewer, Status: 200, Resp: ImageList{}},
	{Method: "POST", Path: "/v1/images", Summary: "Upload an image (streamed body, declared sha256)", Role: RoleAdmin, Query: pImageQuery, RawBody: "application/octet-stream", Status: 201, Resp: Image{}},
	{Method: "GET", Path: "/v1/images/{id}", Summary: "Get an image", Role: RoleViewer, Status: 200, Resp: Image{}},
	{Method: "PUT", Path: "/v1/images/{id}", Summary: "Upload an image under a chosen ID: 201 when new; 200 with the stored image, the body unread, when that ID already holds the same name, version, format and sha256 (idempotent); 409 when it holds other content (images are immutable)", Role: RoleAdmin, Query: pImageQuery, RawBody: "application/octet-stream", Status: 201, AlsoStatus: 200, Resp: Image{}},
	{Method: "PUT", Path: "/v1/images/{id}/manifest", Summary: "Make the image a release (issue 15): layers pinned by SHA-256 (the base layer is the image itself; every other layer a raw catalog image) and the kubeadm version it carries; the same manifest again is 200 unchanged, another one 409 (manifests are immutable)", Role: RoleAdmin, Body: ManifestRequest{}, Status: 200, Resp: Image{}},
	{Method: "DELETE", Path: "/v1/images/{id}", Summary: "Delete an image (409 image_in_use while a machine's claim names it; release the machine first)", Role: RoleAdmin, Status: 204},

	{Method: "GET", Path: "/v1/jobs", Summary: "List jobs", Role: RoleViewer, Query: []docParam{{Name: "machine", Type: "string", Desc: "only jobs of this machine"}}, Status: 200, Resp: JobList{}},
	{Method: "GET", Path: "/v1/jobs/{id}", Summary: "Get a job", Role: RoleViewer, Status: 200, Resp: Job{}},

	{Method: "GET", Path: "/v1/events", Summary: "Event feed after a cursor; long-poll with wait. A cursor older than the retained log (store.events retention) is 410 cursor_expired with oldest_cursor in the error body: resync from /v1/site/status and the machines, then follow from oldest_cursor", Role: RoleViewer, Query: []docParam{
		{Name: "after", Type: "integer", Desc: "cursor: event index (exclusive)"}, pLimit,
		{Name: "wait", Type: "string", Desc: "long-poll duration, e.g. 30s (capped)"},
		{Name: "subject", Type: "string", Desc: "only this subject's events, e.g. machine/m-1 (next may pass events that did not match)"}}, Status: 200, Resp: EventList{}},

	{Method: "POST", Path: "/v1/agent/register", Summary: "Agent: register with inventory, get a task", Role: RoleAgent, Body: agentapi.Registration{}, Status: 200, Resp: agentapi.Task{}},
	{Method: "GET", Path: "/v1/agent/task", Summary: "Agent: poll for the next task (X-Kiln-Machine header)", Role: RoleAgent, Status: 200, Resp: agentapi.Task{}},
	{Method: "POST", Path: "/v1/agent/report", Summary: "Agent: report a step", Role: RoleAgent, Body: agentapi.Report{}, Status: 204},
	{Method: "GET", Path: "/v1/agent/credentials", Summary: "Agent: the secret files of a release build's per-node layer (first-boot token, kubeadm configuration with the cluster token, cluster CA); 403 credentials_refused outside a release build or when the credential gate refuses", Role: RoleAgent, Status: 200, Resp: agentapi.Credentials{}},
	{Method: "POST", Path: "/v1/agent/firstboot", Summary: "Installed OS: the one first-boot report (bearer = the first-boot token of /etc/kiln/firstboot.json; any node accepts it); provisioned is recorded from it", Role: RoleAgent, Body: agentapi.FirstBootReport{}, Status: 204},
}

// schemaGen turns Go types into OpenAPI schemas under components/schemas.
type schemaGen struct {
	defs map[string]any
}

func schemaName(t reflect.Type) string {
	switch t.PkgPath() {
	case "kiln/api/agentapi":
		return "Agent" + t.Name()
	}
	return t.Name()
}

var timeType = reflect.TypeOf(time.Time{})
var durType = reflect.TypeOf(time.Duration(0))

func (g *schemaGen) schema(t reflect.Type) map[string]any {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t == durType:
		return map[string]any{"type": "integer", "format": "int64", "description": "nanoseconds"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		s := g.schema(t.Elem())
		if _, ref := s["$ref"]; ref {
			return map[string]any{"allOf": []any{s}, "nullable": true}
		}
		s["nullable"] = true
		return s
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint, reflect.Uint64, reflect.Uint32:
		s := map[string]any{"type": "integer"}
		if t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uint64 {
			s["minimum"] = 0
		}
		return s
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice, reflect.Array:
		return map[string]any{"type": "array", "items": g.schema(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": g.schema(t.Elem())}
	case reflect.Struct:
		name := schemaName(t)
		if _, ok := g.defs[name]; !ok {
			g.defs[name] = nil // placeholder against recursion
			props := map[string]any{}
			var req []string
			g.fields(t, props, &req)
			obj := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
			if len(req) > 0 {
				sort.Strings(req)
				obj["required"] = req
			}
			g.defs[name] = obj
		}
		return map[string]any{"$ref": "#/components/schemas/" + name}
	case reflect.Interface:
		return map[string]any{}
	}
	return map[string]any{}
}

func (g *schemaGen) fields(t reflect.Type, props map[string]any, req *[]string) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			g.fields(f.Type, props, req)
			continue
		}
		if name == "" {
			name = f.Name
		}
		props[name] = g.schema(f.Type)
		if !strings.Contains(opts, "omitempty") && f.Type.Kind() != reflect.Pointer {
			*req = append(*req, name)
		}
	}
}

// OpenAPI returns the OpenAPI 3.0.3 document of the API (a JSON-ready map).
func OpenAPI() map[string]any {
	g := &schemaGen{defs: map[string]any{}}
	errRef := g.schema(reflect.TypeOf(ErrorBody{}))
	paths := map[string]any{}
	for _, op := range append(append(append(append(append(append(append(docOps, clusterDocOps()...), backupDocOps()...), remediationDocOps()...), leaseDocOps()...), firmwareDocOps()...), attestDocOps()...), campaignDocOps()...) { // cluster.go, backup.go, remediation.go, leases.go, firmware.go, attest.go, campaigns.go
		o := map[string]any{"summary": op.Summary,
			"operationId": strings.ToLower(op.Method) + strings.NewReplacer("/", "_", "{", "", "}", "", ".", "_").Replace(op.Path)}
		var params []any
		if strings.Contains(op.Path, "{id}") {
			params = append(params, map[string]any{"name": "id", "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
		}
		for _, q := range op.Query {
			var sch map[string]any = map[string]any{"type": q.Type}
			if q.Repeat {
				sch = map[string]any{"type": "array", "items": map[string]any{"type": q.Type}}
			}
			params = append(params, map[string]any{"name": q.Name, "in": "query", "description": q.Desc, "schema": sch})
		}
		switch op.Role {
		case "":
			o["security"] = []any{}
		case RoleAgent:
			o["description"] = "Agent per-boot bearer token (kiln.token), checked against the machine the X-Kiln-Machine header names before the body is read; a body machine_id, when present, must name the same machine."
			params = append(params, map[string]any{"name": HeaderMachine, "in": "header", "required": true, "schema": map[string]any{"type": "string"}})
		default:
			o["description"] = "Needs role " + string(op.Role) + " or higher."
		}
		if params != nil {
			o["parameters"] = params
		}
		if op.Body != nil {
			o["requestBody"] = map[string]any{"required": true, "content": map[string]any{
				"application/json": map[string]any{"schema": g.schema(reflect.TypeOf(op.Body))}}}
		} else if op.RawBody != "" {
			o["requestBody"] = map[string]any{"required": true, "content": map[string]any{
				op.RawBody: map[string]any{"schema": map[string]any{"type": "string", "format": "binary"}}}}
		}
		ok := map[string]any{"description": http.StatusText(op.Status)}
		switch {
		case op.Resp != nil:
			ok["content"] = map[string]any{"application/json": map[string]any{"schema": g.schema(reflect.TypeOf(op.Resp))}}
		case op.RespType != "":
			ok["content"] = map[string]any{op.RespType: map[string]any{"schema": map[string]any{"type": "string"}}}
		}
		resps := map[string]any{
			strconv.Itoa(op.Status): ok,
			"default": map[string]any{"description": "error", "content": map[string]any{
				"application/json": map[string]any{"schema": errRef}}},
		}
		if op.AlsoStatus != 0 {
			also := map[string]any{"description": http.StatusText(op.AlsoStatus)}
			if c, ok := ok["content"]; ok {
				also["content"] = c
			}
			resps[strconv.Itoa(op.AlsoStatus)] = also
		}
		o["responses"] = resps
		p, _ := paths[op.Path].(map[string]any)
		if p == nil {
			p = map[string]any{}
			paths[op.Path] = p
		}
		p[strings.ToLower(op.Method)] = o
	}
	return map[string]any{
		"openapi": "3.0.3",
		"info": map[string]any{"title": "Kiln site API", "version": "v1",
			"description": "Site-local bare-metal provisioning. Errors are {\"error\":{\"code\",\"message\",\"field\"}} with stable codes."},
		"paths":    paths,
		"security": []any{map[string]any{"bearer": []any{}}},
		"components": map[string]any{
			"schemas":         g.defs,
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}},
		},
	}
}

func (s *Server) openapi(c echo.Context) error {
	return c.JSONBlob(http.StatusOK, s.doc)
}
