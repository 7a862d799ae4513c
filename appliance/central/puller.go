package central

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"kiln/api"
	"kiln/api/client"
	"kiln/store"
)

// Site is one Kiln site the central follows.
type Site struct {
	Name   string `json:"name"`   // unique, [A-Za-z0-9._-]
	Server string `json:"server"` // the site's API base URL, http(s)://HOST:PORT
	// Token, or TokenFile read before every request until it exists (a
	// viewer token suffices).
	Token     string `json:"token,omitempty"`
	TokenFile string `json:"token_file,omitempty"`
}

// Config of a Puller. Zero durations take the defaults named.
type Config struct {
	Sites     []Site `json:"sites"`
	StatePath string `json:"state"` // the bbolt file of the copy (store.go)
	// Wait is the long poll of GET /v1/events (default 20 s); each request
	// is bounded by Wait + 10 s, so a WAN that drops packets silently is
	// noticed within that.
	Wait time.Duration `json:"wait,omitempty"`
	// Limit is events per answer (default 500; the site caps it).
	Limit int `json:"limit,omitempty"`
	// StatusEvery is how often GET /v1/site/status is pulled (default 10 s).
	StatusEvery time.Duration `json:"status_every,omitempty"`
	// MaxBackoff caps the retry delay after errors (default 10 s; the
	// delay starts at 250 ms, doubles, and is jittered ±25 %).
	MaxBackoff time.Duration `json:"max_backoff,omitempty"`
	Log        *slog.Logger  `json:"-"`
}

// SiteLag is one site's follow state (Puller.Lag, GET /v1/central/sites).
type SiteLag struct {
	Site   string `json:"site"`
	Cursor uint64 `json:"cursor"` // last event index held
	Events int    `json:"events"` // events held
	// CaughtUp is when the feed last answered with less than a full page
	// (the central then held everything the site had); LagSeconds is now
	// minus CaughtUp (0 when never).
	CaughtUp   time.Time `json:"caught_up,omitempty"`
	LagSeconds float64   `json:"lag_seconds"`
	// SiteApplied is the site's raft applied_index at the last status
	// pull; IndexLag = SiteApplied - Cursor when positive (an upper bound
	// on the events missing: not every raft entry is an event).
	SiteApplied uint64    `json:"site_applied_index"`
	IndexLag    uint64    `json:"index_lag"`
	Reachable   bool      `json:"reachable"`
	Errors      int       `json:"errors"`
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitempty"`
	Resyncs     int       `json:"resyncs"`
	Machines    int       `json:"machines"` // Total of the last status
	Provisioned int       `json:"provisioned"`
}

// Puller follows every site's /v1/events (durable cursors in StatePath)
// and pulls /v1/site/status.
type Puller struct {
	cfg Config
	db  *db
	log *slog.Logger

	mu  sync.Mutex
	lag map[string]*SiteLag
}

// Open validates cfg and opens (creating) the state file.
func Open(cfg Config) (*Puller, error) {
	if cfg.Wait <= 0 {
		cfg.Wait = 20 * time.Second
	}
	if cfg.Limit <= 0 {
		cfg.Limit = 500
	}
	if cfg.StatusEvery <= 0 {
		cfg.StatusEvery = 10 * time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if cfg.StatePath == "" {
		return nil, errors.New("central: state path required")
	}
	if len(cfg.Sites) == 0 {
		return nil, errors.New("central: no sites")
	}
	seen := map[string]bool{}
	for _, s := range cfg.Sites {
		if s.Name == "" || strings.ContainsAny(s.Name, "/ \t\n") || seen[s.Name] {
			return nil, fmt.Errorf("central: site name %q: want unique, non-empty, no '/' or spaces", s.Name)
		}
		seen[s.Name] = true
		if _, err := client.New(client.Config{Server: s.Server}); err != nil {
			return nil, fmt.Errorf("central: site %s: %w", s.Name, err)
		}
	}
	d, err := openDB(cfg.StatePath, false)
	if err != nil {
		return nil, err
	}
	p := &Puller{cfg: cfg, db: d, log: cfg.Log, lag: map[string]*SiteLag{}}
	for _, s := range cfg.Sites {
		c, n, err := d.cursor(s.Name)
		if err != nil {
			d.Close()
			return nil, err
		}
		p.lag[s.Name] = &SiteLag{Site: s.Name, Cursor: c, Events: n}
	}
	return p, nil
}

// Close closes the state file (after Run returned).
func (p *Puller) Close() error { return p.db.Close() }

// Run follows every site until ctx ends.
func (p *Puller) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, s := range p.cfg.Sites {
		wg.Add(2)
		go func() { defer wg.Done(); p.follow(ctx, s) }()
		go func() { defer wg.Done(); p.statusLoop(ctx, s) }()
	}
	wg.Wait()
	return nil
}

// Lag returns every site's follow state, in configuration order.
func (p *Puller) Lag() []SiteLag {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]SiteLag, 0, len(p.cfg.Sites))
	for _, s := range p.cfg.Sites {
		l := *p.lag[s.Name]
		if !l.CaughtUp.IsZero() {
			l.LagSeconds = time.Since(l.CaughtUp).Seconds()
		}
		if l.SiteApplied > l.Cursor {
			l.IndexLag = l.SiteApplied - l.Cursor
		}
		out = append(out, l)
	}
	return out
}

// Handler serves GET /v1/central/sites: the Lag as JSON {"items":[...]}.
func (p *Puller) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/central/sites", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"items": p.Lag()})
	})
	return mux
}

func (p *Puller) update(site string, f func(l *SiteLag)) {
	p.mu.Lock()
	f(p.lag[site])
	p.mu.Unlock()
}

func (p *Puller) fail(site, what string, err error) {
	p.update(site, func(l *SiteLag) {
		l.Reachable = false
		l.Errors++
		l.LastError = what + ": " + err.Error()
		l.LastErrorAt = time.Now()
	})
}

// siteClient builds the site's client (the token read from its file).
func (p *Puller) siteClient(s Site) (*client.Client, error) {
	tok := s.Token
	if s.TokenFile != "" {
		b, err := os.ReadFile(s.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("token: %w", err)
		}
		tok = strings.TrimSpace(string(b))
	}
	tr := &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 2, IdleConnTimeout: 90 * time.Second}
	return client.New(client.Config{Server: s.Server, Token: tok, HTTPClient: &http.Client{Transport: tr}})
}

type backoff struct {
	d, max time.Duration
}

func (b *backoff) next() time.Duration {
	if b.d == 0 {
		b.d = 250 * time.Millisecond
	} else {
		b.d = min(2*b.d, b.max)
	}
	return time.Duration(float64(b.d) * (0.75 + 0.5*rand.Float64()))
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// follow is one site's event loop.
func (p *Puller) follow(ctx context.Context, s Site) {
	bo := backoff{max: p.cfg.MaxBackoff}
	var c *client.Client
	for ctx.Err() == nil {
		if c == nil {
			var err error
			if c, err = p.siteClient(s); err != nil {
				p.fail(s.Name, "events", err)
				if !sleep(ctx, bo.next()) {
					return
				}
				continue
			}
		}
		p.mu.Lock()
		cursor := p.lag[s.Name].Cursor
		p.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, p.cfg.Wait+10*time.Second)
		el, err := c.Events(rctx, client.EventQuery{After: cursor, Limit: p.cfg.Limit, Wait: p.cfg.Wait})
		cancel()
		if ctx.Err() != nil {
			return
		}
		if oldest, ok := client.CursorExpired(err); ok {
			if err := p.resync(ctx, c, s, cursor, oldest); err != nil {
				p.fail(s.Name, "resync", err)
				if !sleep(ctx, bo.next()) {
					return
				}
			}
			continue
		}
		if err != nil {
			if e := client.AsError(err); e != nil && e.Status == http.StatusUnauthorized {
				c = nil // the token may have changed: read it again
			}
			p.fail(s.Name, "events", err)
			p.log.Warn("central: events", "site", s.Name, "cursor", cursor, "err", err)
			if !sleep(ctx, bo.next()) {
				return
			}
			continue
		}
		bo = backoff{max: p.cfg.MaxBackoff}
		if err := p.db.appendEvents(s.Name, cursor, el.Next, el.Events); err != nil {
			// A feed that breaks its order is not retried into the copy
			// blindly: report and retry from the stored cursor.
			p.fail(s.Name, "store", err)
			p.log.Error("central: store", "site", s.Name, "err", err)
			if !sleep(ctx, bo.next()) {
				return
			}
			continue
		}
		p.update(s.Name, func(l *SiteLag) {
			l.Reachable = true
			l.Events += len(el.Events)
			l.Cursor = max(cursor, el.Next)
			if len(el.Events) > 0 {
				l.Cursor = max(l.Cursor, el.Events[len(el.Events)-1].Index)
			}
			if len(el.Events) < p.cfg.Limit {
				l.CaughtUp = time.Now()
			}
		})
	}
}

// resync answers a 410: the events after cursor up to oldest are gone, so
// the site's current state (GET /v1/site/status) is stored and the feed is
// followed from oldest.
func (p *Puller) resync(ctx context.Context, c *client.Client, s Site, cursor, oldest uint64) error {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := c.SiteStatus(rctx)
	if err != nil {
		return err
	}
	if err := p.db.resync(s.Name, cursor, oldest, st); err != nil {
		return err
	}
	p.log.Warn("central: cursor expired; resynced from site status", "site", s.Name, "from", cursor, "oldest", oldest)
	p.update(s.Name, func(l *SiteLag) {
		l.Resyncs++
		l.Cursor = max(cursor, oldest)
		p.noteStatus(l, st)
	})
	return nil
}

func (p *Puller) noteStatus(l *SiteLag, st api.SiteStatus) {
	l.Machines = st.Total
	l.Provisioned = st.Counts[store.StateProvisioned]
	if v, err := strconv.ParseUint(st.Raft.Stats["applied_index"], 10, 64); err == nil {
		l.SiteApplied = v
	}
}

// statusLoop pulls GET /v1/site/status every StatusEvery.
func (p *Puller) statusLoop(ctx context.Context, s Site) {
	bo := backoff{max: p.cfg.MaxBackoff}
	for ctx.Err() == nil {
		wait := p.cfg.StatusEvery
		c, err := p.siteClient(s)
		if err == nil {
			rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			var st api.SiteStatus
			st, err = c.SiteStatus(rctx)
			cancel()
			if err == nil {
				err = p.db.putStatus(s.Name, st)
				p.update(s.Name, func(l *SiteLag) { p.noteStatus(l, st) })
			}
		}
		if err != nil && ctx.Err() == nil {
			p.fail(s.Name, "status", err)
			wait = max(wait, bo.next())
		} else {
			bo = backoff{max: p.cfg.MaxBackoff}
		}
		if !sleep(ctx, wait) {
			return
		}
	}
}
