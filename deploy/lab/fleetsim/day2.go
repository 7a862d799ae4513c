package fleetsim

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"kiln/deploy/lab/vbmc/vbmc"
)

// Day2Options is the day-2 phase of a run (issue 14): after the storm, all
// machines but Spares are claimed (POST /v1/machines/claim, role "worker",
// selector fleet=sim: the spares carry the same labels and the default
// class), then failures are injected through each BMC's health (vbmc's
// SetHealth: the system and its chassis Critical, an SEL entry, and they stay
// Critical, so Kiln's ladder climbs power_cycle → reinspect → reprovision →
// erase → rma):
//
//   - mode A: FailA claimed machines fail one by one, spread evenly over Hour
//     (the time-compressed hour); each must end rma with its claim built on a
//     spare, and the brake must stay released;
//   - mode B: FailB claimed machines fail at once; the brake must engage, and
//     through Observe after it no BMC action (a real request to the vbmc:
//     a Reset or a boot-override PATCH) and no transition of those machines.
type Day2Options struct {
	// Spares is how many machines stay unclaimed (default FailA + 2).
	Spares int `json:"spares"`
	// FailA and FailB are the failing machines of each mode (defaults 2 % and
	// 20 % of the claimed machines, at least 1 and 5).
	FailA int `json:"fail_a"`
	FailB int `json:"fail_b"`
	// Hour is the compressed hour mode A spreads its failures over (default 60 s).
	Hour time.Duration `json:"hour"`
	// Settle is Kiln's remediation.settle (default 2 s); BrakeWindow its
	// brake.window (default Hour/4: 15 min of the compressed hour);
	// HealthPoll its health.interval (default 2 s) with HealthWorkers
	// concurrent reads (default 16).
	Settle        time.Duration `json:"settle"`
	BrakeWindow   time.Duration `json:"brake_window"`
	HealthPoll    time.Duration `json:"health_poll"`
	HealthWorkers int           `json:"health_workers"`
	// Hold is Kiln's remediation.hold (default 2 × HealthPoll: a sweep of
	// the health poll; negative: 0, no hold).
	Hold time.Duration `json:"hold"`
	// Observe is how long mode B watches after the brake engaged (default
	// 3 × (HealthPoll + Settle) + 10 s: long enough for a ladder step).
	Observe time.Duration `json:"observe"`
	// Timeout bounds mode A from its first failure to its last replacement
	// (default Hour + 5 min).
	Timeout time.Duration `json:"timeout"`
	// FailMark, when set, is a file created right after mode A's first
	// machine was made Critical (the simulator runs in a child process:
	// a test polls for it to cut a WAN there, so that the remediation runs
	// while the site is cut off).
	FailMark string `json:"fail_mark,omitempty"`
}

func (d *Day2Options) defaults(n int) error {
	if d.Hour <= 0 {
		d.Hour = time.Minute
	}
	if d.Spares <= 0 {
		claimed := n - 2
		d.Spares = max(1, (claimed*2+99)/100) + 2
	}
	claimed := n - d.Spares
	if claimed < 5 {
		return fmt.Errorf("fleetsim: day 2: %d machines with %d spares leave %d claimed, want at least 5", n, d.Spares, claimed)
	}
	if d.FailA <= 0 {
		d.FailA = max(1, (claimed*2+50)/100)
	}
	if d.FailB <= 0 {
		d.FailB = max(5, (claimed*20+50)/100)
	}
	if d.FailA > d.Spares {
		return fmt.Errorf("fleetsim: day 2: %d failures in mode A but %d spares", d.FailA, d.Spares)
	}
	if d.FailB > claimed-d.FailA {
		return fmt.Errorf("fleetsim: day 2: %d failures in mode B of %d healthy claimed machines", d.FailB, claimed-d.FailA)
	}
	if d.Settle <= 0 {
		d.Settle = 2 * time.Second
	}
	if d.BrakeWindow <= 0 {
		d.BrakeWindow = d.Hour / 4
	}
	if d.HealthPoll <= 0 {
		d.HealthPoll = 2 * time.Second
	}
	if d.HealthWorkers <= 0 {
		d.HealthWorkers = 16
	}
	if d.Hold == 0 {
		d.Hold = 2 * d.HealthPoll
	} else if d.Hold < 0 {
		d.Hold = 0
	}
	if d.Observe <= 0 {
		d.Observe = 3*(d.HealthPoll+d.Settle) + 10*time.Second
	}
	if d.Timeout <= 0 {
		d.Timeout = d.Hour + 5*time.Minute
	}
	return nil
}

// Day2Result is what the day-2 phase measured.
type Day2Result struct {
	Claimed int `json:"claimed"`
	Spares  int `json:"spares"`
	// Mode A.
	AFailed, ARMA, ASparesProvisioned int
	AHourSeconds                      float64
	ASlowestReplacement               float64 // s from a failure to its spare provisioned
	ABrakeEngaged                     bool
	ABMCActions                       int    // BMC actions (Reset, boot PATCH) during mode A
	ALadder                           string // the first failed machine's transitions
	AEraseCertificates                int    // erase_certificate events in Kiln's log
	// Mode B.
	BFailed                int
	BBrakeEngaged          bool
	BBrakeScope, BBrakeKey string
	BBrakeAfter            float64 // s from the injection to the brake record's engaged_at
	BCounted               int     // failures the brake record counted
	BActionsBeforeBrake    int     // BMC actions between the injection and engaged_at
	BActionsAfterBrake     int
	BTransitionsAfter      int // transitions of the failed machines after engaged_at
	BObserveSeconds        float64
}

// Lines are the day-2 result lines.
func (d *Day2Result) Lines() []string {
	a := fmt.Sprintf("fleet: %d claimed; %d failed over 1h (compressed to %.0f s); %d rma, %d spares provisioned; slowest replacement %.1f s after failure",
		d.Claimed, d.AFailed, d.AHourSeconds, d.ARMA, d.ASparesProvisioned, d.ASlowestReplacement)
	if d.ABrakeEngaged {
		a += "; BRAKE ENGAGED"
	}
	b := fmt.Sprintf("fleet: %d of %d failed at once; ", d.BFailed, d.Claimed)
	if d.BBrakeEngaged {
		scope := d.BBrakeScope
		if d.BBrakeKey != "" {
			scope += " " + d.BBrakeKey
		}
		b += fmt.Sprintf("brake engaged (scope %s, %d failures counted) after %.1f s; BMC actions after brake %d; repaired behind brake %d",
			scope, d.BCounted, d.BBrakeAfter, d.BActionsAfterBrake, d.BTransitionsAfter)
	} else {
		b += "brake NOT engaged"
	}
	return []string{a, b, fmt.Sprintf("fleet: day 2: BMC actions in mode A %d, in mode B before the brake %d; mode B watched %.0f s after the brake; erase certificates %d; ladder of the first: %s",
		d.ABMCActions, d.BActionsBeforeBrake, d.BObserveSeconds, d.AEraseCertificates, d.ALadder)}
}

// bmcAction is one power or boot request a BMC served.
type bmcAction struct {
	at   time.Time
	what string
}

// actionLog counts the BMC actions the vbmc serves (vbmc.Config.OnRequest):
// POSTs to an Actions URI (ComputerSystem.Reset) and PATCHes of a system
// (the boot override). Reads (the health poll) and sessions are not actions.
type actionLog struct {
	mu  sync.Mutex
	all []bmcAction
}

func (l *actionLog) onRequest(r vbmc.Request) {
	isAction := (r.Method == "POST" && strings.Contains(r.Path, "/Actions/")) ||
		(r.Method == "PATCH" && strings.Contains(r.Path, "/Systems/"))
	if !isAction {
		return
	}
	l.mu.Lock()
	l.all = append(l.all, bmcAction{at: time.Now(), what: r.Method + " " + r.Path})
	l.mu.Unlock()
}

// between counts the actions in (from, to].
func (l *actionLog) between(from, to time.Time) (n int, first string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.all {
		if a.at.After(from) && !a.at.After(to) {
			if n == 0 {
				first = a.what
			}
			n++
		}
	}
	return n, first
}

// transitionLog keeps every machine transition the watcher sees (day 2).
type transitionLog struct {
	mu  sync.Mutex
	all map[*machine][]transitionAt
}

type transitionAt struct {
	to string
	at time.Time
}

func (t *transitionLog) add(m *machine, to string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.all[m] = append(t.all[m], transitionAt{to, at})
}

// first is m's first transition to `to` after since (zero: none).
func (t *transitionLog) first(m *machine, to string, since time.Time) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, x := range t.all[m] {
		if x.to == to && !x.at.Before(since) {
			return x.at
		}
	}
	return time.Time{}
}

// path is m's transitions since since, "a→b→c".
func (t *transitionLog) path(m *machine, since time.Time) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var p []string
	for _, x := range t.all[m] {
		if !x.at.Before(since) {
			p = append(p, x.to)
		}
	}
	return strings.Join(p, "→")
}

func (t *transitionLog) countAfter(ms []*machine, since time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, m := range ms {
		for _, x := range t.all[m] {
			if x.at.After(since) {
				n++
			}
		}
	}
	return n
}

// remediationStatus is GET /v1/remediation's answer (api.RemediationStatus).
type remediationStatus struct {
	Brake struct {
		Engaged   bool      `json:"engaged"`
		Scope     string    `json:"scope"`
		Key       string    `json:"key"`
		EngagedAt time.Time `json:"engaged_at"`
		Failures  []struct {
			Machine string `json:"machine"`
		} `json:"failures"`
	} `json:"brake"`
	Machines []struct {
		ID      string `json:"id"`
		State   string `json:"state"`
		Step    string `json:"step"`
		Outcome string `json:"outcome"`
		Spare   string `json:"spare"`
	} `json:"machines"`
}

func (f *fleet) remediation(ctx context.Context) (remediationStatus, error) {
	var st remediationStatus
	err := f.k.do(ctx, "GET", "/v1/remediation", nil, nil, "", &st)
	return st, err
}

// machineState is GET /v1/machines/{id}'s state.
func (f *fleet) machineState(ctx context.Context, m *machine) (string, error) {
	var v struct {
		State string `json:"state"`
	}
	err := f.k.do(ctx, "GET", "/v1/machines/"+m.id, nil, nil, "", &v)
	return v.State, err
}

// claimAll claims n available machines with the selector fleet=sim, at most
// 500 a request, and waits until the watcher has seen them provisioned.
func (f *fleet) claimAll(ctx context.Context, w *watcher, n int) error {
	for left := n; left > 0; {
		c := min(left, 500)
		var cr struct {
			Items []struct {
				ID string `json:"id"`
			} `json:"items"`
		}
		body := map[string]any{"role": "worker", "labels": map[string]string{"fleet": "sim"}, "count": c, "reason": "fleet",
			"claim": map[string]any{"image": f.imageID, "labels": map[string]string{"fleet": "sim"}}}
		if err := f.k.do(ctx, "POST", "/v1/machines/claim", nil, body, "", &cr); err != nil {
			return fmt.Errorf("fleetsim: day 2: claim %d: %w", c, err)
		}
		for _, it := range cr.Items {
			if m := f.byID[it.ID]; m != nil {
				m.claimed = true
			}
		}
		left -= len(cr.Items)
		if len(cr.Items) == 0 {
			return fmt.Errorf("fleetsim: day 2: claim of %d answered no machine", c)
		}
	}
	return nil
}

// day2 runs modes A and B (Day2Options) after the storm: the claimed
// machines are provisioned, the spares available.
func (f *fleet) day2(ctx context.Context, vb *vbmc.Server, acts *actionLog, tl *transitionLog, res *Day2Result) error {
	d := f.o.Day2
	var claimed, spares []*machine
	for _, m := range f.machines {
		if m.claimed {
			claimed = append(claimed, m)
		} else {
			spares = append(spares, m)
		}
	}
	res.Claimed, res.Spares = len(claimed), len(spares)
	critical := func(m *machine, why string) error {
		return vb.SetHealth(strconv.Itoa(m.i+1), vbmc.HealthUpdate{System: "Critical", Chassis: "Critical",
			Event: why, Severity: "Critical"})
	}
	// Mode A: FailA machines spread over the claimed set (every k-th, so
	// over racks), failing evenly over the compressed hour.
	step := len(claimed) / d.FailA
	var failA []*machine
	for i := 0; i < d.FailA; i++ {
		failA = append(failA, claimed[i*step+step/2])
	}
	aStart := time.Now()
	res.AHourSeconds = d.Hour.Seconds()
	failedAt := map[*machine]time.Time{}
	actx, acancel := context.WithTimeout(ctx, d.Timeout)
	defer acancel()
	go func() {
		for i, m := range failA {
			at := aStart.Add(time.Duration(i) * d.Hour / time.Duration(d.FailA))
			if !sleepCtx(actx, time.Until(at)) {
				return
			}
			f.mu.Lock()
			failedAt[m] = time.Now()
			f.mu.Unlock()
			if err := critical(m, "CPU 1 machine check: uncorrectable"); err != nil {
				f.say("fleet: day 2: health of %s: %v", m.name, err)
			}
			if i == 0 && d.FailMark != "" {
				if err := os.WriteFile(d.FailMark, []byte(time.Now().UTC().Format(time.RFC3339Nano)+"\n"), 0o644); err != nil {
					f.say("fleet: day 2: fail mark: %v", err)
				}
			}
		}
	}()
	f.say("fleet: day 2 mode A: %d of %d claimed machines fail over %s (%d spares)", d.FailA, len(claimed), d.Hour, len(spares))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := time.Now()
	for {
		st, err := f.remediation(actx)
		if err == nil {
			res.ABrakeEngaged = res.ABrakeEngaged || st.Brake.Engaged
			spareOf := map[string]string{}
			for _, x := range st.Machines {
				if x.Spare != "" {
					spareOf[x.ID] = x.Spare
				}
			}
			rma, prov := 0, 0
			var slowest time.Duration
			for _, m := range failA {
				f.mu.Lock()
				t0 := failedAt[m]
				f.mu.Unlock()
				if t0.IsZero() || tl.first(m, "rma", t0).IsZero() {
					continue
				}
				rma++
				sp := f.byID[spareOf[m.id]]
				if sp == nil {
					continue
				}
				if tp := tl.first(sp, "provisioned", t0); !tp.IsZero() {
					prov++
					slowest = max(slowest, tp.Sub(t0))
				}
			}
			res.AFailed, res.ARMA, res.ASparesProvisioned, res.ASlowestReplacement = len(failedAt), rma, prov, slowest.Seconds()
			if time.Since(last) >= 10*time.Second {
				last = time.Now()
				f.say("fleet: day 2 A: %5.0f s  failed %d, rma %d, spares provisioned %d, in remediation %d, brake %v",
					time.Since(aStart).Seconds(), len(failedAt), rma, prov, len(st.Machines), st.Brake.Engaged)
			}
			if rma == d.FailA && prov == d.FailA {
				break
			}
		} else if actx.Err() == nil {
			f.say("fleet: day 2: remediation status: %v", err)
		}
		select {
		case <-actx.Done():
			res.ABMCActions, _ = acts.between(aStart, time.Now())
			return fmt.Errorf("fleetsim: day 2 mode A: %d of %d failed machines rma, %d spares provisioned after %s",
				res.ARMA, d.FailA, res.ASparesProvisioned, d.Timeout)
		case <-tick.C:
		}
	}
	res.AFailed = len(failA)
	res.ABMCActions, _ = acts.between(aStart, time.Now())
	res.ALadder = tl.path(failA[0], aStart)
	var ev Result
	if err := f.countEvents(ctx, &ev); err == nil {
		res.AEraseCertificates = ev.EventKinds["erase_certificate"]
	}

	// Mode B: FailB provisioned claimed machines (not mode A's) fail at once.
	var healthy []*machine
	for _, m := range f.machines {
		if s, err := f.machineState(ctx, m); err == nil && s == "provisioned" {
			healthy = append(healthy, m)
		}
	}
	if len(healthy) < d.FailB {
		return fmt.Errorf("fleetsim: day 2 mode B: %d provisioned machines, want %d to fail", len(healthy), d.FailB)
	}
	step = len(healthy) / d.FailB
	var failB []*machine
	for i := 0; i < d.FailB; i++ {
		failB = append(failB, healthy[i*step])
	}
	bStart := time.Now()
	for _, m := range failB {
		if err := critical(m, "PSU 1 and 2 input lost"); err != nil {
			return err
		}
	}
	res.BFailed = len(failB)
	f.say("fleet: day 2 mode B: %d of %d claimed machines fail at once", d.FailB, len(claimed))
	bctx, bcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer bcancel()
	var engagedAt time.Time
	for engagedAt.IsZero() {
		st, err := f.remediation(bctx)
		if err == nil && st.Brake.Engaged && st.Brake.EngagedAt.After(aStart) {
			engagedAt = st.Brake.EngagedAt
			res.BBrakeEngaged, res.BBrakeScope, res.BBrakeKey, res.BCounted = true, st.Brake.Scope, st.Brake.Key, len(st.Brake.Failures)
			res.BBrakeAfter = engagedAt.Sub(bStart).Seconds()
			break
		}
		if !sleepCtx(bctx, 200*time.Millisecond) {
			res.BActionsBeforeBrake, _ = acts.between(bStart, time.Now())
			return fmt.Errorf("fleetsim: day 2 mode B: the brake did not engage in 5 min (%d BMC actions since the injection)", res.BActionsBeforeBrake)
		}
	}
	if !sleepCtx(ctx, d.Observe) {
		return ctx.Err()
	}
	end := time.Now()
	res.BObserveSeconds = end.Sub(engagedAt).Seconds()
	var first string
	res.BActionsBeforeBrake, _ = acts.between(bStart, engagedAt)
	res.BActionsAfterBrake, first = acts.between(engagedAt, end)
	res.BTransitionsAfter = tl.countAfter(failB, engagedAt)
	if first != "" {
		f.say("fleet: day 2 mode B: first BMC action after the brake: %s", first)
	}
	return nil
}
