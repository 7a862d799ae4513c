package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"time"

	"io"
	"kiln/api/agentapi"
	"kiln/deploy/lab/testkit"
	"kiln/deploy/lab/testreq"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	UID    string `json:"uid"`
	Title  string `json:"title"`
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		GridPos struct {
			H, W, X, Y int
		} `json:"gridPos"`
		Datasource *struct {
			Type, UID string
		} `json:"datasource"`
		Targets []struct {
			Expr  string `json:"expr"`
			RefID string `json:"refId"`
		} `json:"targets"`
	} `json:"panels"`
}

var metricName = regexp.MustCompile(`\bkiln_[a-z0-9_]+`)

// loadDashboard reads deploy/grafana/kiln-dashboard.json, checks its shape
// and returns every metric name its queries read.
func loadDashboard(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("../deploy/grafana/kiln-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) {
		t.Fatal("kiln-dashboard.json is not valid JSON")
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard uid %q title %q with %d panels", d.UID, d.Title, len(d.Panels))
	}
	used := map[string][]string{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W < 1 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H < 1 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || len(p.Targets) == 0 {
			t.Errorf("panel %q: needs a prometheus datasource and a query", p.Title)
		}
		for _, q := range p.Targets {
			ms := metricName.FindAllString(q.Expr, -1)
			if len(ms) == 0 {
				t.Errorf("panel %q: query %q reads no Kiln metric", p.Title, q.Expr)
			}
			for _, m := range ms {
				used[m] = append(used[m], p.Title)
			}
		}
	}
	return used
}

// scrape returns the sample names on a /metrics page.
func scrape(t *testing.T, url string) map[string]bool {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	out := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if l == "" || l[0] == '#' {
			continue
		}
		n := l
		if i := strings.IndexAny(l, "{ "); i >= 0 {
			n = l[:i]
		}
		out[n] = true
	}
	return out
}

// TestGrafanaDashboard: the dashboard is valid JSON of the expected
// shape, and every metric its queries name is on the /metrics of a live
// appliance (the real registry of every part: DHCP and TFTP on a
// provisioning link, HTTP boot, the API, the store, the lifecycle and the
// BMC controller) once it has served some traffic: a DHCP client's lease,
// TFTP and HTTP boot fetches (one of a missing file each), API reads and
// a refused token, a machine inspected through an unreachable BMC, and an
// agent's step reports. A labelled metric is exposed only once it has a
// series, so the traffic is what makes each one appear.
func TestGrafanaDashboard(t *testing.T) {
	used := loadDashboard(t)
	testreq.Root(t, "a provisioning link (network namespace) for DHCP and TFTP", "ip", "udhcpc", "tftp", "timeout")
	l := testkit.NewLink(t, "kbt-g", netip.MustParsePrefix("10.72.9.0/24"), 0)
	n := startNode(t, "kiln-graf", nil, func(c *Config) {
		c.Boot.Interface, c.Boot.ServerIP = l.HostIf, l.HostIP
		c.Boot.TFTPAddr = l.HostIP + ":69"
		c.Boot.DHCP = DHCPConfig{Enabled: true, Mode: "authoritative", Subnets: []SubnetConfig{{CIDR: "10.72.9.0/24",
			Router: l.HostIP, PoolStart: "10.72.9.100", PoolEnd: "10.72.9.150"}}}
		c.BMC.Timeout, c.BMC.Retries = 2*time.Second, 1
	})
	n.waitReady(t)
	api, boot, tok := "http://"+n.cfg.API.Addr, "http://"+n.cfg.Boot.HTTPAddr, n.token

	// DHCP: a client in the namespace takes a lease (DISCOVER, OFFER,
	// REQUEST, ACK, the lease committed); a second, at once, is dropped
	// by the per-MAC rate limit or answered.
	for i := 0; i < 2; i++ {
		if out, err := l.Exec(20*time.Second, "", "udhcpc", "-i", l.NSIf, "-n", "-q", "-f", "-t", "3", "-T", "1", "-s", "/bin/true"); err != nil && i == 0 {
			t.Fatalf("udhcpc: %v\n%s", err, out)
		}
	}
	// A datagram too short to be DHCP is dropped as malformed.
	testkit.InNetns(t, l.NS, func() {
		c, err := net.Dial("udp4", l.HostIP+":67")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("not a DHCP message"))
		c.Close()
	})
	// TFTP: the BIOS iPXE binary, and a file that does not exist.
	dir := t.TempDir()
	if out, err := l.Exec(20*time.Second, dir, "tftp", "-m", "binary", l.HostIP, "-c", "get", "undionly.kpxe"); err != nil {
		t.Fatalf("tftp get: %v\n%s", err, out)
	}
	_, _ = l.Exec(20*time.Second, dir, "tftp", "-m", "binary", l.HostIP, "-c", "get", "no-such-file")
	// HTTP boot: an iPXE binary and a missing environment file.
	for _, u := range []string{boot + "/ipxe.efi", boot + "/env/no-such-file"} {
		if res, err := http.Get(u); err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}
	// The API: reads, a refused token, a machine and a duplicate of it.
	httpDo(t, tok, "GET", api+"/v1/machines", "", nil)
	httpDo(t, "not-a-token", "GET", api+"/v1/machines", "", nil)
	mac := "52:54:00:9a:00:01"
	spec := `{"name":"g1","intended":{"nics":[{"mac":"` + mac + `"}]}}`
	code, body := httpDo(t, tok, "POST", api+"/v1/machines", "application/json", strings.NewReader(spec))
	if code != http.StatusCreated {
		t.Fatalf("create machine: %d %s", code, body)
	}
	var m struct{ ID string }
	_ = json.Unmarshal(body, &m)
	httpDo(t, tok, "POST", api+"/v1/machines", "application/json", strings.NewReader(`{"name":"g2","intended":{"nics":[{"mac":"`+mac+`"}]}}`))
	// BMC: enrolled at a port nothing listens on; inspecting the machine
	// powers it through the BMC, which fails (job, op, retry).
	closed := freeAddrs(t, 1)[0]
	if code, body := httpDo(t, tok, "POST", api+"/v1/machines/"+m.ID+"/bmc", "application/json",
		strings.NewReader(`{"address":"`+closed+`","driver":"redfish","username":"u","password":"p"}`)); code >= 300 {
		t.Fatalf("enrol BMC: %d %s", code, body)
	}
	if code, body := httpDo(t, tok, "POST", api+"/v1/machines/"+m.ID+"/inspect", "application/json", nil); code >= 300 {
		t.Fatalf("inspect: %d %s", code, body)
	}
	// The agent: the machine's per-boot token (as when it netboots) and
	// its inspect step started and failed.
	b, err := n.app.life.BootFor(context.Background(), mac)
	if err != nil || b.Token == "" {
		t.Fatalf("boot for %s: %+v %v", mac, b, err)
	}
	for _, st := range []agentapi.State{agentapi.StateStarted, agentapi.StateFailed} {
		rep, _ := json.Marshal(agentapi.Report{MachineID: m.ID, Step: agentapi.StepInspect, State: st, Reason: agentapi.ReasonInternal})
		req, _ := http.NewRequest("POST", api+"/v1/agent/report", bytes.NewReader(rep))
		req.Header.Set("Authorization", "Bearer "+b.Token)
		req.Header.Set(agentapi.HeaderMachine, m.ID)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		rb, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode >= 300 {
			t.Fatalf("agent report %s: %d %s", st, res.StatusCode, rb)
		}
	}

	var missing []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		have := scrape(t, api+"/metrics")
		missing = missing[:0]
		for m := range used {
			if !have[m] {
				missing = append(missing, m)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond) // jobs run and the lifecycle's tick sets its gauges
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("%d of %d metrics the dashboard reads are not on a live /metrics: %s", len(missing), len(used), strings.Join(missing, " "))
	}
	t.Logf("all %d metrics the dashboard reads are on the live /metrics", len(used))
}
