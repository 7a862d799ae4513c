package appliance

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/api"
	"kiln/httpboot"
)

func TestCompareEnv(t *testing.T) {
	a := map[string]string{"vmlinuz": "aa", "initramfs": "bb"}
	b := map[string]string{"vmlinuz": "aa", "initramfs": "cc"}
	for _, tc := range []struct {
		name     string
		recs     map[string]map[string]string
		site     map[string]string
		mismatch bool
		match    map[string]bool
	}{
		{"one node", map[string]map[string]string{"n1": a}, a, false, map[string]bool{"n1": true}},
		{"all equal", map[string]map[string]string{"n1": a, "n2": a, "n3": a}, a, false,
			map[string]bool{"n1": true, "n2": true, "n3": true}},
		{"one differs", map[string]map[string]string{"n1": a, "n2": a, "n3": b}, a, true,
			map[string]bool{"n1": true, "n2": true, "n3": false}},
		{"two differ: no majority", map[string]map[string]string{"n1": a, "n2": b}, nil, true,
			map[string]bool{"n1": false, "n2": false}},
		{"a node reporting none is not counted", map[string]map[string]string{"n1": a, "n2": nil, "n3": b, "n4": a}, a, true,
			map[string]bool{"n1": true, "n2": false, "n3": false, "n4": true}},
		{"nobody reports", map[string]map[string]string{"n1": nil}, nil, false, map[string]bool{"n1": false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := compareEnv(tc.recs)
			if envString(got.Site) != envString(tc.site) || got.Mismatch != tc.mismatch {
				t.Fatalf("site %v mismatch %v, want %v %v", got.Site, got.Mismatch, tc.site, tc.mismatch)
			}
			for _, n := range got.Nodes {
				if n.Match != tc.match[n.Node] {
					t.Fatalf("node %s match %v", n.Node, n.Match)
				}
			}
		})
	}
}

func writeEnv(t *testing.T, dir string, kernel, initrd []byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{httpboot.EnvKernel: kernel, httpboot.EnvInitramfs: initrd} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func envGet(t *testing.T, n *node) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + n.cfg.Boot.HTTPAddr + "/env/" + httpboot.EnvInitramfs)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func siteEnv(t *testing.T, n *node) *api.EnvStatus {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+n.cfg.API.Addr+"/v1/site/status", nil)
	req.Header.Set("Authorization", "Bearer "+n.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ss api.SiteStatus
	if err := json.NewDecoder(resp.Body).Decode(&ss); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("site status: HTTP %d, %v", resp.StatusCode, err)
	}
	return ss.Environment
}

// TestEnvMismatchNotServed, on a real three-node cluster on loopback: each
// node reports its in-RAM environment's digests with its registration; the
// node whose initramfs differs from the other two does not serve it (503,
// with the reason) and says so in the site status of every node, in its
// kiln_env_mismatch gauge and in an env_mismatch event; given the site's
// build, it serves again.
func TestEnvMismatchNotServed(t *testing.T) {
	defer func(d time.Duration) { envCheckTestInterval = d }(envCheckTestInterval)
	envCheckTestInterval = 100 * time.Millisecond
	kernel, good, bad := []byte("kernel build 1\n"), []byte("initramfs build 1\n"), []byte("initramfs, another build\n")
	envAt := func(dir string, initrd []byte) func(*Config) {
		writeEnv(t, dir, kernel, initrd)
		return func(c *Config) { c.Boot.EnvDir = dir }
	}
	a := startNode(t, "env-a", nil, envAt(filepath.Join(t.TempDir(), "env"), good))
	a.waitReady(t)
	b := startNode(t, "env-b", []string{a.cfg.Raft.ForwardAddr}, joinToken(t, a), envAt(filepath.Join(t.TempDir(), "env"), good))
	b.waitReady(t)
	cDir := filepath.Join(t.TempDir(), "env")
	c := startNode(t, "env-c", []string{a.cfg.Raft.ForwardAddr}, joinToken(t, a), envAt(cDir, bad))
	c.waitReady(t)

	wait := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 15 s", what)
			}
		}
	}
	wait("node c holds its environment", func() bool { return c.app.env.Held() != "" })
	code, body := envGet(t, c)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "differs from the site's") {
		t.Fatalf("node c /env: HTTP %d %q", code, body)
	}
	t.Logf("node c /env/initramfs: HTTP %d %s", code, strings.TrimSpace(body))
	for _, n := range []*node{a, b} {
		if code, body := envGet(t, n); code != http.StatusOK || body != string(good) {
			t.Fatalf("node %s /env: HTTP %d %q", n.cfg.NodeID, code, body)
		}
		if n.app.env.Held() != "" {
			t.Fatalf("node %s holds: %s", n.cfg.NodeID, n.app.env.Held())
		}
	}
	var es *api.EnvStatus
	wait("site status on a reports c", func() bool {
		es = siteEnv(t, a)
		return es != nil && es.Mismatch && len(es.Nodes) == 3 && len(es.Nodes[2].Files) == 2
	})
	for _, n := range es.Nodes {
		if want := n.Node != "env-c"; n.Match != want {
			t.Fatalf("site status: %+v", es.Nodes)
		}
	}
	if got := metricLine(t, c, "kiln_env_mismatch"); got != "kiln_env_mismatch 1" {
		t.Fatalf("node c /metrics: %q", got)
	}
	hasEvent := func(kind string) bool {
		evs, err := a.app.Store.Events(0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Subject == "node/env-c" && e.Kind == kind {
				return true
			}
		}
		return false
	}
	wait("env_mismatch event", func() bool { return hasEvent("env_mismatch") })

	// The site's build copied to c: it serves again.
	writeEnv(t, cDir, kernel, good)
	wait("node c serves again", func() bool { return c.app.env.Held() == "" })
	if code, body := envGet(t, c); code != http.StatusOK || body != string(good) {
		t.Fatalf("node c /env after the fix: HTTP %d %q", code, body)
	}
	wait("site status agrees", func() bool { es = siteEnv(t, b); return es != nil && !es.Mismatch })
	wait("env_match event", func() bool { return hasEvent("env_match") })
	if got := metricLine(t, c, "kiln_env_mismatch"); got != "kiln_env_mismatch 0" {
		t.Fatalf("node c /metrics after the fix: %q", got)
	}
}

// metricLine is the sample line of metric name (no labels) on n's /metrics.
func metricLine(t *testing.T, n *node, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + n.cfg.API.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, name+" ") {
			return l
		}
	}
	return ""
}
