package ui_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/api"
	"kiln/api/ui"
	"kiln/appliance/lifecycle/lifecycletest"
	"kiln/store"
)

// The tokens of the test site, one per role.
const (
	adminTok    = "admin-secret-token"
	operatorTok = "operator-secret-token"
	viewerTok   = "viewer-secret-token"
)

// site is the real REST API over the real domain (a store, catalog and
// lifecycle controller in the test's directory), with the web UI mounted
// as the appliance mounts it, on a real 127.0.0.1 listener.
type site struct {
	t      testing.TB
	d      *lifecycletest.Domain
	st     *store.Store
	srv    *httptest.Server
	api    *api.Server
	ui     *ui.UI
	keysMu sync.Mutex
	keys   [][]byte
	clock  *clock
	image  store.Image
}

// clock is the UI's clock: real time plus an offset a test moves forward.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return time.Now().Add(c.off) }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.off += d; c.mu.Unlock() }

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newSite(t testing.TB) *site {
	t.Helper()
	d := lifecycletest.New(t)
	cfg := api.Config{Tokens: []api.TokenSpec{
		{Name: "root", Role: api.RoleAdmin, SHA256: api.HashToken(adminTok)},
		{Name: "ops", Role: api.RoleOperator, SHA256: api.HashToken(operatorTok)},
		{Name: "ro", Role: api.RoleViewer, SHA256: api.HashToken(viewerTok)},
	}, ErrorClasses: lifecycletest.ErrorClasses()}
	s, err := api.New(cfg, d.Backend(), prometheus.NewRegistry(), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	si := &site{t: t, d: d, st: d.Store, api: s, keys: [][]byte{key}, clock: &clock{}}
	u, err := ui.New(ui.Config{API: s, Keys: si.keyring, SessionTTL: time.Hour, Now: si.clock.Now}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	si.ui = u
	s.Mount(ui.Prefix, u, true)
	si.srv = httptest.NewServer(s.Handler())
	t.Cleanup(si.srv.Close)
	return si
}

// keyring is the site keyring the UI reads; setKeys replaces it (a rotation).
func (s *site) keyring() [][]byte   { s.keysMu.Lock(); defer s.keysMu.Unlock(); return s.keys }
func (s *site) setKeys(k ...[]byte) { s.keysMu.Lock(); s.keys = k; s.keysMu.Unlock() }

// uploadImage puts a small raw image in the real catalog.
func (s *site) uploadImage(data []byte) store.Image {
	s.t.Helper()
	sum := sha256.Sum256(data)
	im, err := s.d.Service.UploadImage(context.Background(), store.Image{Name: "ubuntu", Version: "24.04",
		SHA256: hex.EncodeToString(sum[:]), Format: "raw"}, bytes.NewReader(data), store.W{})
	if err != nil {
		s.t.Fatal(err)
	}
	s.image = im
	return im
}

// rack records a rack (through the store, as the API's PutRack does).
func (s *site) rack(name, row string, units int) store.Rack {
	s.t.Helper()
	r, err := s.st.PutRack(context.Background(), store.Rack{Site: "hall-1", Name: name, Row: row, Units: units}, store.W{Actor: "test"})
	if err != nil {
		s.t.Fatal(err)
	}
	return r
}

// seedMachine is one machine of the seeded site.
type seedMachine struct {
	Name  string
	Rack  string // rack ID
	U     int
	State store.MachineState
	Diff  bool // a discovered serial differing from the intended one
	Step  *store.StepStatus
}

// statePath is the legal walk from registered to each seeded state.
var statePath = map[store.MachineState][]store.MachineState{
	store.StateRegistered:   nil,
	store.StateInspecting:   {store.StateInspecting},
	store.StateAvailable:    {store.StateInspecting, store.StateAvailable},
	store.StateProvisioning: {store.StateInspecting, store.StateAvailable, store.StateProvisioning},
	store.StateProvisioned:  {store.StateInspecting, store.StateAvailable, store.StateProvisioning, store.StateProvisioned},
	store.StateFailed:       {store.StateInspecting, store.StateFailed},
	store.StateQuarantined:  {store.StateInspecting, store.StateQuarantined},
}

// seed writes the machines straight into the store as fixtures, in
// batches (one raft command per batch and step), walking each along legal
// transitions to its state. It returns the stored records by name.
func (s *site) seed(ms []seedMachine) map[string]store.Machine {
	s.t.Helper()
	ctx := context.Background()
	out := map[string]store.Machine{}
	const batch = 250
	for lo := 0; lo < len(ms); lo += batch {
		part := ms[lo:min(lo+batch, len(ms))]
		recs := make([]store.Machine, len(part))
		for i, sm := range part {
			n := lo + i
			recs[i] = store.Machine{Name: sm.Name, Site: "hall-1", Rack: sm.Rack, RackUnit: sm.U, State: store.StateRegistered,
				Labels: map[string]string{"pool": "general"},
				Intended: store.Hardware{Serial: fmt.Sprintf("SN%05d", n), Vendor: "Supermicro", Model: "SYS-1029P", CPUs: 32,
					MemoryBytes: 256 << 30, NICs: []store.NIC{{MAC: fmt.Sprintf("52:54:%02x:%02x:%02x:01", n>>16&0xff, n>>8&0xff, n&0xff)}}}}
		}
		var err error
		if recs, err = s.st.PutMachines(ctx, recs, store.W{Actor: "test"}); err != nil {
			s.t.Fatal(err)
		}
		for step := 0; step < 4; step++ {
			var move []store.Machine
			var idx []int
			for i, sm := range part {
				path := statePath[sm.State]
				if step >= len(path) {
					continue
				}
				m := recs[i]
				m.State = path[step]
				if step == len(path)-1 {
					if sm.Diff {
						hw := m.Intended
						hw.Serial = "SN-REPLACED"
						hw.MemoryBytes = 128 << 30
						m.Discovered = &hw
						m.Diff = []store.FieldDiff{{Field: "serial", Intended: m.Intended.Serial, Discovered: hw.Serial, Blocking: true},
							{Field: "memory_bytes", Intended: "274877906944", Discovered: "137438953472"}}
					} else if m.State != store.StateInspecting && m.State != store.StateRegistered {
						hw := m.Intended
						m.Discovered = &hw
					}
					m.Step = sm.Step
					switch m.State {
					case store.StateFailed:
						m.Reason, m.Message = "step_timeout", "no report from the inspect step within its deadline"
					case store.StateQuarantined:
						m.Reason, m.Message = "hardware_mismatch", "discovered serial and memory differ from the intended"
					}
				}
				move = append(move, m)
				idx = append(idx, i)
			}
			if len(move) == 0 {
				break
			}
			moved, err := s.st.PutMachines(ctx, move, store.W{Actor: "test"})
			if err != nil {
				s.t.Fatal(err)
			}
			for j, i := range idx {
				recs[i] = moved[j]
			}
		}
		for i, sm := range part {
			out[sm.Name] = recs[i]
		}
	}
	return out
}

// standardSite seeds two racks and a mix of states (the screenshots' site).
func (s *site) standardSite() (map[string]store.Machine, []store.Rack) {
	s.t.Helper()
	s.uploadImage([]byte("a small raw disk image for the ui tests"))
	r1, r2 := s.rack("a01", "A", 42), s.rack("a02", "A", 42)
	states := []store.MachineState{store.StateAvailable, store.StateAvailable, store.StateProvisioned, store.StateProvisioned,
		store.StateProvisioning, store.StateAvailable, store.StateFailed, store.StateInspecting, store.StateQuarantined,
		store.StateRegistered, store.StateAvailable, store.StateProvisioned}
	var ms []seedMachine
	for i := 0; i < 24; i++ {
		rk := r1
		if i >= 14 {
			rk = r2
		}
		sm := seedMachine{Name: fmt.Sprintf("node-%02d", i+1), Rack: rk.ID, U: 2 + (i%14)*2, State: states[i%len(states)]}
		if sm.State == store.StateQuarantined {
			sm.Diff = true
		}
		if sm.State == store.StateProvisioning {
			sm.Step = &store.StepStatus{Step: "write", State: "running", Progress: 0.42, At: time.Now(), Attempt: 1}
		}
		ms = append(ms, sm)
	}
	// One machine names a rack with no unit.
	ms = append(ms, seedMachine{Name: "node-loose", Rack: r2.ID, State: store.StateRegistered})
	return s.seed(ms), []store.Rack{r1, r2}
}

// httpClient is a cookie-keeping client that does not follow redirects.
func (s *site) httpClient() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

type page struct {
	code int
	body string
	hdr  http.Header
}

func (s *site) get(c *http.Client, path string) page {
	s.t.Helper()
	res, err := c.Get(s.srv.URL + path)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return page{res.StatusCode, string(b), res.Header}
}

// post sends a form as a browser of this origin does (Origin header set).
func (s *site) post(c *http.Client, path string, form url.Values, origin string) page {
	s.t.Helper()
	req, _ := http.NewRequest("POST", s.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	res, err := c.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return page{res.StatusCode, string(b), res.Header}
}

// signIn signs c in with token and returns the session's CSRF token (read
// from a page, as a browser would).
func (s *site) signIn(c *http.Client, token string) string {
	s.t.Helper()
	p := s.post(c, "/ui/login", url.Values{"token": {token}, "next": {"/ui/"}}, s.srv.URL)
	if p.code != http.StatusSeeOther {
		s.t.Fatalf("sign-in: %d %s", p.code, p.body)
	}
	return csrfOf(s.t, s.get(c, "/ui/").body)
}

func csrfOf(t testing.TB, body string) string {
	t.Helper()
	const m = `name="csrf" value="`
	i := strings.Index(body, m)
	if i < 0 {
		t.Fatalf("no csrf field in page")
	}
	rest := body[i+len(m):]
	return rest[:strings.IndexByte(rest, '"')]
}

// agentPoll plays the machine's in-RAM agent once, over the real agent
// API: the lifecycle issues its per-boot token as when it netboots
// (BootFor on its MAC), and the agent asks for its task (GET
// /v1/agent/task), which starts the build of a claimed machine. It
// returns the machine's state after.
func (s *site) agentPoll(m store.Machine) store.MachineState {
	s.t.Helper()
	b, err := s.d.Controller.BootFor(context.Background(), m.Intended.NICs[0].MAC)
	if err != nil || b.Token == "" {
		s.t.Fatalf("boot %s: %+v %v", m.ID, b, err)
	}
	req, _ := http.NewRequest("GET", s.srv.URL+"/v1/agent/task", nil)
	req.Header.Set("Authorization", "Bearer "+b.Token)
	req.Header.Set(api.HeaderMachine, m.ID)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		s.t.Fatalf("agent task: %d %s", res.StatusCode, body)
	}
	got, err := s.st.GetMachine(m.ID)
	if err != nil {
		s.t.Fatal(err)
	}
	return got.State
}
