package appliance

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/api"
	"kiln/httpboot"
	"kiln/store"
)

// The in-RAM environment on every node (issue 12 item 3): its build is
// reproducible, so its digests must match on every node, and a mismatch is
// reported, not served.
//
// Each node reports the SHA-256 of its environment files (httpboot's
// EnvDigests, cached per size and mtime) in its version record (command 12,
// store.Config.Env). Every envCheckInterval each node compares the records
// of the raft configuration's servers (its own digests taken fresh): the
// site's environment is the set of digests a strict majority of the
// reporting nodes serve. A node whose own set is not the site's — or any
// node when there is no majority (two nodes that differ: neither is known
// right) — holds its environment: /env/* answers 503 with the reason and
// logs each refused request at ERROR. It reports it in the site status
// (EnvStatus), the gauge kiln_env_mismatch, an ERROR log line and an event
// (subject node/ID, kind env_mismatch; env_match when it serves again). A
// node that reports no environment is not counted and never held.

// envCheckInterval is how often a node compares environments.
const envCheckInterval = 2 * time.Second

// envCheckTestInterval, when not 0, replaces envCheckInterval (tests).
var envCheckTestInterval time.Duration

type envCheck struct {
	st       *store.Store
	boot     *httpboot.Server
	self     string
	interval time.Duration
	log      *slog.Logger
	gauge    prometheus.Gauge

	mu   sync.Mutex
	held string // reason this node holds its environment; "" = serving
}

func newEnvCheck(st *store.Store, boot *httpboot.Server, self string, log *slog.Logger, reg prometheus.Registerer) (*envCheck, error) {
	e := &envCheck{st: st, boot: boot, self: self, interval: envCheckInterval, log: log.With("component", "envcheck"),
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kiln_env_mismatch",
			Help: "1 while this node's in-RAM environment differs from the site's (it does not serve it), else 0."})}
	if envCheckTestInterval != 0 {
		e.interval = envCheckTestInterval
	}
	if reg != nil {
		if err := reg.Register(e.gauge); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// digests is store.Config.Env: this node's environment digests (nil when
// the boot server is not built yet or the files cannot be read).
func (e *envCheck) digests() map[string]string {
	if e == nil || e.boot == nil {
		return nil
	}
	d, err := e.boot.EnvDigests()
	if err != nil {
		e.log.Warn("hashing the in-RAM environment", "err", err)
		return nil
	}
	return d
}

// Run compares at once and then every interval until ctx ends. It returns nil.
func (e *envCheck) Run(ctx context.Context) error {
	t := time.NewTicker(e.interval)
	defer t.Stop()
	for {
		e.checkOnce(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (e *envCheck) checkOnce(ctx context.Context) {
	if !e.st.Ready() {
		return // the replica may lag: keep the last decision
	}
	st, err := e.EnvStatus()
	if err != nil {
		e.log.Debug("environment comparison", "err", err)
		return
	}
	var mine api.EnvNode
	for _, n := range st.Nodes {
		if n.Node == e.self {
			mine = n
		}
	}
	reason := ""
	if len(mine.Files) > 0 && !mine.Match {
		reason = fmt.Sprintf("its in-RAM environment (%s) differs from the site's (%s); "+
			"copy the site's build to this node's boot.env_dir (its digests are in `kiln status`)",
			envString(mine.Files), orStr(envString(st.Site), "no majority of the nodes agree"))
	}
	e.mu.Lock()
	prev := e.held
	e.held = reason
	e.mu.Unlock()
	if reason == prev {
		return
	}
	e.boot.HoldEnv(reason)
	if (reason == "") == (prev == "") {
		return // still held, for a reason worded differently (the site's set became known): no new event
	}
	kind := "env_match"
	if reason != "" {
		e.gauge.Set(1)
		kind = "env_mismatch"
		e.log.Error("in-RAM environment NOT served: "+reason, "node", e.self)
	} else {
		e.gauge.Set(0)
		e.log.Info("in-RAM environment matches the site's again: serving it", "node", e.self, "env", envString(mine.Files))
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := e.st.AppendEvents(wctx, []store.Event{{Subject: "node/" + e.self, Kind: kind,
		To: envString(mine.Files), Actor: "appliance:" + e.self, Message: reason}}); err != nil && ctx.Err() == nil {
		e.log.Warn("recording the environment event", "kind", kind, "err", err)
	}
}

// Held is the reason this node does not serve its environment ("" when it
// serves it), as of the last comparison.
func (e *envCheck) Held() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.held
}

// EnvStatus is api.EnvBackend: every server of the raft configuration with
// the digests of its version record (this node's taken fresh), compared.
func (e *envCheck) EnvStatus() (*api.EnvStatus, error) {
	ms, err := e.st.Members()
	if err != nil {
		return nil, err
	}
	recs := map[string]map[string]string{}
	for _, m := range ms {
		if m.ID == e.self {
			recs[m.ID] = e.digests()
		} else {
			recs[m.ID] = m.Version.Env
		}
	}
	return compareEnv(recs), nil
}

// compareEnv is the rule: the site's environment is the digest set a strict
// majority of the nodes reporting one serve (node → digests; an empty set
// does not report).
func compareEnv(recs map[string]map[string]string) *api.EnvStatus {
	counts := map[string]int{}
	sets := map[string]map[string]string{}
	reporting := 0
	for _, d := range recs {
		if len(d) == 0 {
			continue
		}
		reporting++
		k := envString(d)
		counts[k]++
		sets[k] = d
	}
	out := &api.EnvStatus{Nodes: []api.EnvNode{}}
	for k, n := range counts {
		if 2*n > reporting {
			out.Site = maps.Clone(sets[k])
		}
	}
	ids := make([]string, 0, len(recs))
	for id := range recs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		d := recs[id]
		n := api.EnvNode{Node: id, Files: maps.Clone(d)}
		n.Match = len(d) > 0 && out.Site != nil && maps.Equal(d, out.Site)
		if len(d) > 0 && !n.Match {
			out.Mismatch = true
		}
		out.Nodes = append(out.Nodes, n)
	}
	return out
}

// envString is "initramfs=SHA,vmlinuz=SHA" (file names sorted, full
// digests): the key compareEnv counts by, and what logs and events show.
func envString(d map[string]string) string {
	names := make([]string, 0, len(d))
	for n := range d {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=" + d[n]
	}
	return strings.Join(parts, ",")
}

func orStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
