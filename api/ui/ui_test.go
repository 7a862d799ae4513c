package ui_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"kiln/api"
	"kiln/api/client"
	"kiln/api/ui"
	"kiln/store"
)

// TestSignIn: a page without a session goes to sign-in; a wrong token is
// refused; a Kiln token gives an HTTP-only, SameSite=Strict, expiring
// cookie that does not carry the token in the clear, and the pages answer.
func TestSignIn(t *testing.T) {
	s := newSite(t)
	s.standardSite()
	c := s.httpClient()
	p := s.get(c, "/ui/")
	if p.code != http.StatusSeeOther || p.hdr.Get("Location") != "/ui/login?next=%2Fui%2F" {
		t.Fatalf("no session: %d %q", p.code, p.hdr.Get("Location"))
	}
	if p := s.get(c, "/"); p.code != http.StatusFound || p.hdr.Get("Location") != "/ui/" {
		t.Fatalf("GET /: %d %q", p.code, p.hdr.Get("Location"))
	}
	if p := s.post(c, "/ui/login", url.Values{"token": {"not-a-token"}}, s.srv.URL); p.code != http.StatusUnauthorized {
		t.Fatalf("bad token: %d", p.code)
	}
	if p := s.post(c, "/ui/login", url.Values{"token": {operatorTok}}, "http://evil.example"); p.code != http.StatusForbidden {
		t.Fatalf("cross-origin sign-in: %d", p.code)
	}
	p = s.post(c, "/ui/login", url.Values{"token": {operatorTok}, "next": {"/ui/racks"}}, s.srv.URL)
	if p.code != http.StatusSeeOther || p.hdr.Get("Location") != "/ui/racks" {
		t.Fatalf("sign-in: %d %q", p.code, p.hdr.Get("Location"))
	}
	sc := p.hdr.Get("Set-Cookie")
	for _, want := range []string{ui.CookieName + "=v1.", "HttpOnly", "SameSite=Strict", "Expires=", "Path=/ui/"} {
		if !strings.Contains(sc, want) {
			t.Fatalf("cookie %q lacks %q", sc, want)
		}
	}
	if strings.Contains(sc, operatorTok) {
		t.Fatal("the cookie carries the token in the clear")
	}
	// An open redirect is refused.
	if p := s.post(s.httpClient(), "/ui/login", url.Values{"token": {operatorTok}, "next": {"//evil.example/"}}, s.srv.URL); p.hdr.Get("Location") != "/ui/" {
		t.Fatalf("next //evil: %q", p.hdr.Get("Location"))
	}
	for _, path := range []string{"/ui/", "/ui/racks"} {
		p := s.get(c, path)
		if p.code != 200 || !strings.Contains(p.body, ">a01<") {
			t.Fatalf("%s: %d", path, p.code)
		}
		if !strings.Contains(p.hdr.Get("Content-Security-Policy"), "default-src 'self'") {
			t.Fatalf("%s: CSP %q", path, p.hdr.Get("Content-Security-Policy"))
		}
	}
	// Static assets are embedded.
	if p := s.get(c, "/ui/static/kiln.js"); p.code != 200 || !strings.Contains(p.body, "EventSource") {
		t.Fatalf("kiln.js: %d", p.code)
	}
}

// TestProvisionFromForm: an operator's confirmed, CSRF-carrying post
// provisions through the API (state provisioning, audited with the
// token's name); without the CSRF token, or from another origin, or
// unconfirmed, nothing happens.
func TestProvisionFromForm(t *testing.T) {
	s := newSite(t)
	ms, _ := s.standardSite()
	m := ms["node-01"]
	c := s.httpClient()
	csrf := s.signIn(c, operatorTok)
	path := "/ui/machines/" + m.ID + "/provision"
	form := url.Values{"image": {s.image.ID}, "confirm": {"yes"}, "reason": {"rack a01 bring-up"}}
	if p := s.post(c, path, form, s.srv.URL); p.code != http.StatusForbidden {
		t.Fatalf("no csrf: %d", p.code)
	}
	form.Set("csrf", csrf)
	if p := s.post(c, path, form, "http://evil.example"); p.code != http.StatusForbidden {
		t.Fatalf("cross origin: %d", p.code)
	}
	form.Set("confirm", "")
	if p := s.post(c, path, form, s.srv.URL); p.code != http.StatusBadRequest {
		t.Fatalf("unconfirmed: %d", p.code)
	}
	if got, _ := s.st.GetMachine(m.ID); got.State != store.StateAvailable {
		t.Fatalf("refused posts changed the machine: %s", got.State)
	}
	form.Set("confirm", "yes")
	p := s.post(c, path, form, s.srv.URL)
	if p.code != http.StatusSeeOther || p.hdr.Get("Location") != "/ui/machines/"+m.ID+"?done=provision" {
		t.Fatalf("provision: %d %q %s", p.code, p.hdr.Get("Location"), p.body)
	}
	got, _ := s.st.GetMachine(m.ID)
	if got.State != store.StateAvailable || got.Claim == nil || got.Claim.Image != s.image.ID {
		t.Fatalf("after provision: %s %+v", got.State, got.Claim)
	}
	evs, _ := s.st.Events(0, 100000)
	audited := false
	for _, ev := range evs {
		if ev.Subject == "machine/"+m.ID && ev.Actor == "token:ops" && strings.Contains(ev.Message+ev.Reason, "rack a01 bring-up") {
			audited = true
		}
	}
	if !audited {
		t.Fatalf("no event by token:ops with the reason in %+v", evs[len(evs)-3:])
	}
	// The machine's agent takes the claim: provisioning.
	if st := s.agentPoll(m); st != store.StateProvisioning {
		t.Fatalf("after the agent's poll: %s", st)
	}
	// An action the API refuses (provision again) shows the API's error.
	p = s.post(c, path, form, s.srv.URL)
	if p.code != http.StatusConflict || !strings.Contains(p.body, "provisioning") {
		t.Fatalf("second provision: %d %s", p.code, p.body)
	}
}

// TestViewerCannotAct: a viewer's pages have no action buttons, its
// confirm pages and posts (even with its own valid CSRF token) are
// refused, and nothing changes.
func TestViewerCannotAct(t *testing.T) {
	s := newSite(t)
	ms, _ := s.standardSite()
	m := ms["node-01"]
	c := s.httpClient()
	csrf := s.signIn(c, viewerTok)
	p := s.get(c, "/ui/machines/"+m.ID)
	if p.code != 200 || strings.Contains(p.body, "data-action=") || strings.Contains(p.body, "/confirm/") {
		t.Fatalf("viewer's machine page: %d, has actions: %v", p.code, strings.Contains(p.body, "data-action="))
	}
	if p := s.get(c, "/ui/machines/"+m.ID+"/confirm/provision"); p.code != http.StatusForbidden {
		t.Fatalf("viewer confirm page: %d", p.code)
	}
	for _, a := range []string{"provision", "release", "maintenance-on", "power-cycle", "retire"} {
		p := s.post(c, "/ui/machines/"+m.ID+"/"+a, url.Values{"csrf": {csrf}, "confirm": {"yes"}, "image": {s.image.ID}}, s.srv.URL)
		if p.code != http.StatusForbidden {
			t.Fatalf("viewer %s: %d", a, p.code)
		}
	}
	if got, _ := s.st.GetMachine(m.ID); got.State != store.StateAvailable || got.Maintenance != nil {
		t.Fatalf("viewer changed the machine: %s", got.State)
	}
	// An operator sees the buttons but not retire (admin only).
	oc := s.httpClient()
	s.signIn(oc, operatorTok)
	p = s.get(oc, "/ui/machines/"+m.ID)
	if !strings.Contains(p.body, `data-action="provision"`) || strings.Contains(p.body, `data-action="retire"`) {
		t.Fatal("operator's actions wrong")
	}
}

// TestSessionExpiry: past its expiry a session is sent to sign-in (and the
// live stream says so); a cookie sealed by another node of the site (same
// site key) opens; one sealed under another key does not; a session whose
// token is gone from the configuration ends too.
func TestSessionExpiry(t *testing.T) {
	s := newSite(t)
	s.standardSite()
	c := s.httpClient()
	s.signIn(c, operatorTok)
	if p := s.get(c, "/ui/racks"); p.code != 200 {
		t.Fatalf("racks: %d", p.code)
	}
	// Another node: a UI over the same site key accepts the cookie.
	u, _ := url.Parse(s.srv.URL + "/ui/")
	ck := c.Jar.Cookies(u)
	other, err := ui.New(ui.Config{API: s.api, Keys: s.keyring}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "/ui/racks", nil)
	req.AddCookie(ck[0])
	rec := &recorder{h: http.Header{}}
	other.ServeHTTP(rec, req)
	if rec.code != 200 {
		t.Fatalf("other node: %d", rec.code)
	}
	k2 := make([]byte, 32)
	rand.Read(k2)
	stranger, _ := ui.New(ui.Config{API: s.api, Keys: func() [][]byte { return [][]byte{k2} }}, testLogger(t))
	rec = &recorder{h: http.Header{}}
	stranger.ServeHTTP(rec, req)
	if rec.code != http.StatusSeeOther {
		t.Fatalf("another site's key opened the cookie: %d", rec.code)
	}

	s.clock.Add(time.Hour + time.Second)
	p := s.get(c, "/ui/racks")
	if p.code != http.StatusSeeOther || !strings.HasPrefix(p.hdr.Get("Location"), "/ui/login?next=%2Fui%2Fracks&expired=1") {
		t.Fatalf("expired: %d %q", p.code, p.hdr.Get("Location"))
	}
	// The jar dropped the cookie (MaxAge<0); the stream of a stale cookie says expired.
	req, _ = http.NewRequest("GET", s.srv.URL+"/ui/events", nil)
	req.AddCookie(ck[0])
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(res.Body).ReadString('\n')
	res.Body.Close()
	if line != "event: expired\n" {
		t.Fatalf("stream of an expired session: %q", line)
	}
}

type recorder struct {
	h    http.Header
	code int
}

func (r *recorder) Header() http.Header { return r.h }
func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = 200
	}
	return len(b), nil
}
func (r *recorder) WriteHeader(c int) { r.code = c }

// TestLiveStream: the SSE stream carries a transition written after the
// page's cursor, as the API's event feed has it.
func TestLiveStream(t *testing.T) {
	s := newSite(t)
	ms, _ := s.standardSite()
	c := s.httpClient()
	s.signIn(c, viewerTok)
	m := ms["node-02"]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.srv.URL+"/ui/events?after="+itoa(s.st.LastEventIndex()), nil)
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	// The claim and the agent's poll that starts the build, after the stream is open.
	if _, err := s.d.Service.Provision(context.Background(), m.ID, store.Claim{Image: s.image.ID}, store.W{Actor: "token:root"}); err != nil {
		t.Fatal(err)
	}
	if st := s.agentPoll(m); st != store.StateProvisioning {
		t.Fatalf("agent poll: %s", st)
	}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		var ev api.Event
		if err := json.Unmarshal([]byte(line[6:]), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Subject == "machine/"+m.ID && ev.Kind == "transition" && ev.To == string(store.StateProvisioning) {
			return
		}
	}
	t.Fatalf("no transition on the stream: %v", sc.Err())
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// TestSessionAcrossKeyRotation: a cookie sealed under the site key still
// opens while a rotation has a new primary and the old key in the ring,
// and no longer once the old key is dropped.
func TestSessionAcrossKeyRotation(t *testing.T) {
	s := newSite(t)
	c := s.httpClient()
	s.signIn(c, viewerTok)
	old := s.keyring()[0]
	k2 := make([]byte, 32)
	rand.Read(k2)
	s.setKeys(k2, old) // the new key is primary, the old one still opens
	if p := s.get(c, "/ui/racks"); p.code != 200 {
		t.Fatalf("during rotation: %d", p.code)
	}
	s.setKeys(k2) // the old key dropped
	if p := s.get(c, "/ui/racks"); p.code != http.StatusSeeOther {
		t.Fatalf("after the old key is dropped: %d", p.code)
	}
}

// TestOverviewCampaigns: the overview shows no campaign section on a site
// without campaigns, and a created campaign, its action, state and waves,
// once one exists (issue 18, "campaigns when they exist").
func TestOverviewCampaigns(t *testing.T) {
	s := newSite(t)
	ms, racks := s.standardSite()
	// Fixture: the provisioned machines of rack a01 carry a claim (an
	// os_image campaign moves claimed machines only).
	var claimed []store.Machine
	for _, m := range ms {
		if m.State == store.StateProvisioned && m.Rack == racks[0].ID {
			m.Claim = &store.Claim{Image: s.image.ID, Role: "worker", Hostname: m.Name}
			claimed = append(claimed, m)
		}
	}
	if _, err := s.st.PutMachines(context.Background(), claimed, store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	c := s.httpClient()
	s.signIn(c, viewerTok)
	if p := s.get(c, "/ui/"); p.code != 200 || strings.Contains(p.body, `id="campaigns"`) || strings.Contains(p.body, "<h2>Campaigns</h2>") {
		t.Fatalf("no campaigns: %d, campaign section shown", p.code)
	}
	cl, err := client.New(client.Config{Server: s.srv.URL, Token: adminTok})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := cl.CreateCampaign(context.Background(), api.CampaignRequest{Name: "os-a01", Action: "os_image",
		Image: s.image.ID, Selector: api.CampaignSelector{Racks: []string{racks[0].ID}}, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	p := s.get(c, "/ui/")
	if p.code != 200 || !strings.Contains(p.body, `id="campaigns"`) || !strings.Contains(p.body, `data-campaign="`+cp.ID+`"`) {
		t.Fatalf("campaign %s not on the overview (%d)", cp.ID, p.code)
	}
	for _, want := range []string{"os-a01", ">" + cp.State + "<", fmt.Sprintf("%d of %d", cp.Wave, cp.Waves)} {
		if !strings.Contains(p.body, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
}
