// Package ui is Kiln's web UI, served by `kiln serve` on the REST API's
// listener under /ui/ (api.Server.Mount): the site overview, a rack
// elevation per rack and the hall of every rack, a machine page, live
// updates from the event feed (server-sent events), and the operator
// actions. Pages are rendered on the server (html/template) from the
// REST API's view types; a small script (static/kiln.js) applies the live
// events. Everything it serves is embedded in the binary: it works with the
// site offline.
//
// The UI is a client of the REST API, never a second writer: every read
// and every action is a request to the API's own routes (in process,
// api.Server.LocalHandler) with the signed-in token as its bearer, so it
// takes the same role check, field rules, lifecycle code path and audit
// (the event's actor is the token's name) as `kiln` or any other client.
// DESIGN.md (this folder) has the session, CSRF and live-update rules.
package ui

import (
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"kiln/api"
	"kiln/api/client"
)

// Prefix is where the UI is mounted on the API's listener.
const Prefix = "/ui/"

// DefaultSessionTTL is how long a sign-in lasts when Config.SessionTTL is 0.
const DefaultSessionTTL = 8 * time.Hour

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// API is what the UI needs of the REST API server (*api.Server has it).
type API interface {
	// Authenticate returns the name and role of a static token.
	Authenticate(token string) (name string, role api.Role, ok bool)
	// LocalHandler serves the API's routes in process.
	LocalHandler() http.Handler
}

// Config of the UI.
type Config struct {
	// API is the REST API the UI reads and acts through. Required.
	API API
	// Keys returns the site keyring, primary first (appliance: the keys of
	// bmc.key_file, the same on every node), from which the session cookie
	// key is derived: a cookie sealed by one node opens on every node, and
	// after a site key rotation the old key still opens until it is
	// dropped. Required.
	Keys func() [][]byte
	// SessionTTL is how long a session lasts from sign-in (default
	// DefaultSessionTTL).
	SessionTTL time.Duration
	// Secure marks the cookie Secure (set when the API serves HTTPS).
	Secure bool
	// Now is the clock (tests move it to expire sessions); nil: time.Now.
	Now func() time.Time
}

// UI is the web UI's http.Handler.
type UI struct {
	cfg   Config
	log   *slog.Logger
	pages map[string]*template.Template
	mux   *http.ServeMux
	api   http.Handler
}

// New builds the UI. log gets component=ui.
func New(cfg Config, log *slog.Logger) (*UI, error) {
	if cfg.API == nil || cfg.Keys == nil || log == nil {
		return nil, errors.New("ui: API, Keys and a logger are required")
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.SessionTTL < 0 {
		return nil, errors.New("ui: session_ttl must not be negative")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if _, err := sessionKeys(cfg.Keys()); err != nil {
		return nil, err
	}
	u := &UI{cfg: cfg, log: log.With("component", "ui"), api: cfg.API.LocalHandler()}
	if err := u.parse(); err != nil {
		return nil, err
	}
	u.routes()
	return u, nil
}

func (u *UI) parse() error {
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return err
	}
	u.pages = map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n)
		if err != nil {
			return fmt.Errorf("ui: template %s: %w", n, err)
		}
		u.pages[base] = t
	}
	return nil
}

func (u *UI) routes() {
	m := http.NewServeMux()
	st, _ := fs.Sub(staticFS, "static")
	m.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", cacheFor(http.FileServerFS(st))))
	m.HandleFunc("GET /ui/login", u.loginPage)
	m.HandleFunc("POST /ui/login", u.login)
	m.HandleFunc("POST /ui/logout", u.logout)
	m.HandleFunc("GET /ui/{$}", u.page(u.overview))
	m.HandleFunc("GET /ui/racks", u.page(u.hall))
	m.HandleFunc("GET /ui/racks/{id}", u.page(u.rack))
	m.HandleFunc("GET /ui/machines/{id}", u.page(u.machine))
	m.HandleFunc("GET /ui/machines/{id}/confirm/{action}", u.page(u.confirm))
	m.HandleFunc("POST /ui/machines/{id}/{action}", u.act)
	m.HandleFunc("GET /ui/events", u.events)
	u.mux = m
}

// ServeHTTP serves the UI under Prefix.
func (u *UI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// Everything is served from this origin (no CDN); no framing.
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	u.mux.ServeHTTP(w, r)
}

func cacheFor(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=300")
		h.ServeHTTP(w, r)
	})
}

// client is an API client over the in-process handler with token as bearer.
func (u *UI) client(token string) *client.Client {
	c, err := client.New(client.Config{Server: "http://kiln.local", Token: token,
		HTTPClient: &http.Client{Transport: localTransport{u.api}}})
	if err != nil {
		panic(err) // the URL above is constant and valid
	}
	return c
}
