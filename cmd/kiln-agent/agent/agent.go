package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/go-attestation/attest"
	"golang.org/x/sys/unix"

	"kiln/api/agentapi"
	"kiln/cmd/kiln-agent/inventory"
)

// Defaults (named so Config zero values are explicit).
const (
	DefaultPollAfter     = 5 * time.Second
	DefaultHeartbeat     = 10 * time.Second
	DefaultRetries       = 6
	DefaultRetryBase     = 500 * time.Millisecond
	DefaultRetryMax      = 10 * time.Second
	DefaultMaxResumes    = 5
	DefaultStallTimeout  = 30 * time.Second
	DefaultStageSize     = 16 << 20 // cidata partition, bytes
	DefaultReadTestBytes = 64 << 20
	DefaultHTTPTimeout   = 30 * time.Second // per appliance call (not image streams)
	DefaultReportFor     = 10 * time.Minute // how long a step report is retried until acknowledged
	DefaultResumeFor     = 5 * time.Minute  // how long a broken image stream keeps trying to resume
	writeBufSize         = 4 << 20
	directAlign          = 4096 // O_DIRECT offsets and lengths: a multiple of every logical block size in use
	directWriters        = 2    // O_DIRECT writes in flight
	eraseCheckBytes      = 1 << 20
)

// Version is reported at registration.
var Version = "dev"

// Config configures an Agent. URL, MachineID and Token come from the kernel command line
// (agentapi.ArgURL etc.).
type Config struct {
	URL       string
	MachineID string
	Token     string
	// HTTP is used for appliance calls and image streams; nil = a client without overall
	// timeout (image streams are long) whose appliance calls are bounded by DefaultHTTPTimeout.
	HTTP *http.Client
	// Root is the file system root for inventory ("/" when empty).
	Root string
	// Console receives human progress lines ("kiln-agent: step write 43%"); nil = discard.
	Console io.Writer
	// ListDisks lists candidate disks; nil = inventory.Disks(Root) with DiskHealth filled in.
	ListDisks func() ([]agentapi.Disk, error)
	// Reboot ends the run: reboot(2) with RB_AUTOBOOT (true) or RB_POWER_OFF (false) after sync.
	// nil = the real syscall. If it returns, Run returns its error (nil in tests).
	Reboot func(reboot bool) error
	// Retries, RetryBase, RetryMax bound appliance-call retries (exponential backoff).
	Retries   int
	RetryBase time.Duration
	RetryMax  time.Duration
	// MaxResumes bounds Range resumptions of one image stream.
	MaxResumes int
	// ReportFor bounds how long a step report (started, succeeded, failed; not a
	// heartbeat) is retried, with the backoff above and across Endpoints, until an
	// appliance acknowledges it: a restart or failover of the appliance loses no report.
	ReportFor time.Duration
	// ResumeFor bounds how long a broken image stream keeps trying to resume (backoff
	// RetryBase..RetryMax, across Endpoints) before the write step fails.
	ResumeFor time.Duration
	// Endpoints are further appliance URLs (other nodes of the site cluster) tried in turn
	// when the current one does not answer; the appliance adds its own list in every
	// Task (agentapi.Task.Endpoints). URL is always the first.
	Endpoints []string
	// IPMIDevice is the in-band IPMI device for the BMC address ("/dev/ipmi0" when empty).
	IPMIDevice string
	// StallTimeout: an image stream that delivers no byte for this long is dropped and
	// resumed (counts against MaxResumes).
	StallTimeout time.Duration
	// StageSize is the cidata partition size in bytes.
	StageSize int64
	// ReadTestBytes is how much the check step reads for the speed test.
	ReadTestBytes int64
	// NodeSize is the kiln-node partition size in bytes of a layered build (DefaultNodeSize).
	NodeSize int64
	// LookPath finds the environment's tools (veritysetup, mkfs.ext4); nil = exec.LookPath.
	LookPath func(string) (string, error)
	// TempDir holds the per-node tree while stage builds it ("" = os.TempDir(), RAM in
	// the environment).
	TempDir string

	// OpenTPM opens the TPM for the attest step (attest.go); nil = OpenTPM
	// (the machine's own; tests pass a software TPM).
	OpenTPM func() (*attest.TPM, error)

	erase  eraseHooks  // tests: fault injection into the erase (erase.go)
	burnIn burnInHooks // tests: fault injection into the burn-in (burnin.go)
	// pageCacheIO (benchmarks): the I/O of the agent before issue 15 — image writes
	// through the page cache, the read-back reading and hashing in turn — to compare with.
	pageCacheIO bool
}

// Agent runs the protocol of agentapi against the appliance: the node of URL, or another
// of Endpoints while that one does not answer.
type Agent struct {
	cfg Config
	log *slog.Logger
	mu  sync.Mutex // serialises console lines

	epMu sync.Mutex
	eps  []string // URL first, then Config.Endpoints and Task.Endpoints, no duplicates
	cur  int      // index in eps of the endpoint in use

	attempt atomic.Int64 // agentapi.Task.Attempt of the task being carried out
}

// New returns an Agent with defaults filled in.
func New(cfg Config) (*Agent, error) {
	if cfg.URL == "" || cfg.MachineID == "" {
		return nil, fmt.Errorf("%w: %s and %s are required", ErrBadTask, agentapi.ArgURL, agentapi.ArgMachine)
	}
	cfg.URL = strings.TrimRight(cfg.URL, "/")
	if cfg.HTTP == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.ResponseHeaderTimeout = DefaultHTTPTimeout
		tr.Proxy = nil // the appliance is on the provisioning LAN
		cfg.HTTP = &http.Client{Transport: tr}
	}
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.Console == nil {
		cfg.Console = io.Discard
	}
	if cfg.ListDisks == nil {
		root := cfg.Root
		cfg.ListDisks = func() ([]agentapi.Disk, error) { return listDisksWithHealth(root) }
	}
	if cfg.Reboot == nil {
		cfg.Reboot = SysReboot
	}
	if cfg.Retries <= 0 {
		cfg.Retries = DefaultRetries
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = DefaultRetryBase
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = DefaultRetryMax
	}
	if cfg.MaxResumes <= 0 {
		cfg.MaxResumes = DefaultMaxResumes
	}
	if cfg.IPMIDevice == "" {
		cfg.IPMIDevice = "/dev/ipmi0"
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = DefaultStallTimeout
	}
	if cfg.StageSize <= 0 {
		cfg.StageSize = DefaultStageSize
	}
	if cfg.ReadTestBytes <= 0 {
		cfg.ReadTestBytes = DefaultReadTestBytes
	}
	if cfg.NodeSize <= 0 {
		cfg.NodeSize = DefaultNodeSize
	}
	if cfg.ReportFor <= 0 {
		cfg.ReportFor = DefaultReportFor
	}
	if cfg.ResumeFor <= 0 {
		cfg.ResumeFor = DefaultResumeFor
	}
	a := &Agent{cfg: cfg, log: slog.New(slog.DiscardHandler), eps: []string{cfg.URL}}
	a.addEndpoints(cfg.Endpoints)
	return a, nil
}

// addEndpoints appends the appliance URLs not yet known (trailing "/" dropped; only
// http and https URLs).
func (a *Agent) addEndpoints(urls []string) {
	a.epMu.Lock()
	defer a.epMu.Unlock()
next:
	for _, u := range urls {
		u = strings.TrimRight(u, "/")
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			continue
		}
		for _, e := range a.eps {
			if e == u {
				continue next
			}
		}
		a.eps = append(a.eps, u)
	}
}

// endpoint returns the appliance URL in use.
func (a *Agent) endpoint() string {
	a.epMu.Lock()
	defer a.epMu.Unlock()
	return a.eps[a.cur]
}

// failover moves on to the next known appliance URL after from failed (no-op when another
// call has already moved on, or there is only one).
func (a *Agent) failover(from string) {
	a.epMu.Lock()
	defer a.epMu.Unlock()
	if len(a.eps) > 1 && a.eps[a.cur] == from {
		a.cur = (a.cur + 1) % len(a.eps)
		a.log.Info("appliance not answering; trying another node", "from", from, "to", a.eps[a.cur])
	}
}

// endpoints returns the known appliance URLs, the one in use first.
func (a *Agent) endpoints() []string {
	a.epMu.Lock()
	defer a.epMu.Unlock()
	out := make([]string, 0, len(a.eps))
	for i := range a.eps {
		out = append(out, a.eps[(a.cur+i)%len(a.eps)])
	}
	return out
}

func (a *Agent) say(format string, args ...any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	fmt.Fprintf(a.cfg.Console, "kiln-agent: "+format+"\n", args...)
}

// call does one JSON request with Retries attempts and exponential backoff. out may be nil.
func (a *Agent) call(ctx context.Context, method, path string, in, out any) error {
	return a.callUntil(ctx, method, path, in, out, time.Time{})
}

// callUntil is call that, after its Retries attempts, keeps retrying (backoff capped at
// RetryMax) until the deadline until. Each failed attempt that did not reach a working
// appliance (transport error, 5xx, 408, 429) moves on to the next known endpoint. A 4xx
// answer is final.
func (a *Agent) callUntil(ctx context.Context, method, path string, in, out any, until time.Time) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	delay := a.cfg.RetryBase
	var last error
	for i := 0; i < a.cfg.Retries || time.Now().Before(until); i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(delay):
			}
			delay = min(2*delay, a.cfg.RetryMax)
		}
		base := a.endpoint()
		last = a.callOnce(ctx, base, method, path, body, out)
		if last == nil || ctx.Err() != nil {
			return last
		}
		var perm permanentError
		if errors.As(last, &perm) {
			return last
		}
		a.failover(base)
	}
	return fmt.Errorf("%w: %s %s: %v", ErrAppliance, method, path, last)
}

type permanentError struct{ error }

func (a *Agent) callOnce(ctx context.Context, base, method, path string, body []byte, out any) error {
	cctx, cancel := context.WithTimeout(ctx, DefaultHTTPTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, method, base+path, bytes.NewReader(body))
	if err != nil {
		return permanentError{err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+a.cfg.Token)
	}
	// The appliance checks the per-boot token against this machine (agentapi.HeaderMachine).
	req.Header.Set(agentapi.HeaderMachine, a.cfg.MachineID)
	resp, err := a.cfg.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		err := fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
		if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusRequestTimeout {
			return permanentError{err}
		}
		return err
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out); err != nil {
		return err
	}
	if t, ok := out.(*agentapi.Task); ok {
		a.addEndpoints(t.Endpoints)
	}
	return nil
}

// report sends one step report, retried until an appliance acknowledges it or ReportFor
// has passed (a restart or failover of the appliance loses no report). The report
// carries the attempt of the task it belongs to (attempt): the appliance ignores reports
// of an older attempt. Message is truncated to agentapi.MaxMessageLen.
func (a *Agent) report(ctx context.Context, r agentapi.Report) error {
	r.MachineID = a.cfg.MachineID
	if r.Attempt == 0 {
		r.Attempt = int(a.attempt.Load())
	}
	r.Message = sanitize(r.Message)
	switch r.State {
	case agentapi.StateFailed:
		a.say("step %s failed: %s: %s", r.Step, r.Reason, r.Message)
	case agentapi.StateSucceeded:
		a.say("step %s done %s", r.Step, r.Message)
	case agentapi.StateStarted:
		a.say("step %s started", r.Step)
	}
	return a.callUntil(ctx, http.MethodPost, "/v1/agent/report", r, nil, time.Now().Add(a.cfg.ReportFor))
}

// heartbeat sends one running report, once: a lost heartbeat is superseded by the next,
// and retrying it could deliver it after the step's end.
func (a *Agent) heartbeat(ctx context.Context, r agentapi.Report) {
	r.MachineID = a.cfg.MachineID
	r.Attempt = int(a.attempt.Load())
	body, err := json.Marshal(r)
	if err != nil {
		return
	}
	base := a.endpoint()
	if err := a.callOnce(ctx, base, http.MethodPost, "/v1/agent/report", body, nil); err != nil {
		var perm permanentError
		if !errors.As(err, &perm) && ctx.Err() == nil {
			a.failover(base)
		}
	}
}

// progress tracks one long step: heartbeat reports every interval and console lines at
// every 10% boundary.
type progress struct {
	a        *Agent
	step     string
	frac     atomic.Uint64 // progress in per-mille (0..1000)
	lastTen  atomic.Int64
	label    atomic.Pointer[string] // what the heartbeat's message names before the percentage
	stop     chan struct{}
	done     chan struct{}
	interval time.Duration
}

func (a *Agent) startProgress(ctx context.Context, step string, interval time.Duration) *progress {
	if interval <= 0 {
		interval = DefaultHeartbeat
	}
	p := &progress{a: a, step: step, stop: make(chan struct{}), done: make(chan struct{}), interval: interval}
	p.lastTen.Store(-1)
	go func() {
		defer close(p.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				pm := p.frac.Load()
				msg := fmt.Sprintf("%d%%", pm/10)
				if l := p.label.Load(); l != nil {
					msg = *l + " " + msg
				}
				a.heartbeat(ctx, agentapi.Report{Step: step, State: agentapi.StateRunning, Progress: float64(pm) / 1000,
					Message: msg})
			}
		}
	}()
	return p
}

func (p *progress) set(f float64) {
	if f < 0 {
		f = 0
	}
	if f > 1 {
		f = 1
	}
	pm := uint64(f * 1000)
	p.frac.Store(pm)
	ten := int64(pm / 100)
	if old := p.lastTen.Load(); ten > old && p.lastTen.CompareAndSwap(old, ten) {
		p.a.say("step %s %d%%", p.step, ten*10)
	}
}

// setLabel makes the heartbeats name s (the burn-in's test) before the percentage.
func (p *progress) setLabel(s string) { p.label.Store(&s) }

func (p *progress) end() {
	close(p.stop)
	<-p.done
}

// Run registers (sending the inventory), then polls for tasks and carries them out until
// ctx ends or a provision/poweroff task ends in Config.Reboot. An inspect task that answers
// a poll runs the inspection again (Inspect); one that answers the registration that has
// just sent the inventory means the inspection is done, and the agent waits. Appliance
// errors after all retries are retried again after PollAfter; Run only returns on ctx end
// or reboot.
func (a *Agent) Run(ctx context.Context, log *slog.Logger) error {
	a.log = log.With("component", "agent")
	inv := a.collect()
	var task agentapi.Task
	for {
		err := a.call(ctx, http.MethodPost, "/v1/agent/register", agentapi.Registration{
			MachineID: a.cfg.MachineID, AgentVersion: Version, Inventory: inv}, &task)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		a.say("register failed: %v", err)
		if !sleepCtx(ctx, DefaultPollAfter) {
			return ctx.Err()
		}
	}
	a.say("registered with %s", a.endpoint())
	registered := true // task answers a registration that has just sent the inventory
	for {
		a.say("task %s", task.Action)
		switch task.Action {
		case agentapi.ActionProvision:
			a.attempt.Store(int64(task.Attempt))
			written, err := a.Provision(ctx, &task)
			if err == nil {
				_ = a.report(ctx, agentapi.Report{Step: agentapi.StepReboot, State: agentapi.StateStarted})
				a.say("provisioned %s sha256=%s; rebooting=%v", written["disk"], written["sha256"], task.Reboot)
				return a.cfg.Reboot(task.Reboot)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		case agentapi.ActionErase:
			_ = a.Erase(ctx, &task)
		case agentapi.ActionInspect:
			if task.BurnIn != nil {
				_ = a.BurnIn(ctx, &task) // on the inventory just sent (burnin.go)
				break
			}
			if registered {
				break // the inventory just sent is the inspection
			}
			next, err := a.Inspect(ctx)
			if err == nil {
				task = next
				continue // registered again: next answers it
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		case agentapi.ActionPowerOff:
			a.say("powering off")
			return a.cfg.Reboot(false)
		}
		registered = false
		poll := task.PollAfter
		if poll <= 0 {
			poll = DefaultPollAfter
		}
		if task.Action != agentapi.ActionWait && task.Action != agentapi.ActionInspect {
			poll = min(poll, time.Second)
		}
		if !sleepCtx(ctx, poll) {
			return ctx.Err()
		}
		var next agentapi.Task
		if err := a.call(ctx, http.MethodGet, "/v1/agent/task", nil, &next); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			a.say("poll failed: %v", err)
			task = agentapi.Task{Action: agentapi.ActionWait, PollAfter: poll}
			continue
		}
		task = next
	}
}

// collect gathers the inventory the agent registers with: inventory.Collect(Root) (a
// partial inventory is sent as it is, with a warning), the disks from ListDisks, and the
// BMC's address read in-band when the inventory has none.
func (a *Agent) collect() agentapi.Inventory {
	inv, err := inventory.Collect(a.cfg.Root)
	if err != nil {
		a.log.Warn("inventory incomplete", "err", err)
	}
	if disks, derr := a.cfg.ListDisks(); derr == nil {
		inv.Disks = disks
	}
	if inv.BMCAddress == "" {
		ip, err := BMCAddress(a.cfg.IPMIDevice, 2*time.Second)
		if err != nil {
			a.say("bmc: not visible in-band: %v", err)
		} else {
			a.say("bmc: %s", ip)
		}
		inv.BMCAddress = ip
	}
	tpm := "none"
	if inv.TPM != nil {
		tpm = inv.TPM.Version
	}
	a.say("machine %s: %d CPUs, %d MiB, %d disks, %d NICs, %d PCI functions, %d CPU flags, TPM %s", a.cfg.MachineID, inv.CPUs, inv.MemoryBytes>>20,
		len(inv.Disks), len(inv.NICs), len(inv.PCI), len(inv.CPUFlags), tpm)
	return inv
}

// Inspect runs the inspection again in the running agent (an inspect task from a poll:
// the operator asked to re-inspect, or an erase must be followed by inspection). It
// reports step inspect started, collects the inventory anew (collect) and sends it with
// POST /v1/agent/register: the appliance records it, compares it with the machine's
// intended hardware, marks step inspect succeeded and moves the machine to available or
// quarantined. The registration's answer is the next task. A registration refused or
// unanswered after the retries is reported as step inspect failed (internal_error) and
// returned: a *StepError wrapping ErrAppliance or the appliance's refusal.
func (a *Agent) Inspect(ctx context.Context) (agentapi.Task, error) {
	_ = a.report(ctx, agentapi.Report{Step: agentapi.StepInspect, State: agentapi.StateStarted})
	inv := a.collect()
	var next agentapi.Task
	err := a.call(ctx, http.MethodPost, "/v1/agent/register", agentapi.Registration{
		MachineID: a.cfg.MachineID, AgentVersion: Version, Inventory: inv}, &next)
	if err != nil {
		se := &StepError{Step: agentapi.StepInspect, Reason: agentapi.ReasonInternal, Err: fmt.Errorf("send inventory: %w", err)}
		if ctx.Err() != nil {
			se.Reason = agentapi.ReasonTimeout
		}
		_ = a.report(ctx, agentapi.Report{Step: agentapi.StepInspect, State: agentapi.StateFailed, Reason: se.Reason, Message: se.Err.Error()})
		return agentapi.Task{}, se
	}
	a.say("step %s done: %d CPUs, %d disks, %d NICs sent", agentapi.StepInspect, inv.CPUs, len(inv.Disks), len(inv.NICs))
	return next, nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// step runs fn between a started report and a succeeded/failed one. fn's *StepError gives
// the reason; any other error is internal_error.
func (a *Agent) step(ctx context.Context, name string, fn func() (string, error)) error {
	_ = a.report(ctx, agentapi.Report{Step: name, State: agentapi.StateStarted})
	msg, err := fn()
	if err != nil {
		var se *StepError
		if !errors.As(err, &se) {
			se = &StepError{Step: name, Reason: agentapi.ReasonInternal, Err: err}
		}
		if ctx.Err() != nil {
			se.Reason = agentapi.ReasonTimeout
		}
		_ = a.report(ctx, agentapi.Report{Step: name, State: agentapi.StateFailed, Reason: se.Reason, Message: se.Err.Error()})
		return se
	}
	_ = a.report(ctx, agentapi.Report{Step: name, State: agentapi.StateSucceeded, Progress: 1, Message: msg})
	return nil
}

// SelectDisk applies the rule: Serial, else WWN (exact match), else the smallest
// non-removable disk of at least MinSizeBytes. Never "the first disk".
func SelectDisk(disks []agentapi.Disk, rule agentapi.DiskRule) (agentapi.Disk, error) {
	switch {
	case rule.Serial != "":
		for _, d := range disks {
			if d.Serial == rule.Serial {
				return d, nil
			}
		}
		return agentapi.Disk{}, fail(agentapi.StepCheck, agentapi.ReasonDiskNotFound, "no disk with serial %q", rule.Serial)
	case rule.WWN != "":
		for _, d := range disks {
			if strings.EqualFold(d.WWN, rule.WWN) {
				return d, nil
			}
		}
		return agentapi.Disk{}, fail(agentapi.StepCheck, agentapi.ReasonDiskNotFound, "no disk with WWN %q", rule.WWN)
	}
	var best *agentapi.Disk
	for i := range disks {
		d := &disks[i]
		if d.Removable || d.SizeBytes < rule.MinSizeBytes {
			continue
		}
		if best == nil || d.SizeBytes < best.SizeBytes || (d.SizeBytes == best.SizeBytes && d.Name < best.Name) {
			best = d
		}
	}
	if best == nil {
		return agentapi.Disk{}, fail(agentapi.StepCheck, agentapi.ReasonDiskNotFound, "no non-removable disk of at least %d bytes", rule.MinSizeBytes)
	}
	return *best, nil
}

// Provision runs check → attest (when task.Attest) → write → verify → stage → finalize
// for task and returns the finalize record (also sent as Report.Written). Errors are
// *StepError. A task with Layers is a layered build (layers.go); without, one image plus
// the cidata partition. A failure once the write has begun clears the partition table
// before it is reported (ClearPartitionTable).
func (a *Agent) Provision(ctx context.Context, task *agentapi.Task) (map[string]string, error) {
	if len(task.Layers) > 0 {
		return a.provisionLayers(ctx, task)
	}
	img := task.Image
	if img == nil || img.URL == "" || len(img.SHA256) != 64 || img.Size == 0 {
		err := fail(agentapi.StepCheck, agentapi.ReasonInternal, "%v: task needs image url, sha256 and size", ErrBadTask)
		_ = a.report(ctx, agentapi.Report{Step: agentapi.StepCheck, State: agentapi.StateFailed, Reason: err.Reason, Message: err.Err.Error()})
		return nil, err
	}
	want := strings.ToLower(img.SHA256)
	var disk agentapi.Disk
	var dev *Device
	defer func() {
		if dev != nil {
			dev.Close()
		}
	}()

	// check
	err := a.step(ctx, agentapi.StepCheck, func() (string, error) {
		disks, err := a.cfg.ListDisks()
		if err != nil {
			return "", fail(agentapi.StepCheck, agentapi.ReasonDiskNotFound, "list disks: %v", err)
		}
		if disk, err = SelectDisk(disks, task.Disk); err != nil {
			return "", err
		}
		need := int64(img.Size)
		if task.Stage != nil {
			need = alignUp(need, stageAlign) + a.cfg.StageSize + stageAlign // + backup GPT room
		}
		if dev, err = OpenDevice(disk.Path); err != nil {
			return "", fail(agentapi.StepCheck, agentapi.ReasonDiskNotFound, "open %s: %v", disk.Path, err)
		}
		if dev.Size < need {
			return "", fail(agentapi.StepCheck, agentapi.ReasonDiskTooSmall, "%s has %d bytes, image and stage need %d", disk.Path, dev.Size, need)
		}
		mbps, err := a.checkDisk(&disk, dev, task)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("disk %s (%s) %d bytes health %s read %.0f MB/s", disk.Path, disk.Name, dev.Size, disk.Health, mbps), nil
	})
	if err != nil {
		return nil, err
	}

	if task.Attest {
		// attest (issue 16): the measured boot is proved before anything is
		// written; the claim's credentials come with the pass.
		var creds *agentapi.StageCredentials
		if err := a.step(ctx, agentapi.StepAttest, func() (msg string, err error) {
			msg, creds, err = a.Attest(ctx)
			return msg, err
		}); err != nil {
			return nil, err
		}
		if creds != nil && task.Stage != nil {
			t2, st := *task, *task.Stage
			st.JoinData, st.CABundle = creds.JoinData, creds.CABundle
			t2.Stage = &st
			task = &t2
		}
	}

	var streamCRC uint32
	var writeSecs float64
	writeOnce := func() error {
		return a.stepClearing(ctx, agentapi.StepWrite, dev, int64(img.Size), func() (string, error) {
			crc, secs, resumed, err := a.writeImage(ctx, img, task.Heartbeat, dev, 0)
			if err != nil {
				return "", err
			}
			streamCRC, writeSecs = crc, secs
			return fmt.Sprintf("%d bytes in %.1fs (%.1f MB/s), %d resumptions", img.Size, secs, float64(img.Size)/1e6/secs, resumed), nil
		})
	}
	verifyOnce := func(attempt int) error {
		return a.stepClearing(ctx, agentapi.StepVerify, dev, int64(img.Size), func() (string, error) {
			got, crc, err := a.readBack(ctx, agentapi.StepVerify, task.Heartbeat, dev, 0, int64(img.Size), nil)
			if err != nil {
				return "", fail(agentapi.StepVerify, agentapi.ReasonWriteFailed, "read back: %v", err)
			}
			if err := judgeReadBack("image", got, want, crc, streamCRC, attempt); err != nil {
				return "", err
			}
			return "sha256 " + got, nil
		})
	}
	// One rewrite on mismatch, then the failure stands.
	for attempt := 0; ; attempt++ {
		if err := writeOnce(); err != nil {
			return nil, err
		}
		err := verifyOnce(attempt)
		if err == nil {
			break
		}
		var se *StepError
		if attempt >= 1 || !errors.As(err, &se) || (se.Reason != agentapi.ReasonDigestMismatch && se.Reason != agentapi.ReasonVerifyMismatch) {
			return nil, err
		}
		a.say("verify mismatch; rewriting once")
	}

	written := map[string]string{
		"disk":              disk.Path,
		"disk_name":         disk.Name,
		"bytes":             strconv.FormatUint(img.Size, 10),
		"sha256":            want,
		"sector_size":       strconv.Itoa(dev.SectorSize),
		"write_seconds":     strconv.FormatFloat(writeSecs, 'f', 3, 64),
		"write_bytes_per_s": strconv.FormatFloat(float64(img.Size)/writeSecs, 'f', 0, 64),
	}
	if task.Stage != nil {
		err = a.stepClearing(ctx, agentapi.StepStage, dev, int64(img.Size), func() (string, error) {
			info, hk, err := a.stage(task, dev)
			if err != nil {
				return "", fail(agentapi.StepStage, agentapi.ReasonStageFailed, "%v", err)
			}
			written["stage_scheme"] = info.Scheme
			written["stage_partition"] = strconv.Itoa(info.Index)
			written["cidata_offset_bytes"] = strconv.FormatInt(info.Start, 10)
			written["cidata_size_bytes"] = strconv.FormatInt(info.Size, 10)
			written["stage_changed_sectors"] = joinInts(info.Changed)
			written["ssh_host_ed25519_pub"] = hk.Public
			return fmt.Sprintf("cidata partition %d (%s) at %d, changed image sectors [%s]", info.Index, info.Scheme, info.Start, joinInts(info.Changed)), nil
		})
		if err != nil {
			return nil, err
		}
	}
	_ = a.report(ctx, agentapi.Report{Step: agentapi.StepFinalize, State: agentapi.StateStarted})
	if err := dev.Sync(); err != nil {
		se := fail(agentapi.StepFinalize, agentapi.ReasonWriteFailed, "sync: %v", err)
		if cerr := ClearPartitionTable(dev, int64(img.Size)); cerr == nil {
			se.Err = fmt.Errorf("%w; partition table cleared", se.Err)
		}
		_ = a.report(ctx, agentapi.Report{Step: agentapi.StepFinalize, State: agentapi.StateFailed, Reason: se.Reason, Message: se.Err.Error()})
		return nil, se
	}
	_ = dev.RereadPartitions()
	if err := a.report(ctx, agentapi.Report{Step: agentapi.StepFinalize, State: agentapi.StateSucceeded, Progress: 1, Written: written}); err != nil {
		return nil, fail(agentapi.StepFinalize, agentapi.ReasonInternal, "report finalize: %v", err)
	}
	return written, nil
}

func joinInts(v []int64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.FormatInt(x, 10)
	}
	return strings.Join(s, ",")
}

// wipeSignatures zeroes the first and last MiB (partition tables, GPT backup, most FS
// superblocks) and discards the rest where supported.
func (a *Agent) wipeSignatures(dev *Device) error {
	n := min(int64(eraseCheckBytes), dev.Size)
	if err := zeroRange(dev, 0, n); err != nil {
		return err
	}
	if err := zeroRange(dev, dev.Size-n, n); err != nil {
		return err
	}
	// Superblocks of btrfs (64 KiB) and ISO (32 KiB) lie inside the first MiB.
	return dev.Sync()
}

// streamTable is CRC-32C (Castagnoli, RFC 3720 appendix B.4), the write's checksum of
// the stream (SSE4.2 CRC32 on amd64, also under TCG).
var streamTable = crc32.MakeTable(crc32.Castagnoli)

// writeImage streams img to dev at byte offset base, checksumming the decompressed bytes
// with CRC-32C. It returns that checksum, the seconds spent and the resumptions used.
//
// The pinned SHA-256 is checked once, by verify, over what the disk reads back (the
// stronger check: the medium holds the image). The stream's CRC-32C only tells verify,
// when that digest is wrong, whether the disk holds exactly what was served (the served
// image is wrong: digest_mismatch) or not (the write or the medium is: verify_mismatch).
// Under TCG the stream's SHA-256 was the write's slowest stage by far (10.3 of 10.6 s
// for 96 MiB: TestBenchAgentWrite's busy_s), and it was computed again by verify.
func (a *Agent) writeImage(ctx context.Context, img *agentapi.ImageRef, heartbeat time.Duration, dev *Device, base int64) (uint32, float64, int, error) {
	p := a.startProgress(ctx, agentapi.StepWrite, heartbeat)
	defer p.end()
	rr := &rangeReader{ctx: ctx, client: a.cfg.HTTP, url: img.URL, urls: a.imageURLs(img.URL), token: a.cfg.Token, total: -1,
		maxResumes: a.cfg.MaxResumes, openTries: a.cfg.Retries, backoff: a.cfg.RetryBase, backoffMax: a.cfg.RetryMax,
		resumeFor: a.cfg.ResumeFor, stall: a.cfg.StallTimeout}
	defer rr.Close()
	start := time.Now()
	if err := rr.openFirst(); err != nil {
		return 0, 0, 0, fail(agentapi.StepWrite, agentapi.ReasonImageFetchFailed, "%v", err)
	}
	src, closeSrc, err := decompress(img.Format, rr)
	if err != nil {
		return 0, 0, 0, fail(agentapi.StepWrite, agentapi.ReasonImageFetchFailed, "%v", err)
	}
	defer closeSrc()
	// Pipeline: this goroutine reads (network + decoder) into a ring of buffers; writer
	// goroutines write each buffer to the device and another checksums it, so the time is
	// the slowest of the three instead of their sum.
	type chunk struct {
		buf  []byte
		off  int64
		refs atomic.Int32
	}
	const nbuf = 6
	free := make(chan []byte, nbuf)
	for i := 0; i < nbuf; i++ {
		free <- alignedBuf(writeBufSize) // O_DIRECT wants aligned memory
	}
	// Whole aligned blocks go to the device with O_DIRECT: no copy into the page cache
	// (under TCG that copy costs as much as the hash) and no writeback at the fsync. A
	// target that refuses O_DIRECT (tmpfs), Config.pageCacheIO, and the unaligned tail
	// of the last chunk use the ordinary descriptor; the final fsync covers both.
	var direct *os.File
	if !a.cfg.pageCacheIO {
		if f, err := os.OpenFile(dev.Path, os.O_WRONLY|unix.O_DIRECT, 0); err == nil {
			direct = f
			defer direct.Close()
		}
	}
	writeAt := func(b []byte, off int64) error {
		if direct != nil && off%directAlign == 0 {
			if n := len(b) &^ (directAlign - 1); n > 0 {
				if _, err := direct.WriteAt(b[:n], off); err != nil {
					return err
				}
				b, off = b[n:], off+int64(n)
			}
		}
		if len(b) > 0 {
			_, err := dev.WriteAt(b, off)
			return err
		}
		return nil
	}
	release := func(c *chunk) {
		if c.refs.Add(-1) == 0 {
			free <- c.buf[:cap(c.buf)]
		}
	}
	writeCh, hashCh := make(chan *chunk, nbuf), make(chan *chunk, nbuf)
	// With O_DIRECT each pwrite waits for the device: writers keep that many writes in
	// flight (a buffered write only copies, so one writer suffices).
	writers := 1
	if direct != nil {
		writers = directWriters
	}
	var werrMu sync.Mutex
	var werr error
	var wg sync.WaitGroup
	// Busy time of each stage (nanoseconds), said at the end: the slowest
	// stage is what a faster write would have to change.
	var readNs, hashNs, devNs atomic.Int64
	wg.Add(1 + writers)
	for w := 0; w < writers; w++ {
		go func() {
			defer wg.Done()
			for c := range writeCh {
				werrMu.Lock()
				failed := werr != nil
				werrMu.Unlock()
				if !failed {
					t0 := time.Now()
					err := writeAt(c.buf, base+c.off)
					devNs.Add(int64(time.Since(t0)))
					if err != nil {
						werrMu.Lock()
						if werr == nil {
							werr = fmt.Errorf("write %s at %d: %w", dev.Path, c.off, err)
						}
						werrMu.Unlock()
					}
				}
				release(c)
			}
		}()
	}
	var crc uint32
	go func() {
		defer wg.Done()
		for c := range hashCh {
			t0 := time.Now()
			crc = crc32.Update(crc, streamTable, c.buf)
			hashNs.Add(int64(time.Since(t0)))
			release(c)
		}
	}()
	var off int64
	size := int64(img.Size)
	var rerr error
	for {
		buf := <-free
		t0 := time.Now()
		n, err := io.ReadFull(src, buf)
		readNs.Add(int64(time.Since(t0)))
		if n > 0 {
			if off+int64(n) > size {
				free <- buf
				rerr = fail(agentapi.StepWrite, agentapi.ReasonDigestMismatch, "image longer than its declared %d bytes", size)
				break
			}
			c := &chunk{buf: buf[:n], off: off}
			c.refs.Store(2)
			writeCh <- c
			hashCh <- c
			off += int64(n)
			p.set(float64(off) / float64(size))
		} else {
			free <- buf
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			if errors.Is(err, ErrFetch) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				rerr = fail(agentapi.StepWrite, agentapi.ReasonImageFetchFailed, "%v", err)
			} else {
				rerr = fail(agentapi.StepWrite, agentapi.ReasonImageFetchFailed, "decode %s image: %v", img.Format, err)
			}
			break
		}
	}
	close(writeCh)
	close(hashCh)
	wg.Wait()
	if rerr != nil {
		return 0, 0, rr.Resumed, rerr
	}
	if werr != nil {
		return 0, 0, rr.Resumed, fail(agentapi.StepWrite, agentapi.ReasonWriteFailed, "%v", werr)
	}
	if off != size {
		return 0, 0, rr.Resumed, fail(agentapi.StepWrite, agentapi.ReasonImageFetchFailed, "image ended at %d of %d bytes", off, size)
	}
	t0 := time.Now()
	if err := dev.Sync(); err != nil {
		return 0, 0, rr.Resumed, fail(agentapi.StepWrite, agentapi.ReasonWriteFailed, "sync %s: %v", dev.Path, err)
	}
	secs := time.Since(start).Seconds()
	a.say("write pipeline: %.1f s; busy: fetch+decode %.1f s, crc32c %.1f s, device %.1f s over %d writers, final sync %.1f s",
		secs, time.Duration(readNs.Load()).Seconds(), time.Duration(hashNs.Load()).Seconds(),
		time.Duration(devNs.Load()).Seconds(), writers, time.Since(t0).Seconds())
	return crc, secs, rr.Resumed, nil
}

// judgeReadBack is verify's decision for one written range (what: "image" or "layer
// NAME"): its read-back SHA-256 got against the pinned want, and when they differ, the
// read-back's CRC-32C against the stream's. Equal checksums: the disk holds exactly
// what was served, so the served bytes are wrong (digest_mismatch). Different: the disk
// does not hold what was written (verify_mismatch on the first attempt; on a later one,
// after a rewrite, digest_mismatch). A corrupted read-back that still matched the
// stream's CRC-32C (odds 2^-32) would be reported as a served-image fault; it fails
// either way. It returns nil when got is want.
func judgeReadBack(what, got, want string, crc, streamCRC uint32, attempt int) error {
	switch {
	case got == want:
		return nil
	case crc == streamCRC:
		return fail(agentapi.StepVerify, agentapi.ReasonDigestMismatch, "served %s sha256 %s, want %s: the disk holds exactly the stream (crc32c %08x) (attempt %d)", what, got, want, crc, attempt+1)
	case attempt == 0:
		return fail(agentapi.StepVerify, agentapi.ReasonVerifyMismatch, "%s reads back sha256 %s, want %s; crc32c %08x, the stream's %08x", what, got, want, crc, streamCRC)
	}
	return fail(agentapi.StepVerify, agentapi.ReasonDigestMismatch, "%s reads back sha256 %s, want %s; crc32c %08x, the stream's %08x (attempt %d)", what, got, want, crc, streamCRC, attempt+1)
}

// imageURLs returns u and, when u lies under a known appliance URL, the same path under
// every other known one (each node of the site cluster serves every image by name).
func (a *Agent) imageURLs(u string) []string {
	eps := a.endpoints()
	for _, e := range eps {
		rest, ok := strings.CutPrefix(u, e)
		if !ok || (rest != "" && rest[0] != '/') {
			continue
		}
		out := []string{u}
		for _, o := range eps {
			if o != e {
				out = append(out, o+rest)
			}
		}
		return out
	}
	return []string{u}
}

// readBack re-reads (progress reported as step) [start, start+size) of dev with O_DIRECT and returns its SHA-256
// hex and its CRC-32C (streamTable, to compare with writeImage's). orig (may be nil) maps logical blocks (of dev.SectorSize bytes, numbered from the
// disk's start) to the contents they had before stage changed them: those blocks are
// hashed as they were, so the image range still hashes to the image's digest.
func (a *Agent) readBack(ctx context.Context, step string, heartbeat time.Duration, dev *Device, start, size int64, orig map[int64][]byte) (string, uint32, error) {
	p := a.startProgress(ctx, step, heartbeat)
	defer p.end()
	f, err := openDirect(dev.Path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	// Two buffers: one goroutine reads the next while this one hashes the last, so the
	// step takes max(read, hash) rather than their sum.
	type block struct {
		buf    []byte
		off, n int64
		err    error
	}
	free := make(chan []byte, 2)
	free <- alignedBuf(writeBufSize)
	if !a.cfg.pageCacheIO { // one buffer: read, then hash, in turn
		free <- alignedBuf(writeBufSize)
	}
	full := make(chan block, 2)
	done := make(chan struct{})
	defer close(done)
	go func() {
		defer close(full)
		for off := int64(0); off < size; {
			var buf []byte
			select {
			case buf = <-free:
			case <-done:
				return
			}
			n := min(int64(len(buf)), size-off)
			// O_DIRECT needs sector-multiple lengths: read a whole sector, hash the needed part.
			rn := alignUp(n, 4096)
			k, err := f.ReadAt(buf[:rn], start+off)
			b := block{buf: buf, off: off, n: n}
			if int64(k) < n {
				b.err = fmt.Errorf("read %s at %d: %d bytes: %v", dev.Path, start+off, k, err)
			}
			select {
			case full <- b:
			case <-done:
				return
			}
			if b.err != nil {
				return
			}
			off += n
		}
	}()
	h := sha256.New()
	var crc uint32
	lbs := int64(dev.SectorSize)
	var got int64
	for b := range full {
		if b.err != nil {
			return "", 0, b.err
		}
		if ctx.Err() != nil {
			return "", 0, ctx.Err()
		}
		for lba, o := range orig {
			if at := lba*lbs - (start + b.off); at >= 0 && at+int64(len(o)) <= b.n {
				copy(b.buf[at:], o)
			}
		}
		h.Write(b.buf[:b.n])
		crc = crc32.Update(crc, streamTable, b.buf[:b.n])
		got += b.n
		free <- b.buf
		p.set(float64(got) / float64(size))
	}
	if got != size {
		return "", 0, fmt.Errorf("read %s: %d of %d bytes", dev.Path, got, size)
	}
	return hex.EncodeToString(h.Sum(nil)), crc, nil
}

// stage appends the cidata partition and formats it (see parttable.go and fat.go).
func (a *Agent) stage(task *agentapi.Task, dev *Device) (PartInfo, HostKey, error) {
	hk, err := NewHostKey("host@" + task.Stage.Hostname)
	if err != nil {
		return PartInfo{}, hk, err
	}
	files, err := SeedFiles(task.Stage, hk)
	if err != nil {
		return PartInfo{}, hk, err
	}
	info, err := AppendPartition(dev, dev.Size, dev.SectorSize, int64(task.Image.Size), a.cfg.StageSize, "cidata")
	if err != nil {
		return info, hk, err
	}
	sum := sha256.Sum256([]byte(task.Stage.InstanceID))
	volID := uint32(sum[0]) | uint32(sum[1])<<8 | uint32(sum[2])<<16 | uint32(sum[3])<<24
	if err := MakeFAT16(dev, info.Start, info.Size, "CIDATA", volID, uint32(info.Start/512), files); err != nil {
		return info, hk, err
	}
	return info, hk, dev.Sync()
}

// SysReboot syncs file systems and calls reboot(2) with RB_AUTOBOOT or RB_POWER_OFF.
func SysReboot(reboot bool) error {
	return sysReboot(reboot)
}

// sanitize drops control characters and invalid UTF-8 and truncates to
// agentapi.MaxMessageLen bytes on a rune boundary.
func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "?") {
		if r < 0x20 || r == 0x7f {
			r = ' '
		}
		if b.Len()+utf8.RuneLen(r) > agentapi.MaxMessageLen {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// checkDisk is the check step's disk rules, shared by the plain and the
// layered build: health (an unreported one is recorded as not_reported in
// disk), the read-speed floor, and no foreign data unless the machine is
// marked for wipe (then its signatures are wiped). Returns the measured
// read speed in MB/s; errors are *StepError of StepCheck.
func (a *Agent) checkDisk(disk *agentapi.Disk, dev *Device, task *agentapi.Task) (float64, error) {
	if disk.Health == "failing" {
		return 0, fail(agentapi.StepCheck, agentapi.ReasonDiskUnhealthy, "%s reports failing health", disk.Path)
	}
	if disk.Health == "" {
		disk.Health = inventory.HealthNotReported
	}
	mbps, err := ReadTest(disk.Path, min(a.cfg.ReadTestBytes, dev.Size))
	if err != nil {
		return 0, fail(agentapi.StepCheck, agentapi.ReasonDiskUnhealthy, "read test on %s: %v", disk.Path, err)
	}
	if task.MinReadMBps > 0 && mbps < task.MinReadMBps {
		return 0, fail(agentapi.StepCheck, agentapi.ReasonDiskTooSlow, "%s reads %.1f MB/s, floor %.1f", disk.Path, mbps, task.MinReadMBps)
	}
	what, err := Foreign(dev, dev.SectorSize)
	if err != nil {
		return 0, fail(agentapi.StepCheck, agentapi.ReasonDiskUnhealthy, "read %s: %v", disk.Path, err)
	}
	if what != "" && !task.Wipe {
		return 0, fail(agentapi.StepCheck, agentapi.ReasonForeignOSPresent, "%s holds a %s and the machine is not marked for wipe", disk.Path, what)
	}
	if what != "" {
		if err := a.wipeSignatures(dev); err != nil {
			return 0, fail(agentapi.StepCheck, agentapi.ReasonWriteFailed, "wipe %s: %v", disk.Path, err)
		}
	}
	return mbps, nil
}
