package fleetsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// apiAddr is Kiln's REST API, on its provisioning address so the simulator
// reaches it from the machines' namespace (node 0's in a cluster).
const (
	apiAddr  = ServerIP + ":7480"
	bootHTTP = ServerIP + ":8080"
)

// kiln is one `kiln serve` process of a run (one node of a cluster) and a
// plain-HTTP client of its REST API (the admin token of its data directory).
type kiln struct {
	i       int    // node index, from 0
	id      string // node_id
	ns      string // network namespace
	ip      string // provisioning address (API on :7480, raft :7481, forward :7482, boot :8080)
	bin     string
	cfgPath string
	data    string
	logPath string
	token   string
	http    *http.Client
	starts  int

	mu     sync.Mutex
	cmd    *exec.Cmd
	pid    int
	exited chan struct{} // closed when the current process has exited
}

func (k *kiln) api() string { return k.ip + ":7480" }

// kilnConfig is the appliance configuration of one node (appliance/config.go
// keys): the lab's provisioning interface and a DHCP pool that holds
// MaxMachines, the BMC limits, and the agent's poll interval. With more than
// one node (all), each node's raft and forward RPC listen on its address, the
// first bootstraps and the others join it with a one-time token, and every
// node lists the others' boot listeners (boot.peer_http_addrs: agents fail
// over to them, agentapi.Task.Endpoints), as the HA lab's nodes do.
func kilnConfig(o Options, k *kiln, all []*kiln, join []string, token string) string {
	poll := ""
	if o.AgentPoll > 0 {
		poll = "\n  agent_poll_after: " + o.AgentPoll.String()
	}
	conc := ""
	if o.BMCConcurrency > 0 {
		conc = "\n  concurrency: " + strconv.Itoa(o.BMCConcurrency)
	}
	raft := "  addr: 127.0.0.1:7481\n  forward_addr: 127.0.0.1:7482\n  bootstrap: true\n"
	peers := ""
	if len(all) > 1 {
		raft = fmt.Sprintf("  addr: %s:7481\n  forward_addr: %s:7482\n", k.ip, k.ip)
		if len(join) == 0 {
			raft += "  bootstrap: true\n"
		} else {
			raft += fmt.Sprintf("  bootstrap: false\n  join: [\"%s\"]\n  join_token: %s\n", strings.Join(join, `", "`), token)
		}
		var ps []string
		for _, p := range all {
			if p != k {
				ps = append(ps, `"`+p.ip+`:8080"`)
			}
		}
		peers = "\n  peer_http_addrs: [" + strings.Join(ps, ", ") + "]"
	}
	listen := k.api() // a node of a cluster: its own address
	if len(all) == 1 {
		listen = o.APIListen
	}
	return fmt.Sprintf(`node_id: %s
data_dir: %s
log:
  level: warn
api:
  addr: %s
raft:
%sboot:
  interface: %s
  server_ip: %s
  http_addr: %s:8080%s
  env_dir: %s
  image_dir: %s
  unknown_machines: exit
  dhcp:
    enabled: true
    mode: authoritative
    subnets:
      - cidr: %s
        pool_start: %s
        pool_end: %s
        lease_time: 1h
bmc:
  timeout: 20s
  retries: 2%s
lifecycle:
  step_timeout: 10m%s
%s%s`, k.id, k.data, listen, raft, srvIf, k.ip, k.ip, peers, o.EnvDir, filepath.Join(filepath.Dir(k.data), "images"),
		subnetCIDR, poolStart, poolEnd, conc, poll, remediationConfig(o), attestConfig(o))
}

// remediationConfig is the `remediation:` section of a day-2 run
// (appliance/remediation_config.go keys): the ladder's clocks and the brake
// window compressed by the run's Hour, no drain (no owner answers one), the
// BMC health poll every Day2.HealthPoll. Empty without Day2.
func remediationConfig(o Options) string {
	d := o.Day2
	if d == nil {
		return ""
	}
	return fmt.Sprintf(`remediation:
  mode: auto
  settle: %s
  hold: %s
  steps:
    power_cycle: %s
    reinspect: %s
    reprovision: %s
  drain:
    timeout: -1s
  brake:
    window: %s
  health:
    interval: %s
    workers: %d
    backoff: %s
    max_backoff: %s
`, d.Settle, d.Hold, 10*d.Settle+30*time.Second, 2*time.Minute+o.Timeout/4, 3*time.Minute+o.Timeout/4, d.BrakeWindow, d.HealthPoll,
		d.HealthWorkers, d.HealthPoll, 5*d.HealthPoll)
}

// newNodes are the run's nodes (not started): one named kiln-fleet with its
// data in WORK/kiln-data, or Nodes named kiln-nK with theirs in WORK/nK.
func newNodes(o Options, l *lab) []*kiln {
	var out []*kiln
	for i, ns := range l.nodes {
		k := &kiln{i: i, id: "kiln-fleet", ns: ns, ip: ServerIP, bin: o.KilnBin, data: filepath.Join(o.Work, "kiln-data"),
			cfgPath: filepath.Join(o.Work, "kiln.yaml"), logPath: filepath.Join(o.Work, "kiln.log"),
			http: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64, Proxy: nil}}}
		if len(l.nodes) > 1 {
			dir := filepath.Join(o.Work, fmt.Sprintf("n%d", i+1))
			k.id, k.ip = fmt.Sprintf("kiln-n%d", i+1), nodeIP(i)
			k.data, k.cfgPath, k.logPath = filepath.Join(dir, "data"), filepath.Join(dir, "kiln.yaml"), filepath.Join(dir, "kiln.log")
		}
		out = append(out, k)
	}
	return out
}

// startNodes writes each node's configuration and starts it, in order: node
// 0 bootstraps, each further node joins with a one-time token node 0 makes
// (POST /v1/cluster/tokens). It returns once every node's /readyz answers.
func startNodes(ctx context.Context, o Options, nodes []*kiln) error {
	var join []string
	for i, k := range nodes {
		if err := os.RemoveAll(filepath.Dir(k.data) + "/images"); err != nil {
			return err
		}
		if err := os.RemoveAll(k.data); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(k.cfgPath), 0o755); err != nil {
			return err
		}
		token := ""
		if i > 0 {
			var jt struct {
				Token string `json:"token"`
			}
			if err := nodes[0].do(ctx, "POST", "/v1/cluster/tokens", nil, map[string]string{"ttl": "15m"}, "", &jt); err != nil {
				return fmt.Errorf("fleetsim: join token for %s: %w", k.id, err)
			}
			token = jt.Token
		}
		if err := os.WriteFile(k.cfgPath, []byte(kilnConfig(o, k, nodes, join, token)), 0o600); err != nil {
			return err
		}
		if err := k.start(); err != nil {
			return err
		}
		if err := k.waitReady(ctx, 60*time.Second); err != nil {
			return err
		}
		join = append(join, k.ip+":7482")
	}
	return nil
}

// start runs the node's process in its namespace (the log appended to across restarts).
func (k *kiln) start() error {
	logf, err := os.OpenFile(k.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	k.starts++
	fmt.Fprintf(logf, "==== start %d at %s\n", k.starts, time.Now().UTC().Format(time.RFC3339Nano))
	// ip netns exec execs kiln in place: the process's PID is kiln's.
	cmd := exec.Command("ip", "netns", "exec", k.ns, k.bin, "serve", "--config", k.cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("fleetsim: start %s: %w", k.bin, err)
	}
	exited := make(chan struct{})
	k.mu.Lock()
	k.cmd, k.pid, k.exited = cmd, cmd.Process.Pid, exited
	k.mu.Unlock()
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	return nil
}

// running reports whether the node's current process has not exited.
func (k *kiln) running() bool {
	k.mu.Lock()
	ch := k.exited
	k.mu.Unlock()
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

// waitReady waits until the node's admin token exists and /readyz answers 200.
func (k *kiln) waitReady(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	k.mu.Lock()
	exited := k.exited
	k.mu.Unlock()
	for {
		if b, err := os.ReadFile(filepath.Join(k.data, "admin.token")); err == nil && len(bytes.TrimSpace(b)) > 0 {
			k.token = string(bytes.TrimSpace(b))
			if err := k.do(ctx, "GET", "/readyz", nil, nil, "", nil); err == nil {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("fleetsim: %s exited at start (see %s)", k.id, k.logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("fleetsim: %s not ready in %s (see %s)", k.id, d, k.logPath)
		}
	}
}

// kill sends SIGKILL to the node's process and waits for it to end.
func (k *kiln) kill() {
	k.mu.Lock()
	cmd, exited := k.cmd, k.exited
	k.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

func (k *kiln) stop() {
	k.mu.Lock()
	cmd, exited := k.cmd, k.exited
	k.mu.Unlock()
	if k == nil || cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// apiError is a non-2xx answer of the REST API.
type apiError struct {
	Method, Path string
	Status       int
	Body         string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("kiln API %s %s: HTTP %d: %s", e.Method, e.Path, e.Status, e.Body)
}

// do calls the REST API with the admin token. body is JSON-encoded unless it
// is an io.Reader (sent with ctype); out, when not nil, is decoded from a 2xx
// answer.
func (k *kiln) do(ctx context.Context, method, path string, q url.Values, body any, ctype string, out any) error {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case io.Reader:
		rd = b
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			return err
		}
		rd, ctype = bytes.NewReader(buf), "application/json"
	}
	u := "http://" + k.api() + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+k.token)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := k.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		return &apiError{Method: method, Path: path, Status: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// procStat is what /proc/PID says of a process: CPU time (user + system) and
// peak resident set (VmHWM).
type procStat struct {
	CPU     time.Duration
	PeakRSS int64 // bytes
}

// readProc reads /proc/PID/stat (fields 14 and 15, utime and stime, in clock
// ticks of 1/100 s: USER_HZ on Linux) and /proc/PID/status (VmHWM, kB).
func readProc(pid int) (procStat, error) {
	var ps procStat
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ps, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ps, errors.New("fleetsim: /proc stat: no ')'")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return ps, errors.New("fleetsim: /proc stat: short")
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	ps.CPU = time.Duration(ut+st) * 10 * time.Millisecond
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ps, err
	}
	for _, line := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			ps.PeakRSS = kb << 10
		}
	}
	return ps, nil
}

// dirSize is the bytes of the regular files under dir.
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// storeFiles is the size of the raft log (raft.db, raft-boltdb) and of the
// bbolt FSM (fsm.db) found under Kiln's data directory (store.RaftDBFile,
// store.FSMDBFile; the package may not import the store).
func storeFiles(dir string) (raft, fsm int64) {
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		switch d.Name() {
		case "raft.db":
			raft += fi.Size()
		case "fsm.db":
			fsm += fi.Size()
		}
		return nil
	})
	return raft, fsm
}
