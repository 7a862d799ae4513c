package client_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kiln/api"
	"kiln/api/client"
	"kiln/store"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wantErr requires err to be a *client.Error with status and code, and
// returns it.
func wantErr(t *testing.T, err error, status int, code string) *client.Error {
	t.Helper()
	e := client.AsError(err)
	if e == nil {
		t.Fatalf("want %d %s, got %v (%T)", status, code, err, err)
	}
	if e.Status != status || e.Code() != code {
		t.Fatalf("want %d %s, got %d %s: %v", status, code, e.Status, e.Code(), e)
	}
	return e
}

func TestNewRefusesBadServers(t *testing.T) {
	for _, s := range []string{"", "127.0.0.1:7480", "ftp://h", "http://", "http://h:1/?x=1", "http://h:1/#f", "://"} {
		if _, err := client.New(client.Config{Server: s}); !errors.Is(err, client.ErrBadServer) {
			t.Errorf("New(%q) = %v, want ErrBadServer", s, err)
		}
	}
	c, err := client.New(client.Config{Server: "https://kiln.example:7480/prefix/"})
	if err != nil || c.Server() != "https://kiln.example:7480/prefix" || c.HasToken() {
		t.Fatalf("New: %v %q", err, c.Server())
	}
}

// Machines: create, get, pages, filters, patch with resource versions, and
// the errors each route gives, with their codes and hints.
func TestMachines(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	admin, viewer := e.client(adminTok), e.client(viewerTok)

	var ids []string
	for i := range 5 {
		m, err := admin.CreateMachine(ctx, api.MachineSpec{Name: fmt.Sprintf("n%d", i), Rack: "r1",
			Labels:   map[string]string{"zone": map[bool]string{true: "a", false: "b"}[i%2 == 0]},
			Intended: store.Hardware{NICs: []store.NIC{{MAC: fmt.Sprintf("52:54:00:AA:00:%02X", i)}}}})
		if err != nil {
			t.Fatal(err)
		}
		if m.State != store.StateRegistered || m.Intended.NICs[0].MAC != fmt.Sprintf("52:54:00:aa:00:%02x", i) {
			t.Fatalf("created %+v", m)
		}
		ids = append(ids, m.ID)
	}
	_, err := admin.CreateMachine(ctx, api.MachineSpec{Intended: store.Hardware{NICs: []store.NIC{{MAC: "52:54:00:aa:00:00"}}}})
	if !client.IsConflict(err) {
		t.Fatalf("duplicate MAC: %v", err)
	}
	err = func() error {
		_, err := admin.CreateMachine(ctx, api.MachineSpec{Intended: store.Hardware{NICs: []store.NIC{{MAC: "nomac"}}}})
		return err
	}()
	if ce := wantErr(t, err, 400, api.CodeInvalid); ce.Detail.Field != "intended.nics[0].mac" || ce.Hint() != "fix intended.nics[0].mac" {
		t.Fatalf("bad MAC: field %q hint %q", ce.Detail.Field, ce.Hint())
	}

	page, err := viewer.ListMachines(ctx, client.MachineQuery{Limit: 2})
	if err != nil || len(page.Items) != 2 || page.Next == "" {
		t.Fatalf("page 1: %v %+v", err, page)
	}
	all, err := viewer.ListAllMachines(ctx, client.MachineQuery{Limit: 2})
	if err != nil || len(all) != 5 {
		t.Fatalf("all pages: %v, %d machines", err, len(all))
	}
	sort.Strings(ids)
	for i, m := range all {
		if m.ID != ids[i] {
			t.Fatalf("order: %d is %s, want %s", i, m.ID, ids[i])
		}
	}
	rest, err := viewer.ListAllMachines(ctx, client.MachineQuery{Limit: 2, After: page.Next})
	if err != nil || len(rest) != 3 {
		t.Fatalf("after the first page: %v, %d", err, len(rest))
	}
	zoneA, err := viewer.ListAllMachines(ctx, client.MachineQuery{Labels: map[string]string{"zone": "a"}, State: "registered", Consistent: true})
	if err != nil || len(zoneA) != 3 {
		t.Fatalf("label filter: %v, %d", err, len(zoneA))
	}
	_, err = viewer.ListMachines(ctx, client.MachineQuery{State: "melted"})
	wantErr(t, err, 400, api.CodeInvalid)

	m, err := viewer.GetMachine(ctx, all[0].ID)
	if err != nil || m.Name != all[0].Name || m.ResourceVersion == 0 {
		t.Fatalf("get: %v %+v", err, m)
	}
	_, err = viewer.GetMachine(ctx, "no-such")
	if !client.IsNotFound(err) {
		t.Fatalf("get missing: %v", err)
	}
	name := "renamed"
	upd, err := admin.PatchMachine(ctx, m.ID, api.MachinePatch{ResourceVersion: m.ResourceVersion, Name: &name})
	if err != nil || upd.Name != name || upd.ResourceVersion <= m.ResourceVersion {
		t.Fatalf("patch: %v %+v", err, upd)
	}
	_, err = admin.PatchMachine(ctx, m.ID, api.MachinePatch{ResourceVersion: m.ResourceVersion, Name: &name})
	ce := wantErr(t, err, 409, api.CodeConflict)
	if !strings.Contains(ce.Error(), "read it again and retry") || ce.Method != "PATCH" || ce.Path != "/v1/machines/"+m.ID {
		t.Fatalf("stale patch: %v (%s %s)", ce, ce.Method, ce.Path)
	}

	// Roles and tokens.
	_, err = viewer.PatchMachine(ctx, m.ID, api.MachinePatch{ResourceVersion: upd.ResourceVersion, Name: &name})
	if ce := wantErr(t, err, 403, api.CodeForbidden); !strings.Contains(ce.Hint(), "operator or admin token") {
		t.Fatalf("403 hint %q", ce.Hint())
	}
	_, err = e.client("").ListMachines(ctx, client.MachineQuery{})
	if ce := wantErr(t, err, 401, api.CodeUnauthorized); !strings.Contains(ce.Hint(), "bearer token") {
		t.Fatalf("401 hint %q", ce.Hint())
	}
	_, err = e.client("wrong").GetMachine(ctx, m.ID)
	wantErr(t, err, 401, api.CodeUnauthorized)
}

// Import is all or nothing: a bad row names its line and field, and
// nothing is created.
func TestImport(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	admin := e.client(adminTok)
	_, err := admin.ImportMachines(ctx, "csv", strings.NewReader("name,serial,macs,rack\nn1,S1,52:54:00:00:20:01,r1\nn2,S2,nomac,r1\n"))
	ce := wantErr(t, err, 400, api.CodeImportRejected)
	if len(ce.Detail.Rows) != 1 || ce.Detail.Rows[0].Line != 3 || ce.Detail.Rows[0].Field != "macs" ||
		!strings.Contains(ce.Error(), "\n  line 3, field macs: ") || !strings.HasSuffix(ce.Error(), "nothing was imported") {
		t.Fatalf("rows %+v; error %q", ce.Detail.Rows, ce.Error())
	}
	if all, _ := admin.ListAllMachines(ctx, client.MachineQuery{}); len(all) != 0 {
		t.Fatalf("a rejected import created %d machines", len(all))
	}
	// A reader of unknown length goes chunked.
	res, err := admin.ImportMachines(ctx, "csv", io.MultiReader(strings.NewReader("name,serial,macs,rack\n"),
		strings.NewReader("n1,S1,52:54:00:00:20:01,r1\nn2,S2,52:54:00:00:20:02,r1\n")))
	if err != nil || res.Created != 2 || len(res.IDs) != 2 {
		t.Fatalf("import: %v %+v", err, res)
	}
	_, err = admin.ImportMachines(ctx, "xml", strings.NewReader("x"))
	if ce := wantErr(t, err, 400, api.CodeInvalid); ce.Detail.Field != "format" {
		t.Fatalf("format field %q", ce.Detail.Field)
	}
}

// Images: POST and PUT uploads hashed by the server, the idempotent PUT,
// digest mismatches, list, get and delete.
func TestImages(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	admin := e.client(adminTok)
	data := bytes.Repeat([]byte("kiln image bytes"), 4096)
	sum := sha256.Sum256(data)
	meta := client.ImageMeta{Name: "ubuntu", Version: "24.04", SHA256: hex.EncodeToString(sum[:]), Source: "t.img"}

	im, err := admin.UploadImage(ctx, meta, bytes.NewReader(data), int64(len(data)))
	if err != nil || im.ID == "" || im.SHA256 != meta.SHA256 || im.Format != "raw" || im.Source != "t.img" {
		t.Fatalf("upload: %v %+v", err, im)
	}
	bad := meta
	bad.Name, bad.SHA256 = "bad", strings.Repeat("0", 64)
	_, err = admin.UploadImage(ctx, bad, bytes.NewReader(data), -1)
	wantErr(t, err, 400, "digest_mismatch")

	put, created, err := admin.PutImage(ctx, "img-fixed", client.ImageMeta{Name: "fixed", Version: "1", SHA256: meta.SHA256},
		bytes.NewReader(data), int64(len(data)))
	if err != nil || !created || put.ID != "img-fixed" {
		t.Fatalf("put: %v created=%v %+v", err, created, put)
	}
	// The same image again: 200, and the body is never read.
	var read atomic.Int64
	again, created, err := admin.PutImage(ctx, "img-fixed", client.ImageMeta{Name: "fixed", Version: "1", SHA256: meta.SHA256},
		countReader{r: bytes.NewReader(data), n: &read}, int64(len(data)))
	if err != nil || created || again.ID != "img-fixed" {
		t.Fatalf("put again: %v created=%v %+v", err, created, again)
	}
	_, _, err = admin.PutImage(ctx, "img-fixed", client.ImageMeta{Name: "other", Version: "2", SHA256: meta.SHA256},
		bytes.NewReader(data), int64(len(data)))
	if !client.IsConflict(err) {
		t.Fatalf("other image under the same ID: %v", err)
	}

	list, err := e.client(viewerTok).ListImages(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %v %d", err, len(list))
	}
	if got, err := admin.GetImage(ctx, im.ID); err != nil || got.Name != "ubuntu" {
		t.Fatalf("get: %v %+v", err, got)
	}
	if err := admin.DeleteImage(ctx, im.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.GetImage(ctx, im.ID); !client.IsNotFound(err) {
		t.Fatalf("after delete: %v", err)
	}
	if err := e.client(operatorTok).DeleteImage(ctx, "img-fixed"); client.AsError(err) == nil || client.AsError(err).Status != 403 {
		t.Fatalf("operator delete: %v", err)
	}
}

// A refused upload is answered before its body is sent: the client sends
// Expect: 100-continue and the API checks credentials before the body.
func TestUploadRefusedBeforeTheBody(t *testing.T) {
	e := newEnv(t)
	var read atomic.Int64
	body := countReader{r: bytes.NewReader(make([]byte, 8<<20)), n: &read}
	_, err := e.client(viewerTok).UploadImage(ctxT(t), client.ImageMeta{Name: "x", Version: "1", SHA256: strings.Repeat("a", 64)}, body, 8<<20)
	wantErr(t, err, 403, api.CodeForbidden)
	if n := read.Load(); n != 0 {
		t.Fatalf("%d body bytes read for a refused upload", n)
	}
}

type countReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// Lifecycle actions through the client: provision, claim (all or nothing),
// release, erase, inspect, BMC enrolment, and the 409s that name the state.
func TestActions(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	admin, op := e.client(adminTok), e.client(operatorTok)
	data := []byte("a small image")
	sum := sha256.Sum256(data)
	im, err := admin.UploadImage(ctx, client.ImageMeta{Name: "img", Version: "1", SHA256: hex.EncodeToString(sum[:])}, bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}

	reg := e.machineIn("reg", "52:54:00:00:30:01", nil, store.StateRegistered)
	a1 := e.machineIn("a1", "52:54:00:00:30:02", map[string]string{"pool": "gpu"}, store.StateAvailable)
	a2 := e.machineIn("a2", "52:54:00:00:30:03", map[string]string{"pool": "gpu"}, store.StateAvailable)
	a3 := e.machineIn("a3", "52:54:00:00:30:04", map[string]string{"pool": "cpu"}, store.StateAvailable)
	prov := e.machineIn("p", "52:54:00:00:30:05", nil, store.StateProvisioned)

	m, err := op.Provision(ctx, a1.ID, api.ProvisionRequest{Claim: api.Claim{Image: im.ID, Role: "worker", Hostname: "w1"}, Reason: "test"})
	// The claim is placed; the machine stays available until its agent starts the build.
	if err != nil || m.State != store.StateAvailable || m.Claim == nil || m.Claim.Hostname != "w1" {
		t.Fatalf("provision: %v %+v", err, m)
	}
	_, err = op.Provision(ctx, reg.ID, api.ProvisionRequest{Claim: api.Claim{Image: im.ID}})
	if ce := client.AsError(err); ce == nil || ce.Status != 409 {
		t.Fatalf("provision registered: %v", err)
	}
	_, err = op.Claim(ctx, api.ClaimRequest{Role: "worker", Labels: map[string]string{"pool": "gpu"}, Count: 2, Claim: api.Claim{Image: im.ID}})
	wantErr(t, err, 409, "not_enough_machines")
	if got, _ := e.st.GetMachine(a2.ID); got.State != store.StateAvailable {
		t.Fatalf("a refused claim moved %s to %s", a2.ID, got.State)
	}
	claimed, err := op.Claim(ctx, api.ClaimRequest{Role: "worker", Labels: map[string]string{"pool": "gpu"}, Count: 1, Claim: api.Claim{Image: im.ID}})
	if err != nil || len(claimed) != 1 || claimed[0].ID != a2.ID || claimed[0].Claim.Role != "worker" {
		t.Fatalf("claim: %v %+v", err, claimed)
	}

	err = admin.DeleteImage(ctx, im.ID)
	if ce := wantErr(t, err, 409, api.CodeImageInUse); !strings.Contains(ce.Hint(), "release") {
		t.Fatalf("image in use: hint %q", ce.Hint())
	}

	rel, err := op.Release(ctx, prov.ID, api.ActionRequest{Reason: "decommission"})
	if err != nil || rel.State != store.StateErasing {
		t.Fatalf("release: %v %+v", err, rel)
	}
	_, err = op.Release(ctx, reg.ID, api.ActionRequest{})
	ce := wantErr(t, err, 409, "wrong_state")
	if !strings.Contains(ce.Message(), "registered") || !strings.Contains(ce.Hint(), "state and reason") {
		t.Fatalf("wrong state: message %q hint %q", ce.Message(), ce.Hint())
	}
	if m, err := op.Inspect(ctx, a3.ID, api.ActionRequest{Message: "re-check"}); err != nil || m.State != store.StateInspecting {
		t.Fatalf("inspect: %v %+v", err, m)
	}
	if m, err := op.Erase(ctx, reg.ID, api.ActionRequest{}); err == nil {
		t.Fatalf("erase of a registered machine: %+v", m)
	}

	b, err := admin.EnrollBMC(ctx, reg.ID, api.BMCEnrollRequest{Address: "10.99.1.10", Driver: "ipmi", Username: "admin", Password: "s3cret"})
	if err != nil || b.ID == "" || b.Address != "10.99.1.10" || b.CredentialRef == "" {
		t.Fatalf("enroll: %v %+v", err, b)
	}
	if got, _ := e.st.GetMachine(reg.ID); got.BMC != b.ID {
		t.Fatalf("machine's BMC %q, want %q", got.BMC, b.ID)
	}
	_, err = admin.EnrollBMC(ctx, reg.ID, api.BMCEnrollRequest{Address: "10.99.1.10", Username: "admin"})
	if ce := wantErr(t, err, 400, api.CodeInvalid); ce.Detail.Field != "password" {
		t.Fatalf("no password: field %q", ce.Detail.Field)
	}

	// The events record who did what, with the reason given.
	el, err := admin.Events(ctx, client.EventQuery{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ev := range el.Events {
		found = found || (ev.Subject == "machine/"+prov.ID && ev.Reason == "decommission" && ev.Actor == "token:operator")
	}
	if !found {
		t.Fatalf("no release event by token:operator with the reason among %d events", len(el.Events))
	}
	jobs, err := admin.ListJobs(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		if got, err := admin.GetJob(ctx, j.ID); err != nil || got.ID != j.ID {
			t.Fatalf("job %s: %v", j.ID, err)
		}
	}
	if _, err := admin.GetJob(ctx, "no-such"); !client.IsNotFound(err) {
		t.Fatalf("missing job: %v", err)
	}
}

// Events page by cursor, and a long-poll returns as soon as an event is
// applied; the caller's context ends a long-poll.
func TestEventsLongPoll(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	admin := e.client(adminTok)
	for i := range 3 {
		e.machineIn(fmt.Sprintf("e%d", i), fmt.Sprintf("52:54:00:00:40:%02x", i), nil, store.StateRegistered)
	}
	first, err := admin.Events(ctx, client.EventQuery{Limit: 2})
	if err != nil || len(first.Events) != 2 || first.Next != first.Events[1].Index {
		t.Fatalf("page 1: %v %+v", err, first)
	}
	rest, err := admin.Events(ctx, client.EventQuery{After: first.Next, Limit: 100})
	if err != nil || len(rest.Events) == 0 || rest.Events[0].Index <= first.Next {
		t.Fatalf("page 2: %v %+v", err, rest)
	}
	empty, err := admin.Events(ctx, client.EventQuery{After: rest.Next})
	if err != nil || len(empty.Events) != 0 || empty.Next != rest.Next {
		t.Fatalf("no new events: %v %+v", err, empty)
	}

	type answer struct {
		el  api.EventList
		err error
		d   time.Duration
	}
	done := make(chan answer, 1)
	go func() {
		t0 := time.Now()
		el, err := admin.Events(ctx, client.EventQuery{After: rest.Next, Wait: 20 * time.Second})
		done <- answer{el, err, time.Since(t0)}
	}()
	time.Sleep(300 * time.Millisecond)
	e.machineIn("late", "52:54:00:00:40:ff", nil, store.StateRegistered)
	select {
	case a := <-done:
		if a.err != nil || len(a.el.Events) == 0 || a.el.Events[0].Index <= rest.Next || a.d > 10*time.Second {
			t.Fatalf("long-poll: %v after %s: %+v", a.err, a.d, a.el)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the long-poll did not return after the write")
	}

	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err = admin.Events(cctx, client.EventQuery{After: 1 << 62, Wait: 30 * time.Second})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) > 5*time.Second {
		t.Fatalf("context end: %v after %s", err, time.Since(t0))
	}
}

// Sites, racks, site status, health and readiness.
func TestSiteRacksStatus(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	admin, viewer := e.client(adminTok), e.client(viewerTok)
	s, err := admin.CreateSite(ctx, api.SiteSpec{ID: "fra1", Name: "Frankfurt"})
	if err != nil || s.ID != "fra1" {
		t.Fatalf("site: %v %+v", err, s)
	}
	s2, err := admin.UpdateSite(ctx, "fra1", api.SiteSpec{ResourceVersion: s.ResourceVersion, Name: "Frankfurt 1"})
	if err != nil || s2.Name != "Frankfurt 1" {
		t.Fatalf("update site: %v %+v", err, s2)
	}
	if _, err := admin.UpdateSite(ctx, "fra1", api.SiteSpec{ResourceVersion: s.ResourceVersion, Name: "late"}); !client.IsConflict(err) {
		t.Fatalf("stale site update: %v", err)
	}
	if got, err := viewer.GetSite(ctx, "fra1"); err != nil || got.Name != "Frankfurt 1" {
		t.Fatalf("get site: %v %+v", err, got)
	}
	if sites, err := viewer.ListSites(ctx); err != nil || len(sites) != 1 {
		t.Fatalf("sites: %v %d", err, len(sites))
	}
	r, err := admin.CreateRack(ctx, api.RackSpec{Site: "fra1", Name: "r1", Units: 42})
	if err != nil || r.ID == "" {
		t.Fatalf("rack: %v", err)
	}
	if _, err := admin.CreateRack(ctx, api.RackSpec{Site: "ams1", Name: "r9"}); err != nil {
		t.Fatal(err)
	}
	r2, err := admin.UpdateRack(ctx, r.ID, api.RackSpec{ResourceVersion: r.ResourceVersion, Site: "fra1", Name: "r1", Row: "A", Units: 42})
	if err != nil || r2.Row != "A" {
		t.Fatalf("update rack: %v %+v", err, r2)
	}
	if racks, err := viewer.ListRacks(ctx, "fra1"); err != nil || len(racks) != 1 || racks[0].ID != r.ID {
		t.Fatalf("racks of fra1: %v %+v", err, racks)
	}
	if racks, err := viewer.ListRacks(ctx, ""); err != nil || len(racks) != 2 {
		t.Fatalf("racks: %v %d", err, len(racks))
	}
	if got, err := viewer.GetRack(ctx, r.ID); err != nil || got.Units != 42 {
		t.Fatalf("get rack: %v %+v", err, got)
	}
	if _, err := viewer.GetRack(ctx, "none"); !client.IsNotFound(err) {
		t.Fatalf("missing rack: %v", err)
	}

	e.machineIn("s1", "52:54:00:00:50:01", nil, store.StateAvailable)
	st, err := viewer.SiteStatus(ctx)
	if err != nil || st.Total != 1 || st.Counts[store.StateAvailable] != 1 || !st.Raft.IsLeader || st.Version != "test" {
		t.Fatalf("status: %v %+v", err, st)
	}
	anon := e.client("")
	if h, err := anon.Healthz(ctx); err != nil || h.Status != "ok" {
		t.Fatalf("healthz: %v %+v", err, h)
	}
	if r, err := anon.Ready(ctx); err != nil || r.Status != "ok" {
		t.Fatalf("readyz: %v %+v", err, r)
	}
}

// Answers that are not the API's: a proxy's error page, a 503 not-ready
// node, a body that does not decode, and no server at all.
func TestForeignAnswers(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/machines/m1", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upstream down", http.StatusBadGateway)
	})
	mux.HandleFunc("/v1/machines/m2", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id": 7`))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"status":"not_ready","leader":"10.0.0.2:7481"}`))
	})
	hs := httptest.NewServer(mux)
	defer hs.Close()
	c, err := client.New(client.Config{Server: hs.URL, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	_, err = c.GetMachine(ctx, "m1")
	if ce := wantErr(t, err, 502, "bad_gateway"); ce.Message() != "upstream down" {
		t.Fatalf("message %q", ce.Message())
	}
	if _, err = c.GetMachine(ctx, "m2"); err == nil || client.AsError(err) != nil || !strings.Contains(err.Error(), "does not decode") {
		t.Fatalf("bad body: %v", err)
	}
	st, err := c.Ready(ctx)
	if ce := wantErr(t, err, 503, "not_ready"); ce.Detail.Leader != "10.0.0.2:7481" || st.Status != "not_ready" {
		t.Fatalf("not ready: %+v %+v", ce.Detail, st)
	}

	hs.Close()
	_, err = c.GetMachine(ctx, "m1")
	if err == nil || client.AsError(err) != nil || !strings.Contains(err.Error(), hs.URL) {
		t.Fatalf("no server: %v", err)
	}
}

// The client sends each call once: a write whose connection is cut before
// any answer is one request on the server and an error to the caller.
func TestNoHiddenRetries(t *testing.T) {
	var n atomic.Int64
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close() // no answer at all
		}
	}))
	defer hs.Close()
	c, err := client.New(client.Config{Server: hs.URL, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateMachine(ctxT(t), api.MachineSpec{Name: "x"})
	if err == nil || client.AsError(err) != nil {
		t.Fatalf("cut connection: %v", err)
	}
	if got := n.Load(); got != 1 {
		t.Fatalf("the server saw %d requests for one call", got)
	}
}

// A cursor older than the retained log is 410 cursor_expired with the
// oldest cursor served; that cursor reads the rest of the feed.
func TestEventsCursorExpired(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	admin := e.client(adminTok)
	for i := range 3 {
		e.machineIn(fmt.Sprintf("x%d", i), fmt.Sprintf("52:54:00:00:41:%02x", i), nil, store.StateRegistered)
	}
	before, err := e.st.EventTrimPoint(time.Now(), 0, 2)
	if err != nil || before == 0 {
		t.Fatalf("trim point %d, %v", before, err)
	}
	if err := e.st.TrimEvents(ctx, before, store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	_, err = admin.Events(ctx, client.EventQuery{After: 0})
	ce := wantErr(t, err, 410, api.CodeCursorExpired)
	oldest, ok := client.CursorExpired(err)
	if !ok || oldest != before-1 || ce.Detail.OldestCursor == nil || !strings.Contains(ce.Error(), "resync") {
		t.Fatalf("cursor_expired: oldest %d ok %v, want %d; %v", oldest, ok, before-1, ce)
	}
	rest, err := admin.Events(ctx, client.EventQuery{After: oldest})
	if err != nil || len(rest.Events) < 2 || rest.Events[0].Index != before {
		t.Fatalf("events after the oldest cursor: %v %+v", err, rest)
	}
}
