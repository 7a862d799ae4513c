package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	. "kiln/api"
	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/intake"
	"kiln/appliance/lifecycle/lifecycletest"
	"kiln/deploy/lab/testkit"
	"kiln/store"
)

const (
	adminTok    = "admin-secret-token"
	operatorTok = "operator-secret-token"
	viewerTok   = "viewer-secret-token"
)

// harness serves the API over real HTTP in front of the real domain: the
// lifecycle controller and its Service over a real store
// (lifecycletest.New), wired as the appliance wires them.
type harness struct {
	t      *testing.T
	d      *lifecycletest.Domain
	st     *store.Store
	s      *Server
	srv    *httptest.Server
	reg    *prometheus.Registry
	back   Backend
	health *healthSwitch
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testConfig has a token of each role and the appliance's error classes
// for the domain's errors.
func testConfig() Config {
	return Config{Tokens: []TokenSpec{
		{Name: "root", Role: RoleAdmin, SHA256: HashToken(adminTok)},
		{Name: "ops", Role: RoleOperator, SHA256: HashToken(operatorTok)},
		{Name: "ro", Role: RoleViewer, SHA256: HashToken(viewerTok)},
	}, ErrorClasses: lifecycletest.ErrorClasses()}
}

// healthSwitch is the real backend whose Health a test may replace (a
// follower, a node not ready), to see how the API answers.
type healthSwitch struct {
	Backend
	mu sync.Mutex
	h  *Health
}

func (b *healthSwitch) Health() Health {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.h != nil {
		return *b.h
	}
	return b.Backend.Health()
}

func (b *healthSwitch) set(h Health) { b.mu.Lock(); b.h = &h; b.mu.Unlock() }

// newHarness starts the domain and the API; wrap, if given, wraps the
// backend (fault injection over the real one).
func newHarness(t *testing.T, wrap ...func(Backend) Backend) *harness {
	t.Helper()
	return newHarnessConfig(t, testConfig(), wrap...)
}

func newHarnessConfig(t *testing.T, cfg Config, wrap ...func(Backend) Backend) *harness {
	t.Helper()
	d := lifecycletest.New(t)
	hs := &healthSwitch{Backend: d.Backend()}
	var b Backend = hs
	if len(wrap) > 0 {
		b = wrap[0](hs)
	}
	reg := prometheus.NewRegistry()
	s, err := New(cfg, b, reg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &harness{t: t, d: d, st: d.Store, s: s, srv: srv, reg: reg, back: b, health: hs}
}

type resp struct {
	code int
	body []byte
	hdr  http.Header
}

func (r resp) err() ErrorDetail {
	var eb ErrorBody
	_ = json.Unmarshal(r.body, &eb)
	return eb.Error
}

func (r resp) into(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// do sends a request over real HTTP. body: nil, []byte, string or a value to JSON-encode.
func (h *harness) do(method, path, token string, body any, hdr ...string) resp {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		js, err := json.Marshal(b)
		if err != nil {
			h.t.Fatal(err)
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequest(method, h.srv.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := h.srv.Client().Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{code: res.StatusCode, body: b, hdr: res.Header}
}

func (h *harness) want(r resp, code int, errCode string) {
	h.t.Helper()
	if r.code != code {
		h.t.Fatalf("status %d, want %d; body %s", r.code, code, r.body)
	}
	if errCode != "" && r.err().Code != errCode {
		h.t.Fatalf("error code %q, want %q; body %s", r.err().Code, errCode, r.body)
	}
}

// machine records a machine as a test fixture, straight into the store,
// and walks it along legal transitions to state.
func (h *harness) machine(name, mac string, state store.MachineState, labels map[string]string) store.Machine {
	h.t.Helper()
	return fixtureMachine(h.t, h.st, name, mac, state, labels)
}

func fixtureMachine(t testing.TB, st *store.Store, name, mac string, state store.MachineState, labels map[string]string) store.Machine {
	t.Helper()
	m, err := st.PutMachine(context.Background(), store.Machine{Name: name, State: store.StateRegistered, Labels: labels,
		Intended: store.Hardware{NICs: []store.NIC{{MAC: mac}}}}, store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	path := map[store.MachineState][]store.MachineState{
		store.StateRegistered:   nil,
		store.StateInspecting:   {store.StateInspecting},
		store.StateAvailable:    {store.StateInspecting, store.StateAvailable},
		store.StateProvisioning: {store.StateInspecting, store.StateAvailable, store.StateProvisioning},
		store.StateProvisioned:  {store.StateInspecting, store.StateAvailable, store.StateProvisioning, store.StateProvisioned},
		store.StateFailed:       {store.StateInspecting, store.StateFailed},
	}[state]
	for _, s := range path {
		m.State = s
		if m, err = st.PutMachine(context.Background(), m, store.W{Actor: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// get reads machine id from the store.
func (h *harness) get(id string) store.Machine {
	h.t.Helper()
	m, err := h.st.GetMachine(id)
	if err != nil {
		h.t.Fatal(err)
	}
	return m
}

// agentToken has the lifecycle issue a per-boot agent token for m, as it
// does when m netboots (BootFor on its first MAC).
func (h *harness) agentToken(m store.Machine) string {
	h.t.Helper()
	b, err := h.d.Controller.BootFor(context.Background(), m.Intended.NICs[0].MAC)
	if err != nil || b.Token == "" {
		h.t.Fatalf("boot %s: %+v %v", m.ID, b, err)
	}
	return b.Token
}

// addEvent appends ev to the store's log and returns its index.
func (h *harness) addEvent(ev store.Event) uint64 {
	h.t.Helper()
	if err := h.st.AppendEvents(context.Background(), []store.Event{ev}); err != nil {
		h.t.Fatal(err)
	}
	return h.st.LastEventIndex()
}

// events returns the store's events about subject, oldest first.
func (h *harness) events(subject string) []store.Event {
	h.t.Helper()
	all, err := h.st.Events(0, 100000)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []store.Event
	for _, ev := range all {
		if ev.Subject == subject {
			out = append(out, ev)
		}
	}
	return out
}

func (h *harness) image(data []byte) store.Image {
	h.t.Helper()
	sum := sha256.Sum256(data)
	im, err := h.d.Service.UploadImage(context.Background(), store.Image{Name: fmt.Sprintf("ubuntu-%x", sum[:4]), Version: "24.04",
		SHA256: hex.EncodeToString(sum[:]), Format: "raw"}, bytes.NewReader(data), store.W{})
	if err != nil {
		h.t.Fatal(err)
	}
	return im
}

func TestRoles(t *testing.T) {
	h := newHarness(t)
	m := h.machine("n1", "52:54:00:00:00:01", store.StateAvailable, nil)
	im := h.image([]byte("disk"))
	prov := ProvisionRequest{Claim: Claim{Image: im.ID}}
	patch := map[string]any{"resource_version": m.ResourceVersion, "name": "renamed"}

	// No token / unknown token: 401.
	h.want(h.do("GET", "/v1/machines", "", nil), 401, CodeUnauthorized)
	h.want(h.do("GET", "/v1/machines", "nope", nil), 401, CodeUnauthorized)
	h.want(h.do("GET", "/v1/machines", "", nil, "Authorization", "Basic Zm9vOmJhcg=="), 401, CodeUnauthorized)

	// Viewer: reads yes, every write no.
	h.want(h.do("GET", "/v1/machines", viewerTok, nil), 200, "")
	h.want(h.do("GET", "/v1/machines/"+m.ID, viewerTok, nil), 200, "")
	h.want(h.do("GET", "/v1/site/status", viewerTok, nil), 200, "")
	for _, w := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/v1/machines/" + m.ID + "/provision", prov},
		{"POST", "/v1/machines/" + m.ID + "/erase", nil},
		{"POST", "/v1/machines/" + m.ID + "/inspect", nil},
		{"POST", "/v1/machines/" + m.ID + "/release", nil},
		{"PATCH", "/v1/machines/" + m.ID, patch},
		{"POST", "/v1/machines/claim", ClaimRequest{Role: "worker", Count: 1, Claim: Claim{Image: im.ID}}},
		{"POST", "/v1/sites", SiteSpec{Name: "x"}},
		{"DELETE", "/v1/images/" + im.ID, nil},
		{"POST", "/v1/machines/import?format=csv", "name,serial,mac,rack\n"},
	} {
		r := h.do(w.method, w.path, viewerTok, w.body)
		h.want(r, 403, CodeForbidden)
	}
	if got, _ := h.st.GetMachine(m.ID); got.State != store.StateAvailable || got.Name != "n1" {
		t.Fatalf("viewer changed the machine: %+v", got)
	}
	if _, err := h.st.GetImage(im.ID); err != nil {
		t.Fatal("viewer deleted the image")
	}

	// Operator: actions yes, intended-field edits (admin) no.
	h.want(h.do("PATCH", "/v1/machines/"+m.ID, operatorTok, patch), 403, CodeForbidden)
	r := h.do("POST", "/v1/machines/"+m.ID+"/provision", operatorTok, prov)
	h.want(r, 202, "")
	var got store.Machine
	r.into(t, &got)
	// The claim waits on the available machine for its agent (the build starts at its next task poll).
	if got.State != store.StateAvailable || got.Claim == nil || got.Claim.Image != im.ID {
		t.Fatalf("provision: %+v", got)
	}
	// The actor of the write is the token's name.
	evs := h.events("machine/" + m.ID)
	if last := evs[len(evs)-1]; last.Actor != "token:ops" || last.Kind != "updated" {
		t.Fatalf("last event %+v", last)
	}
	// Admin: everything.
	h.want(h.do("POST", "/v1/sites", adminTok, SiteSpec{ID: "fra1", Name: "Frankfurt 1"}), 201, "")
}

func TestAgentTokenBoundToMachine(t *testing.T) {
	h := newHarness(t)
	a := h.machine("a", "52:54:00:00:00:0a", store.StateInspecting, nil)
	b := h.machine("b", "52:54:00:00:00:0b", store.StateInspecting, nil)
	tokA := h.agentToken(a)
	h.agentToken(b)
	stepEvents := func(id string) (n int) {
		for _, ev := range h.events("machine/" + id) {
			if ev.Kind == "step" {
				n++
			}
		}
		return n
	}
	rep := func(id string) agentapi.Report {
		return agentapi.Report{MachineID: id, Step: agentapi.StepInspect, State: agentapi.StateSucceeded}
	}

	// No X-Kiln-Machine header: refused before the body is read (the token
	// is checked against the header's machine), whatever the body names.
	r := h.do("POST", "/v1/agent/report", tokA, rep(b.ID))
	h.want(r, 400, CodeInvalid)
	if r.err().Field != HeaderMachine {
		t.Fatalf("no header: %s", r.body)
	}
	h.want(h.do("POST", "/v1/agent/report", tokA, rep(a.ID)), 400, CodeInvalid)
	// A's token, header A, body B: refused.
	h.want(h.do("POST", "/v1/agent/report", tokA, rep(b.ID), HeaderMachine, a.ID), 403, CodeForbidden)
	h.want(h.do("POST", "/v1/agent/register", tokA, agentapi.Registration{MachineID: b.ID}, HeaderMachine, a.ID), 403, CodeForbidden)
	// A's token, header B: refused before the body is read.
	h.want(h.do("POST", "/v1/agent/report", tokA, rep(b.ID), HeaderMachine, b.ID), 403, CodeForbidden)
	h.want(h.do("GET", "/v1/agent/task", tokA, nil, HeaderMachine, b.ID), 403, CodeForbidden)
	h.want(h.do("POST", "/v1/agent/register", tokA, agentapi.Registration{MachineID: b.ID}, HeaderMachine, b.ID), 403, CodeForbidden)
	if n := stepEvents(b.ID); n != 0 || h.get(b.ID).Step != nil {
		t.Fatalf("B got %d reports from A's token (step %+v)", n, h.get(b.ID).Step)
	}
	// An admin token is not an agent token.
	h.want(h.do("POST", "/v1/agent/report", adminTok, rep(a.ID), HeaderMachine, a.ID), 403, CodeForbidden)
	// No token: 401.
	h.want(h.do("POST", "/v1/agent/report", "", rep(a.ID), HeaderMachine, a.ID), 401, CodeUnauthorized)
	// An agent token is not an API token.
	h.want(h.do("GET", "/v1/machines", tokA, nil), 401, CodeUnauthorized)

	// A for A: accepted, with and without the body's machine_id.
	h.want(h.do("POST", "/v1/agent/report", tokA, rep(a.ID), HeaderMachine, a.ID), 204, "")
	h.want(h.do("POST", "/v1/agent/report", tokA, rep(""), HeaderMachine, a.ID), 204, "")
	if n := stepEvents(a.ID); n != 2 || h.get(a.ID).Step == nil || h.get(a.ID).Step.Step != agentapi.StepInspect {
		t.Fatalf("A: %d step reports recorded, step %+v", n, h.get(a.ID).Step)
	}
	r = h.do("GET", "/v1/agent/task", tokA, nil, HeaderMachine, a.ID)
	h.want(r, 200, "")
	var task agentapi.Task
	r.into(t, &task)
	if task.Action != agentapi.ActionWait {
		t.Fatalf("task %+v", task)
	}
	h.want(h.do("GET", "/v1/agent/task", tokA, nil), 400, CodeInvalid)
	r = h.do("POST", "/v1/agent/register", tokA, agentapi.Registration{MachineID: a.ID, AgentVersion: "1"}, HeaderMachine, a.ID)
	h.want(r, 200, "")
	r.into(t, &task)
	if task.Action == "" || h.get(a.ID).Discovered == nil || h.get(b.ID).Discovered != nil {
		t.Fatalf("register: task %+v; the registration must be recorded for A only", task)
	}
	// Messages are sanitised and truncated.
	long := agentapi.Report{MachineID: a.ID, Step: agentapi.StepWrite, State: agentapi.StateFailed,
		Reason: agentapi.ReasonWriteFailed, Message: "bad\x1b[31m\n" + strings.Repeat("é", 600)}
	h.want(h.do("POST", "/v1/agent/report", tokA, long, HeaderMachine, a.ID), 204, "")
	msg := h.get(a.ID).Step.Message
	if len(msg) > agentapi.MaxMessageLen || strings.ContainsAny(msg, "\x1b\n") || !strings.HasPrefix(msg, "bad ") {
		t.Fatalf("message not sanitised: %q (%d bytes)", msg[:20], len(msg))
	}
}

func TestValidationNamesField(t *testing.T) {
	h := newHarness(t)
	m := h.machine("n1", "52:54:00:00:00:01", store.StateAvailable, nil)
	tok := h.agentToken(m)
	m = h.get(m.ID)
	cases := []struct {
		name, method, path, token string
		body                      any
		field, code               string
	}{
		{"bad mac", "POST", "/v1/machines", adminTok, `{"intended":{"nics":[{"mac":"zz:zz"}]}}`, "intended.nics[0].mac", CodeInvalid},
		{"type error", "POST", "/v1/machines", adminTok, `{"rack_unit":"top","intended":{"serial":"S1"}}`, "rack_unit", CodeInvalid},
		{"bad ipv4", "PATCH", "/v1/machines/" + m.ID, adminTok, map[string]any{"resource_version": m.ResourceVersion, "ipv4": "10.0.0.300"}, "ipv4", CodeInvalid},
		{"no rv", "PATCH", "/v1/machines/" + m.ID, adminTok, `{"name":"x"}`, "resource_version", CodeInvalid},
		{"bad label", "PATCH", "/v1/machines/" + m.ID, adminTok, map[string]any{"resource_version": m.ResourceVersion, "labels": map[string]string{"": "x"}}, "labels.", CodeInvalid},
		{"state filter", "GET", "/v1/machines?state=melted", viewerTok, nil, "state", CodeInvalid},
		{"limit", "GET", "/v1/machines?limit=0", viewerTok, nil, "limit", CodeInvalid},
		{"limit big", "GET", "/v1/machines?limit=100000", viewerTok, nil, "limit", CodeInvalid},
		{"label filter", "GET", "/v1/machines?label=novalue", viewerTok, nil, "label", CodeInvalid},
		{"events after", "GET", "/v1/events?after=-1", viewerTok, nil, "after", CodeInvalid},
		{"events wait", "GET", "/v1/events?wait=soon", viewerTok, nil, "wait", CodeInvalid},
		{"claim image", "POST", "/v1/machines/" + m.ID + "/provision", operatorTok, `{"claim":{}}`, "claim.image", CodeInvalid},
		{"claim hostname", "POST", "/v1/machines/" + m.ID + "/provision", operatorTok, `{"claim":{"image":"i","hostname":"Bad_Host"}}`, "claim.hostname", CodeInvalid},
		{"claim count", "POST", "/v1/machines/claim", operatorTok, `{"role":"worker","count":0,"claim":{"image":"i"}}`, "count", CodeInvalid},
		{"claim role", "POST", "/v1/machines/claim", operatorTok, `{"count":1,"claim":{"image":"i"}}`, "role", CodeInvalid},
		{"site name", "POST", "/v1/sites", adminTok, `{"id":"s1"}`, "name", CodeInvalid},
		{"rack units", "POST", "/v1/racks", adminTok, `{"site":"s","name":"r","units":-1}`, "units", CodeInvalid},
		{"bmc driver", "POST", "/v1/machines/" + m.ID + "/bmc", adminTok, `{"address":"10.0.0.1","driver":"telnet","username":"u","password":"p"}`, "driver", CodeInvalid},
		{"bmc password", "POST", "/v1/machines/" + m.ID + "/bmc", adminTok, `{"address":"10.0.0.1","username":"u"}`, "password", CodeInvalid},
		{"image sha", "POST", "/v1/images?name=a&version=1&sha256=abc", adminTok, "data", "sha256", CodeInvalid},
		{"image format", "POST", "/v1/images?name=a&version=1&format=lz4&sha256=" + strings.Repeat("a", 64), adminTok, "data", "format", CodeInvalid},
		{"image gzip size", "POST", "/v1/images?name=a&version=1&format=gzip&sha256=" + strings.Repeat("a", 64), adminTok, "data", "size", CodeInvalid},
		{"image size", "POST", "/v1/images?name=a&version=1&size=-1&sha256=" + strings.Repeat("a", 64), adminTok, "data", "size", CodeInvalid},
		{"import format", "POST", "/v1/machines/import?format=xlsx", adminTok, "x", "format", CodeInvalid},
		{"report progress", "POST", "/v1/agent/report", tok, `{"machine_id":"` + m.ID + `","step":"write","state":"running","progress":2}`, "progress", CodeInvalid},
		{"report reason", "POST", "/v1/agent/report", tok, `{"machine_id":"` + m.ID + `","step":"write","state":"failed"}`, "reason", CodeInvalid},
		{"report step", "POST", "/v1/agent/report", tok, `{"machine_id":"` + m.ID + `","step":"dance","state":"started"}`, "step", CodeInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(tc.method, tc.path, tc.token, tc.body, HeaderMachine, m.ID) // the header matters to agent routes only
			h.want(r, 400, tc.code)
			if d := r.err(); !strings.HasPrefix(d.Field, tc.field) || d.Field == "" || !strings.Contains(d.Message, d.Field) {
				t.Fatalf("field %q (message %q), want %q", d.Field, d.Message, tc.field)
			}
		})
	}
}

func TestUnknownFieldsRejected(t *testing.T) {
	h := newHarness(t)
	m := h.machine("n1", "52:54:00:00:00:01", store.StateAvailable, nil)
	tok := h.agentToken(m)
	m = h.get(m.ID)
	for _, tc := range []struct{ method, path, token, body, field string }{
		{"PATCH", "/v1/machines/" + m.ID, adminTok, fmt.Sprintf(`{"resource_version":%d,"state":"provisioned"}`, m.ResourceVersion), "state"},
		{"PATCH", "/v1/machines/" + m.ID, adminTok, fmt.Sprintf(`{"resource_version":%d,"intended":{"colour":"red"}}`, m.ResourceVersion), "colour"},
		{"POST", "/v1/sites", adminTok, `{"name":"s","owner":"me"}`, "owner"},
		{"POST", "/v1/machines/" + m.ID + "/erase", operatorTok, `{"force":true}`, "force"},
		{"POST", "/v1/agent/report", tok, `{"machine_id":"` + m.ID + `","step":"write","state":"running","extra":1}`, "extra"},
	} {
		r := h.do(tc.method, tc.path, tc.token, tc.body, HeaderMachine, m.ID)
		h.want(r, 400, CodeUnknownField)
		if r.err().Field != tc.field {
			t.Fatalf("%s %s: field %q, want %q", tc.method, tc.path, r.err().Field, tc.field)
		}
	}
	if got, _ := h.st.GetMachine(m.ID); got.State != store.StateAvailable {
		t.Fatalf("state changed through PATCH: %s", got.State)
	}
	// Malformed JSON.
	h.want(h.do("POST", "/v1/sites", adminTok, `{"name":`), 400, CodeBadJSON)
	h.want(h.do("POST", "/v1/sites", adminTok, ``), 400, CodeBadJSON)
	// Anything after the one JSON value is refused, naming the problem and
	// creating nothing (issue 20: `{"name":"a"} xyz` was accepted).
	before, _ := h.st.ListSites()
	for _, body := range []string{`{"name":"a"} xyz`, `{"name":"a"}{"name":"b"}`, `{"name":"a"}}`, `{"name":"a"}` + "\n\x00", `{"name":"a"} "s"`} {
		r := h.do("POST", "/v1/sites", adminTok, body)
		h.want(r, 400, CodeTrailingData)
		if !strings.Contains(r.err().Message, "after the JSON value") {
			t.Fatalf("%q: message %q", body, r.err().Message)
		}
	}
	if after, _ := h.st.ListSites(); len(after) != len(before) {
		t.Fatalf("a body with trailing data created a site: %d → %d", len(before), len(after))
	}
	// Trailing whitespace is no data (RFC 8259 section 2).
	h.want(h.do("POST", "/v1/sites", adminTok, "{\"name\":\"ws\"} \r\n\t "), 201, "")
	// Body-optional actions: whitespace only is an empty body, garbage is not.
	h.want(h.do("POST", "/v1/machines/"+m.ID+"/inspect", operatorTok, `{} x`), 400, CodeTrailingData)
}

func TestStaleResourceVersionConflicts(t *testing.T) {
	h := newHarness(t)
	m := h.machine("n1", "52:54:00:00:00:01", store.StateAvailable, nil)
	r := h.do("PATCH", "/v1/machines/"+m.ID, adminTok, map[string]any{"resource_version": m.ResourceVersion,
		"name": "n1-renamed", "labels": map[string]string{"zone": "a"}, "intended": store.Hardware{Serial: "S1",
			NICs: []store.NIC{{MAC: "52-54-00-00-00-01"}}}})
	h.want(r, 200, "")
	var got store.Machine
	r.into(t, &got)
	if got.Name != "n1-renamed" || got.ResourceVersion <= m.ResourceVersion || got.Labels["zone"] != "a" ||
		got.Intended.NICs[0].MAC != "52:54:00:00:00:01" || got.State != store.StateAvailable {
		t.Fatalf("patched %+v", got)
	}
	// The old version again: 409.
	r = h.do("PATCH", "/v1/machines/"+m.ID, adminTok, map[string]any{"resource_version": m.ResourceVersion, "name": "late"})
	h.want(r, 409, CodeConflict)
	if cur, _ := h.st.GetMachine(m.ID); cur.Name != "n1-renamed" {
		t.Fatalf("stale write applied: %s", cur.Name)
	}
	// CAS enforced by the backend too (sites): stale version → 409.
	r = h.do("POST", "/v1/sites", adminTok, SiteSpec{ID: "fra1", Name: "F"})
	h.want(r, 201, "")
	var site store.Site
	r.into(t, &site)
	h.want(h.do("PUT", "/v1/sites/fra1", adminTok, SiteSpec{ResourceVersion: site.ResourceVersion, Name: "F2"}), 200, "")
	h.want(h.do("PUT", "/v1/sites/fra1", adminTok, SiteSpec{ResourceVersion: site.ResourceVersion, Name: "F3"}), 409, CodeConflict)
	h.want(h.do("POST", "/v1/sites", adminTok, SiteSpec{ID: "fra1", Name: "again"}), 409, CodeConflict)
	h.want(h.do("GET", "/v1/sites/nope", viewerTok, nil), 404, CodeNotFound)
	h.want(h.do("GET", "/v1/machines/nope", viewerTok, nil), 404, CodeNotFound)
	h.want(h.do("PATCH", "/v1/machines/nope", adminTok, `{"resource_version":1}`), 404, CodeNotFound)
}

// TestWrongStateNamesStates: an action the machine's state does not allow
// is 409 wrong_state naming the state (the lifecycle's rule), and an
// illegal transition a backend reports is 409 illegal_transition with both
// states.
func TestWrongStateNamesStates(t *testing.T) {
	h := newHarness(t, func(b Backend) Backend { return illegal{b} })
	m := h.machine("n1", "52:54:00:00:00:01", store.StateRegistered, nil)
	im := h.image([]byte("x"))
	r := h.do("POST", "/v1/machines/"+m.ID+"/provision", operatorTok, ProvisionRequest{Claim: Claim{Image: im.ID}})
	h.want(r, 409, "wrong_state")
	if d := r.err(); !strings.Contains(d.Message, "state is registered, want available") {
		t.Fatalf("detail %+v", d)
	}
	if got := h.get(m.ID); got.Claim != nil || got.State != store.StateRegistered {
		t.Fatalf("machine changed: %+v", got)
	}
	r = h.do("POST", "/v1/machines/"+m.ID+"/erase", operatorTok, nil)
	h.want(r, 409, CodeIllegalTransition)
	if d := r.err(); d.From != "registered" || d.To != "erasing" || !strings.Contains(d.Message, "registered") {
		t.Fatalf("detail %+v", d)
	}
}

// illegal reports every erase as an illegal transition from registered.
type illegal struct{ Backend }

func (illegal) Erase(context.Context, string, store.W) (store.Machine, error) {
	return store.Machine{}, fmt.Errorf("erase: %w", &store.IllegalTransitionError{From: store.StateRegistered, To: store.StateErasing})
}

func TestEventsLongPoll(t *testing.T) {
	h := newHarness(t)
	cursor := h.addEvent(store.Event{Subject: "machine/x", Kind: "created"})

	// Without wait: returns at once, cursor unchanged.
	r := h.do("GET", fmt.Sprintf("/v1/events?after=%d", cursor), viewerTok, nil)
	h.want(r, 200, "")
	var el EventList
	r.into(t, &el)
	if len(el.Events) != 0 || el.Next != cursor {
		t.Fatalf("no-wait: %+v", el)
	}

	// With wait: held until an event arrives.
	type result struct {
		r resp
		d time.Duration
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		r := h.do("GET", fmt.Sprintf("/v1/events?after=%d&wait=20s", cursor), viewerTok, nil)
		done <- result{r, time.Since(start)}
	}()
	select {
	case res := <-done:
		t.Fatalf("long-poll returned before any event: %s", res.r.body)
	case <-time.After(300 * time.Millisecond):
	}
	idx := h.addEvent(store.Event{Subject: "machine/x", Kind: "transition", From: "a", To: "b"})
	select {
	case res := <-done:
		h.want(res.r, 200, "")
		res.r.into(t, &el)
		if len(el.Events) != 1 || el.Events[0].Index != idx || el.Next != idx {
			t.Fatalf("long-poll got %+v", el)
		}
		if res.d < 300*time.Millisecond || res.d > 10*time.Second {
			t.Fatalf("long-poll took %v", res.d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("long-poll did not return after the event")
	}

	// A wait that ends with nothing: 200, empty, after about the wait.
	start = time.Now()
	r = h.do("GET", fmt.Sprintf("/v1/events?after=%d&wait=250ms", idx), viewerTok, nil)
	h.want(r, 200, "")
	r.into(t, &el)
	if len(el.Events) != 0 || el.Next != idx || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("empty wait: %+v after %v", el, time.Since(start))
	}
	// The largest cursor has nothing after it (after+1 must not wrap to 0
	// and hand central the whole log again).
	r = h.do("GET", "/v1/events?after=18446744073709551615", viewerTok, nil)
	h.want(r, 200, "")
	r.into(t, &el)
	if len(el.Events) != 0 || el.Next != math.MaxUint64 {
		t.Fatalf("after=MaxUint64: %+v", el)
	}
	// limit pages through.
	for i := 0; i < 5; i++ {
		h.addEvent(store.Event{Subject: "machine/y", Kind: "step"})
	}
	r = h.do("GET", fmt.Sprintf("/v1/events?after=%d&limit=2", idx), viewerTok, nil)
	r.into(t, &el)
	if len(el.Events) != 2 || el.Next != el.Events[1].Index || el.Events[0].Index <= idx {
		t.Fatalf("limit: %+v", el)
	}
}

func TestMachinesPaginationAndFilters(t *testing.T) {
	h := newHarness(t)
	want := map[string]bool{}
	for i := 0; i < 25; i++ {
		st := store.StateAvailable
		if i%5 == 0 {
			st = store.StateFailed
		}
		zone := "a"
		if i%2 == 1 {
			zone = "b"
		}
		m := h.machine(fmt.Sprintf("n%02d", i), fmt.Sprintf("52:54:00:00:01:%02x", i), st, map[string]string{"zone": zone})
		want[m.ID] = true
	}
	var seen []string
	after := ""
	pages := 0
	for {
		r := h.do("GET", "/v1/machines?limit=10&after="+after, viewerTok, nil)
		h.want(r, 200, "")
		var ml MachineList
		r.into(t, &ml)
		pages++
		for _, m := range ml.Items {
			seen = append(seen, m.ID)
		}
		if ml.Next == "" {
			break
		}
		after = ml.Next
		if pages > 10 {
			t.Fatal("pagination does not end")
		}
	}
	if pages != 3 || len(seen) != 25 || !sort.StringsAreSorted(seen) {
		t.Fatalf("pages %d, seen %d %v", pages, len(seen), seen)
	}
	for _, id := range seen {
		if !want[id] {
			t.Fatalf("unexpected %s", id)
		}
		delete(want, id)
	}
	var ml MachineList
	h.do("GET", "/v1/machines?state=failed", viewerTok, nil).into(t, &ml)
	if len(ml.Items) != 5 {
		t.Fatalf("state filter: %d", len(ml.Items))
	}
	h.do("GET", "/v1/machines?state=failed&label=zone%3Da", viewerTok, nil).into(t, &ml)
	for _, m := range ml.Items {
		if m.State != store.StateFailed || m.Labels["zone"] != "a" {
			t.Fatalf("filter leak %+v", m)
		}
	}
	if len(ml.Items) != 3 { // i = 0, 10, 20
		t.Fatalf("state+label: %d", len(ml.Items))
	}
	// Site status counts and failures.
	var st SiteStatus
	r := h.do("GET", "/v1/site/status", viewerTok, nil)
	r.into(t, &st)
	if st.Total != 25 || st.Counts[store.StateFailed] != 5 || st.Counts[store.StateAvailable] != 20 ||
		len(st.Failures) != 5 || len(st.Counts) != len(store.AllStates) || !st.Raft.IsLeader || st.Version != "test" {
		t.Fatalf("status %+v", st)
	}
}

func TestImportAndClaim(t *testing.T) {
	h := newHarness(t)
	r := h.do("POST", "/v1/machines/import?format=csv", adminTok, "name,serial,macs,rack\nn1,S1,52:54:00:00:00:01,r1\nn2,S2,bogus,r1\n")
	h.want(r, 400, CodeImportRejected)
	if d := r.err(); len(d.Rows) != 1 || d.Rows[0].Line != 3 || d.Field != "macs" {
		t.Fatalf("rows %+v", d)
	}
	if n, _ := h.st.CountByState(); n[store.StateRegistered] != 0 {
		t.Fatal("a bad file imported something")
	}
	r = h.do("POST", "/v1/machines/import", adminTok, "name,serial,macs,rack\nn1,S1,52:54:00:00:00:01,r1\n", "Content-Type", "text/csv")
	h.want(r, 201, "")
	var ir ImportResult
	r.into(t, &ir)
	if ir.Created != 1 || len(ir.IDs) != 1 {
		t.Fatalf("import %+v", ir)
	}

	im := h.image([]byte("img"))
	for i := 0; i < 3; i++ {
		h.machine(fmt.Sprintf("w%d", i), fmt.Sprintf("52:54:00:00:02:%02x", i), store.StateAvailable, map[string]string{"pool": "gpu"})
	}
	r = h.do("POST", "/v1/machines/claim", operatorTok, ClaimRequest{Role: "worker", Labels: map[string]string{"pool": "gpu"}, Count: 2,
		Claim: Claim{Image: im.ID}})
	h.want(r, 202, "")
	var cr ClaimResponse
	r.into(t, &cr)
	if len(cr.Items) != 2 || cr.Items[0].Claim.Role != "worker" || cr.Items[0].State != store.StateAvailable {
		t.Fatalf("claim %+v", cr)
	}
	h.want(h.do("POST", "/v1/machines/claim", operatorTok, ClaimRequest{Role: "worker", Labels: map[string]string{"pool": "gpu"}, Count: 2,
		Claim: Claim{Image: im.ID}}), 409, "not_enough_machines")
}

func TestImagesUploadAndBMC(t *testing.T) {
	h := newHarness(t)
	data := bytes.Repeat([]byte("kiln"), 64<<10)
	sum := sha256.Sum256(data)
	q := "name=ubuntu&version=24.04&sha256=" + hex.EncodeToString(sum[:])
	r := h.do("POST", "/v1/images?"+q, adminTok, data)
	h.want(r, 201, "")
	var im store.Image
	r.into(t, &im)
	f, _, err := h.d.Catalog.Open(im.Name)
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := io.ReadAll(f)
	f.Close()
	if !bytes.Equal(stored, data) || im.Format != "raw" || im.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("image %+v (%d bytes stored)", im, len(stored))
	}
	// A body that does not match its declared digest is refused.
	h.want(h.do("PUT", "/v1/images/bad1?"+strings.Replace(q, "ubuntu", "ubuntu2", 1), adminTok, []byte("other bytes")), 400, "digest_mismatch")
	h.want(h.do("GET", "/v1/images/bad1", viewerTok, nil), 404, CodeNotFound)
	var il ImageList
	h.do("GET", "/v1/images", viewerTok, nil).into(t, &il)
	if len(il.Items) != 1 {
		t.Fatalf("images %+v", il)
	}
	h.want(h.do("DELETE", "/v1/images/"+im.ID, adminTok, nil), 204, "")
	h.want(h.do("DELETE", "/v1/images/"+im.ID, adminTok, nil), 404, CodeNotFound)
	// Upload bytes were counted.
	if v := testkit.Sample(t, h.reg, "kiln_api_image_upload_bytes_total"); v < float64(len(data)) {
		t.Fatalf("upload bytes %v", v)
	}

	m := h.machine("n1", "52:54:00:00:00:01", store.StateAvailable, nil)
	const pw = "hunter2-very-secret"
	r = h.do("POST", "/v1/machines/"+m.ID+"/bmc", adminTok, BMCEnrollRequest{Address: "10.99.1.10:623", Driver: "ipmi", Username: "admin", Password: pw})
	h.want(r, 201, "")
	var b BMC
	r.into(t, &b)
	sealed, err := h.st.Secret(b.CredentialRef)
	if err != nil {
		t.Fatal(err)
	}
	if plain, err := h.d.Sealer.Open(sealed); bytes.Contains(r.body, []byte(pw)) || err != nil || string(plain) != pw {
		t.Fatalf("bmc %s: stored credential %q %v", r.body, plain, err)
	}
	r = h.do("GET", "/v1/machines/"+m.ID, viewerTok, nil)
	if bytes.Contains(r.body, []byte(pw)) {
		t.Fatal("password returned")
	}
}

// notLeader answers every write with store.ErrNotLeader, like a follower
// that cannot forward.
type notLeader struct{ Backend }

func (n notLeader) PutSite(context.Context, store.Site, store.W) (store.Site, error) {
	return store.Site{}, fmt.Errorf("put site: %w", &store.NotLeaderError{LeaderID: "kiln-2"})
}

func TestNotLeaderAndReadiness(t *testing.T) {
	h := newHarness(t, func(b Backend) Backend { return notLeader{b} })
	h.health.set(Health{Leader: "10.0.0.2:7480", Ready: false, Version: "test"})
	r := h.do("POST", "/v1/sites", adminTok, SiteSpec{Name: "x"})
	h.want(r, 503, CodeNotLeader)
	if r.err().Leader != "10.0.0.2:7480" {
		t.Fatalf("leader %+v", r.err())
	}
	h.want(h.do("GET", "/readyz", "", nil), 503, "")
	h.want(h.do("GET", "/healthz", "", nil), 200, "")
	h.health.set(Health{Leader: "10.0.0.2:7480", Ready: true})
	h.want(h.do("GET", "/readyz", "", nil), 200, "")
	h.want(h.do("DELETE", "/v1/machines", adminTok, nil), 405, CodeMethodNotAllowed)
	h.want(h.do("GET", "/v1/nothing/here", adminTok, nil), 404, CodeNotFound)
}

func TestMetricsLabelsBounded(t *testing.T) {
	h := newHarness(t)
	for i := 0; i < 5; i++ {
		h.do("GET", fmt.Sprintf("/v1/machines/m-%d", i), viewerTok, nil)
		h.do("GET", fmt.Sprintf("/random/%d", i), viewerTok, nil)
	}
	h.do("GET", "/v1/machines", "", nil)
	r := h.do("GET", "/metrics", "", nil)
	body := string(r.body)
	if !strings.Contains(body, `kiln_api_requests_total{code="404",method="GET",route="/v1/machines/:id"} 5`) {
		t.Fatalf("route template missing:\n%s", grep(body, "kiln_api_requests_total"))
	}
	if strings.Contains(body, "m-3") || strings.Contains(body, "/random/") || strings.Contains(body, "host=") {
		t.Fatalf("unbounded label:\n%s", grep(body, "kiln_api_"))
	}
	if testkit.Sample(t, h.reg, "kiln_api_auth_failures_total", "reason", "missing") != 1 {
		t.Fatalf("auth failures:\n%s", grep(body, "auth_failures"))
	}
	if !strings.Contains(body, `kiln_api_request_seconds_bucket{method="GET",route="/v1/machines/:id"`) {
		t.Fatal("latency histogram missing")
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestOpenAPIMatchesRoutes walks echo's routes and the document both ways.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	h := newHarness(t)
	r := h.do("GET", "/v1/openapi.json", "", nil)
	h.want(r, 200, "")
	var doc struct {
		OpenAPI    string                               `json:"openapi"`
		Paths      map[string]map[string]map[string]any `json:"paths"`
		Components struct {
			Schemas map[string]any `json:"schemas"`
		} `json:"components"`
	}
	r.into(t, &doc)
	if doc.OpenAPI != "3.0.3" {
		t.Fatalf("openapi %q", doc.OpenAPI)
	}
	param := regexp.MustCompile(`:([A-Za-z_]+)`)
	routes := map[string]bool{}
	for _, rt := range h.s.Routes() {
		key := strings.ToLower(rt.Method) + " " + param.ReplaceAllString(rt.Path, "{$1}")
		routes[key] = true
		method, path, _ := strings.Cut(key, " ")
		if doc.Paths[path] == nil || doc.Paths[path][method] == nil {
			t.Errorf("route %s %s is not in the OpenAPI document", rt.Method, rt.Path)
		}
	}
	n := 0
	for path, ops := range doc.Paths {
		for method, op := range ops {
			n++
			if !routes[method+" "+path] {
				t.Errorf("document has %s %s, which is not a route", method, path)
			}
			if _, ok := op["responses"]; !ok {
				t.Errorf("%s %s: no responses", method, path)
			}
		}
	}
	if n != len(routes) || n < 30 {
		t.Fatalf("%d documented operations, %d routes", n, len(routes))
	}
	// Every $ref resolves.
	compact := new(bytes.Buffer)
	_ = json.Compact(compact, r.body)
	refs := regexp.MustCompile(`"\$ref":"#/components/schemas/([A-Za-z]+)"`).FindAllSubmatch(compact.Bytes(), -1)
	if len(refs) == 0 {
		t.Fatal("no $refs")
	}
	for _, m := range refs {
		if doc.Components.Schemas[string(m[1])] == nil {
			t.Errorf("dangling $ref %s", m[1])
		}
	}
}

func TestLoadOrCreateAdminToken(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sub", "admin.token")
	tok, err := LoadOrCreateAdminToken(p)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 || len(tok) != 2*AdminTokenBytes {
		t.Fatalf("token file %v %v len %d", fi.Mode(), err, len(tok))
	}
	tok2, err := LoadOrCreateAdminToken(p)
	if err != nil || tok2 != tok {
		t.Fatalf("second load %q %v", tok2, err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateAdminToken(p); err == nil {
		t.Fatal("world-readable token accepted")
	}
	// The loaded token works against a server holding only its hash.
	s, err := New(Config{Tokens: []TokenSpec{{Name: "admin", Role: RoleAdmin, SHA256: HashToken(tok)}}}, realBackend(t),
		prometheus.NewRegistry(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("POST", "/v1/sites", strings.NewReader(`{"name":"x"}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	if rec.Code != 201 {
		t.Fatalf("admin token: %d %s", rec.Code, rec.Body)
	}
}

func TestConfigValidate(t *testing.T) {
	good := testConfig()
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]Config{
		"agent role":  {Tokens: []TokenSpec{{Name: "a", Role: RoleAgent, SHA256: HashToken("x")}}},
		"bad role":    {Tokens: []TokenSpec{{Name: "a", Role: "root", SHA256: HashToken("x")}}},
		"bad hash":    {Tokens: []TokenSpec{{Name: "a", Role: RoleAdmin, SHA256: "abc"}}},
		"dup":         {Tokens: []TokenSpec{{Name: "a", Role: RoleAdmin, SHA256: HashToken("x")}, {Name: "b", Role: RoleViewer, SHA256: HashToken("x")}}},
		"half tls":    {TLSCert: "/c.pem"},
		"bad addr":    {Addr: "nowhere"},
		"limit order": {DefaultListLimit: 50, MaxListLimit: 10},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := New(testConfig(), realBackend(t), prometheus.NewRegistry(), nil); err == nil {
		t.Fatal("nil logger accepted")
	}
}

var errWrongState = errors.New("lifecycle: machine is in the wrong state for this operation")

// otherErrs returns sentinels of packages the api does not import.
type otherErrs struct{ Backend }

func (o otherErrs) Erase(context.Context, string, store.W) (store.Machine, error) {
	return store.Machine{}, fmt.Errorf("erase m-1: %w", errWrongState)
}

func (o otherErrs) Import(context.Context, io.Reader, string, store.W) (intake.Result, error) {
	return intake.Result{}, fmt.Errorf("parse: %w", intake.ErrEmpty)
}

func TestErrorClasses(t *testing.T) {
	cfg := testConfig()
	cfg.ErrorClasses = []ErrorClass{{Err: errWrongState, Status: 409, Code: "wrong_state"}}
	h := newHarnessConfig(t, cfg, func(b Backend) Backend { return otherErrs{b} })
	h.want(h.do("POST", "/v1/machines/m-1/erase", adminTok, nil), 409, "wrong_state")
	h.want(h.do("POST", "/v1/machines/import?format=csv", adminTok, "x"), 400, CodeInvalid)
	// Without the class the same error is an honest 500, not a guess.
	cfg.ErrorClasses = nil
	h2 := newHarnessConfig(t, cfg, func(b Backend) Backend { return otherErrs{b} })
	h2.want(h2.do("POST", "/v1/machines/m-1/erase", adminTok, nil), 500, CodeInternal)
	bad := testConfig()
	bad.ErrorClasses = []ErrorClass{{Err: errWrongState, Status: 200, Code: "x"}}
	if bad.Validate() == nil {
		t.Fatal("2xx error class accepted")
	}
}

func TestBodyTooLarge(t *testing.T) {
	h := newHarness(t)
	big := `{"name":"` + strings.Repeat("x", DefaultMaxJSONBytes) + `"}`
	h.want(h.do("POST", "/v1/sites", adminTok, big), 413, CodeTooLarge)
}

// FuzzHandlers sends arbitrary bodies (network bytes) to the JSON routes
// through the whole handler stack: never a 500, never a panic, every error
// is a JSON error body with a code, and every success body is JSON.
func FuzzHandlers(f *testing.F) {
	f.Add(uint8(0), []byte(`{"resource_version":1,"name":"x"}`))
	f.Add(uint8(1), []byte(`{"machine_id":"m-00001","step":"write","state":"running","progress":0.5}`))
	f.Add(uint8(2), []byte(`{"claim":{"image":"img-00001"}}`))
	f.Add(uint8(3), []byte(`{"role":"w","count":1,"claim":{"image":"img-00001"}}`))
	f.Add(uint8(4), []byte(`{"address":"h","username":"u","password":"p"}`))
	f.Add(uint8(5), []byte(`{"machine_id":"m-00001","inventory":{"cpus":4}}`))
	f.Add(uint8(6), []byte(`{"name":"s"}`))
	f.Add(uint8(7), []byte("name,serial,mac,rack\nn,S,52:54:00:00:00:01,r\n"))
	d := lifecycletest.New(f)
	m := fixtureMachine(f, d.Store, "", "52:54:00:00:00:01", store.StateRegistered, nil)
	boot, err := d.Controller.BootFor(context.Background(), "52:54:00:00:00:01")
	if err != nil {
		f.Fatal(err)
	}
	tok := boot.Token
	s, err := New(testConfig(), d.Backend(), prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		f.Fatal(err)
	}
	routes := []struct{ method, path, tok string }{
		{"PATCH", "/v1/machines/" + m.ID, adminTok},
		{"POST", "/v1/agent/report", tok},
		{"POST", "/v1/machines/" + m.ID + "/provision", adminTok},
		{"POST", "/v1/machines/claim", adminTok},
		{"POST", "/v1/machines/" + m.ID + "/bmc", adminTok},
		{"POST", "/v1/agent/register", tok},
		{"POST", "/v1/sites", adminTok},
		{"POST", "/v1/machines/import?format=csv", adminTok},
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		rt := routes[int(which)%len(routes)]
		req := httptest.NewRequest(rt.method, rt.path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+rt.tok)
		req.Header.Set(HeaderMachine, m.ID)
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%s %s %q: %d %s", rt.method, rt.path, body, rec.Code, rec.Body)
		}
		if rec.Code >= 400 {
			var eb ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Error.Code == "" {
				t.Fatalf("error body %q", rec.Body)
			}
		} else if rec.Body.Len() > 0 && !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%s %s %q: %d with a body that is not JSON: %q", rt.method, rt.path, body, rec.Code, rec.Body)
		}
	})
}

// TestFreeTextRefused: names and free-text fields with control characters,
// bidirectional controls, newlines or excess length are refused naming the
// field (issue 20: POST /v1/machines took NUL, ESC, U+202E, newlines and a
// 100 KB name, which import refuses), and nothing is created.
func TestFreeTextRefused(t *testing.T) {
	h := newHarness(t)
	m := h.machine("n1", "52:54:00:00:00:01", store.StateAvailable, nil)
	im := h.image([]byte("img"))
	bad := map[string]string{"NUL": "a\x00b", "ESC": "esc\x1b[31mred", "U+202E": "rtl\u202eevil", "newline": "two\nlines",
		"100KB": strings.Repeat("x", 100<<10)}
	mac := 0x10
	for what, v := range bad {
		mac++
		spec := MachineSpec{Name: v, Intended: store.Hardware{NICs: []store.NIC{{MAC: fmt.Sprintf("52:54:00:00:01:%02x", mac)}}}}
		r := h.do("POST", "/v1/machines", adminTok, spec)
		h.want(r, 400, CodeInvalid)
		if r.err().Field != "name" {
			t.Fatalf("%s name: field %q (%s)", what, r.err().Field, r.body)
		}
		if bytes.ContainsAny(r.body, "\x00\x1b\u202e") {
			t.Fatalf("%s: the error echoes the raw character: %q", what, r.body)
		}
	}
	if ms, _, _ := h.st.ListMachines(store.ListOptions{}); len(ms) != 1 {
		t.Fatalf("%d machines, want only the harness's one", len(ms))
	}
	esc := "x\x1by"
	for _, tc := range []struct {
		method, path, tok string
		body              any
		field             string
	}{
		{"POST", "/v1/machines", adminTok, MachineSpec{Name: "ok", Rack: esc, Intended: store.Hardware{Serial: "S9"}}, "rack"},
		{"POST", "/v1/machines", adminTok, MachineSpec{Name: "ok", Intended: store.Hardware{Serial: esc}}, "intended.serial"},
		{"POST", "/v1/machines", adminTok, MachineSpec{Name: "ok", Intended: store.Hardware{Serial: "S9", Vendor: "\u202e"}}, "intended.vendor"},
		{"POST", "/v1/machines", adminTok, MachineSpec{Name: "ok", Labels: map[string]string{"k": "a\nb"}, Intended: store.Hardware{Serial: "S9"}}, "labels.k"},
		{"PATCH", "/v1/machines/" + m.ID, adminTok, map[string]any{"resource_version": m.ResourceVersion, "name": "a\x00"}, "name"},
		{"PATCH", "/v1/machines/" + m.ID, adminTok, map[string]any{"resource_version": m.ResourceVersion, "site": esc}, "site"},
		{"POST", "/v1/sites", adminTok, SiteSpec{Name: esc}, "name"},
		{"POST", "/v1/sites", adminTok, SiteSpec{Name: "s", Description: "\u2066"}, "description"},
		{"POST", "/v1/racks", adminTok, RackSpec{Site: "s", Name: "r", Row: esc}, "row"},
		{"POST", "/v1/machines/" + m.ID + "/provision", operatorTok, ProvisionRequest{Claim: Claim{Image: im.ID, Hostname: "a\x1b"}}, "claim.hostname"},
		{"POST", "/v1/machines/" + m.ID + "/provision", operatorTok, ProvisionRequest{Claim: Claim{Image: im.ID, Role: esc}}, "claim.role"},
		{"POST", "/v1/machines/" + m.ID + "/erase", operatorTok, ActionRequest{Message: esc}, "message"},
		{"POST", "/v1/machines/" + m.ID + "/bmc", adminTok, BMCEnrollRequest{Address: "10.0.0.1\x1b", Username: "u", Password: "p"}, "address"},
		{"POST", "/v1/machines/" + m.ID + "/bmc", adminTok, BMCEnrollRequest{Address: "10.0.0.1", Username: esc, Password: "p"}, "username"},
	} {
		r := h.do(tc.method, tc.path, tc.tok, tc.body)
		h.want(r, 400, CodeInvalid)
		if r.err().Field != tc.field {
			t.Errorf("%s %s: field %q, want %q (%s)", tc.method, tc.path, r.err().Field, tc.field, r.body)
		}
	}
	r := h.do("POST", "/v1/images?name=a&version=1%1B&sha256="+strings.Repeat("a", 64), adminTok, "data")
	h.want(r, 400, CodeInvalid)
	if r.err().Field != "version" {
		t.Fatalf("image version: %s", r.body)
	}
	if got, _ := h.st.GetMachine(m.ID); got.State != store.StateAvailable || got.Name != "n1" {
		t.Fatalf("machine changed: %+v", got)
	}
}

// TestTrailingDataRefused: a body with anything but white space after its
// JSON value is refused as trailing_data (it was accepted: `{"name":"a"} xyz`).
func TestTrailingDataRefused(t *testing.T) {
	h := newHarness(t)
	for _, body := range []string{`{"name":"a"} xyz`, `{"name":"a"}]`, `{"name":"a"}{}`, `{"name":"a"} 1`} {
		h.want(h.do("POST", "/v1/sites", adminTok, body), 400, CodeTrailingData)
	}
	h.want(h.do("POST", "/v1/sites", adminTok, "{\"name\":\"ok-site\"} \r\n\t"), 201, "")
}

// realBackend is the real domain's backend, for tests that need a server
// but not the harness.
func realBackend(t *testing.T) Backend {
	t.Helper()
	return lifecycletest.New(t).Backend()
}

// TestEventsSubject: ?subject= returns that subject's events only, in
// order, across the server's scan pages; Next lets a follower page on
// without missing one; a long-poll with subject is not ended by another
// subject's event, and is by its own.
func TestEventsSubject(t *testing.T) {
	h := newHarness(t)
	var want []uint64
	for i := 0; i < 2600; i++ {
		subj := "machine/b"
		if i%700 == 3 {
			subj = "machine/a"
		}
		idx := h.addEvent(store.Event{Subject: subj, Kind: "step"})
		if subj == "machine/a" {
			want = append(want, idx)
		}
	}
	var got []uint64
	after := uint64(0)
	for n := 0; n < 20; n++ {
		r := h.do("GET", fmt.Sprintf("/v1/events?after=%d&limit=2&subject=machine/a", after), viewerTok, nil)
		h.want(r, 200, "")
		var el EventList
		r.into(t, &el)
		for _, e := range el.Events {
			if e.Subject != "machine/a" {
				t.Fatalf("subject filter returned %+v", e)
			}
			got = append(got, e.Index)
		}
		if el.Next == after {
			break
		}
		after = el.Next
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("machine/a events %v, want %v", got, want)
	}

	done := make(chan EventList, 1)
	go func() {
		r := h.do("GET", fmt.Sprintf("/v1/events?after=%d&wait=20s&subject=machine/a", after), viewerTok, nil)
		var el EventList
		r.into(t, &el)
		done <- el
	}()
	time.Sleep(200 * time.Millisecond)
	h.addEvent(store.Event{Subject: "machine/b", Kind: "step"})
	select {
	case el := <-done:
		t.Fatalf("another subject's event ended the wait: %+v", el)
	case <-time.After(400 * time.Millisecond):
	}
	idx := h.addEvent(store.Event{Subject: "machine/a", Kind: "transition", From: "a", To: "b"})
	select {
	case el := <-done:
		if len(el.Events) != 1 || el.Events[0].Index != idx || el.Next != idx {
			t.Fatalf("long-poll with subject: %+v", el)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("long-poll with subject did not return after its event")
	}
	h.want(h.do("GET", "/v1/events?subject="+strings.Repeat("x", 300), viewerTok, nil), 400, "invalid")
}
