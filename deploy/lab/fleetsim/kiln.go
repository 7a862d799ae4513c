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
	"time"
)

// apiAddr is Kiln's REST API, on its provisioning address so the simulator
// reaches it from the machines' namespace.
const (
	apiAddr  = ServerIP + ":7480"
	bootHTTP = ServerIP + ":8080"
)

// kiln is the `kiln serve` process of a run and a plain-HTTP client of its
// REST API (the admin token of the run's data directory).
type kiln struct {
	cmd     *exec.Cmd
	pid     int
	data    string
	logPath string
	token   string
	http    *http.Client
	exited  chan struct{}
}

// kilnConfig is the appliance configuration of a run (appliance/config.go
// keys): the lab's provisioning interface and a DHCP pool that holds
// MaxMachines, the BMC limits, and the agent's poll interval.
func kilnConfig(o Options, data string) string {
	poll := ""
	if o.AgentPoll > 0 {
		poll = "\n  agent_poll_after: " + o.AgentPoll.String()
	}
	conc := ""
	if o.BMCConcurrency > 0 {
		conc = "\n  concurrency: " + strconv.Itoa(o.BMCConcurrency)
	}
	return fmt.Sprintf(`node_id: kiln-fleet
data_dir: %s
log:
  level: warn
api:
  addr: %s
raft:
  addr: 127.0.0.1:7481
  forward_addr: 127.0.0.1:7482
  bootstrap: true
boot:
  interface: %s
  server_ip: %s
  http_addr: %s
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
`, data, o.APIListen, srvIf, ServerIP, bootHTTP, o.EnvDir, filepath.Join(o.Work, "images"), subnetCIDR, poolStart, poolEnd, conc, poll)
}

// startKiln writes the configuration and starts bin/kiln serve in the
// server namespace; it returns once /readyz answers 200.
func startKiln(ctx context.Context, o Options, l *lab) (*kiln, error) {
	data := filepath.Join(o.Work, "kiln-data")
	if err := os.RemoveAll(data); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(o.Work, "kiln.yaml")
	if err := os.WriteFile(cfgPath, []byte(kilnConfig(o, data)), 0o644); err != nil {
		return nil, err
	}
	k := &kiln{data: data, logPath: filepath.Join(o.Work, "kiln.log"), exited: make(chan struct{}),
		http: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64, Proxy: nil}}}
	logf, err := os.Create(k.logPath)
	if err != nil {
		return nil, err
	}
	// ip netns exec execs kiln in place: the process's PID is kiln's.
	k.cmd = exec.Command("ip", "netns", "exec", l.srv, o.KilnBin, "serve", "--config", cfgPath)
	k.cmd.Stdout, k.cmd.Stderr = logf, logf
	if err := k.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("fleetsim: start %s: %w", o.KilnBin, err)
	}
	k.pid = k.cmd.Process.Pid
	go func() { _ = k.cmd.Wait(); logf.Close(); close(k.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(data, "admin.token")); err == nil && len(bytes.TrimSpace(b)) > 0 {
			k.token = string(bytes.TrimSpace(b))
			if err := k.do(ctx, "GET", "/readyz", nil, nil, "", nil); err == nil {
				return k, nil
			}
		}
		select {
		case <-k.exited:
			return nil, fmt.Errorf("fleetsim: kiln exited at start (see %s)", k.logPath)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("fleetsim: kiln not ready in 30 s (see %s)", k.logPath)
		}
	}
}

func (k *kiln) stop() {
	if k == nil || k.cmd.Process == nil {
		return
	}
	_ = k.cmd.Process.Signal(os.Interrupt)
	select {
	case <-k.exited:
	case <-time.After(10 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.exited
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
	u := "http://" + apiAddr + path
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
