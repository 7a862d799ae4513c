package fleetsim

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// Result of one run. Durations are in seconds, sizes in bytes.
type Result struct {
	N           int `json:"n"`
	Provisioned int `json:"provisioned"`
	Failed      int `json:"failed"` // failed or quarantined in Kiln
	// Unfinished machines neither provisioned nor failed when the run ended.
	Unfinished int `json:"unfinished"`
	// Attest is the attestation's part (Options.Attest; nil without it).
	Attest *AttestResult `json:"attest,omitempty"`
	// Day2 is the day-2 phase's result (Options.Day2; nil without it).
	Day2 *Day2Result `json:"day2,omitempty"`
	// Seconds is from the first power-on to the last provisioned.
	Seconds float64 `json:"seconds"`
	// WallSeconds is from the import to the end of the run.
	WallSeconds   float64 `json:"wall_seconds"`
	ImportSeconds float64 `json:"import_seconds"`
	EnrollSeconds float64 `json:"enroll_seconds"`
	// KilnCPUSeconds is kiln serve's user+system CPU from the import to the end;
	// CPUPerMachineMS is it per simulated machine, in milliseconds.
	KilnCPUSeconds  float64 `json:"kiln_cpu_seconds"`
	CPUPerMachineMS float64 `json:"cpu_per_machine_ms"`
	// PeakRSS is kiln serve's VmHWM at the end.
	PeakRSS int64 `json:"peak_rss"`
	// StoreBytes is Kiln's data directory (raft log, bbolt FSM, snapshots);
	// RaftBytes raft.db, FSMBytes fsm.db.
	StoreBytes int64 `json:"store_bytes"`
	RaftBytes  int64 `json:"raft_bytes"`
	FSMBytes   int64 `json:"fsm_bytes"`
	// Events is every event in /v1/events at the end; MachineEvents those
	// about a machine; EventKinds by kind.
	Events        int            `json:"events"`
	MachineEvents int            `json:"machine_events"`
	EventKinds    map[string]int `json:"event_kinds"`
	// Metrics are the watched series of Kiln's /metrics at the end (metrics.go).
	Metrics map[string]float64 `json:"metrics,omitempty"`
	// Phases in the order of a machine's run.
	Phases []Phase `json:"phases"`
	// PowerOns counts the power-ons Kiln's BMC calls gave the machines;
	// Repowered is how many machines were powered on (or reset) more than
	// once, which a run without faults should not need (one per inspection).
	PowerOns  int `json:"power_ons"`
	Repowered int `json:"repowered"`
	// NetbootRetries counts network boots tried again after an error; RetryErrors
	// are the first few of those errors.
	NetbootRetries int      `json:"netboot_retries"`
	RetryErrors    []string `json:"retry_errors,omitempty"`
	// SimErrors are machines whose simulation hit an error (the first few in Errors).
	SimErrors int      `json:"sim_errors"`
	Errors    []string `json:"errors,omitempty"`
	// Failures are the first few machines Kiln failed, with the reason.
	Failures []string `json:"failures,omitempty"`
	// Trails are, for the first few machines Kiln failed, their transitions
	// and BMC jobs in order (seconds after the import began): what a failure
	// in CI needs to be understood without the run's store.
	Trails []string `json:"trails,omitempty"`
	// A cluster run (Options.Nodes > 1): the node count; the leader killed,
	// when (seconds after the import began) and with how many machines
	// mid-build (write begun, not yet provisioned); the node elected after
	// it and how soon; when the killed node was ready again.
	Nodes          int     `json:"nodes"`
	KilledNode     string  `json:"killed_node,omitempty"`
	KilledAt       float64 `json:"killed_at,omitempty"`
	KilledMidBuild int     `json:"killed_mid_build,omitempty"`
	NewLeader      string  `json:"new_leader,omitempty"`
	ElectedIn      float64 `json:"elected_in,omitempty"`
	RestartedAt    float64 `json:"restarted_at,omitempty"`
	// The end checks of a cluster run (checkCluster): the run's machines
	// provisioned in each node's store and each node's live leases;
	// machines that went to provisioned more than once in any node's event
	// log; addresses bound to two MACs (any node's leases, across nodes, or
	// the ACKs the machines received: ACKs counts those); machines that
	// fetched the image more than once (a build redone after the failover,
	// not itself an error).
	NodeProvisioned  []int    `json:"node_provisioned,omitempty"`
	NodeLeases       []int    `json:"node_leases,omitempty"`
	ProvisionedTwice int      `json:"provisioned_twice"`
	Twice            []string `json:"twice,omitempty"`
	DupAddrs         int      `json:"dup_addrs"`
	Dups             []string `json:"dups,omitempty"`
	ACKs             int      `json:"acks"`
	Rebuilt          int      `json:"rebuilt"`
	// Problems are the cluster checks that failed (empty when all hold).
	Problems []string `json:"problems,omitempty"`
	// Error is the run's own failure (set by ChildMain).
	Error string `json:"error,omitempty"`
}

// Phase is the distribution of one phase over the machines that went through it.
type Phase struct {
	Name string  `json:"name"`
	N    int     `json:"n"`
	P50  float64 `json:"p50"` // seconds
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// quantile is the nearest-rank q-quantile of sorted ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

func phaseOf(name string, ds []time.Duration) Phase {
	s := sortedDurations(ds)
	p := Phase{Name: name, N: len(s)}
	if len(s) > 0 {
		p.P50, p.P99, p.Max = quantile(s, 0.5).Seconds(), quantile(s, 0.99).Seconds(), s[len(s)-1].Seconds()
	}
	return p
}

func (r *Result) fill(f *fleet, w *watcher, before, after procStat, start, end time.Time) {
	r.WallSeconds = end.Sub(start).Seconds()
	r.KilnCPUSeconds = (after.CPU - before.CPU).Seconds()
	r.CPUPerMachineMS = r.KilnCPUSeconds * 1000 / float64(r.N)
	r.PeakRSS = after.PeakRSS
	var firstOn, lastProv time.Time
	ph := map[string][]time.Duration{}
	add := func(name string, a, b time.Time) {
		if !a.IsZero() && !b.IsZero() && !b.Before(a) {
			ph[name] = append(ph[name], b.Sub(a))
		}
	}
	for _, m := range f.machines {
		m.mu.Lock()
		t, boots := m.t, m.boots
		if m.err != nil {
			r.SimErrors++
			if len(r.Errors) < 5 {
				r.Errors = append(r.Errors, m.name+": "+m.err.Error())
			}
		}
		r.NetbootRetries += t.retries
		r.PowerOns += boots
		if boots > 1 {
			r.Repowered++
		}
		for _, e := range t.retryErrs {
			if len(r.RetryErrors) < 5 {
				r.RetryErrors = append(r.RetryErrors, m.name+": "+e)
			}
		}
		m.mu.Unlock()
		switch {
		case !t.provisioned.IsZero():
			r.Provisioned++
			if t.provisioned.After(lastProv) {
				lastProv = t.provisioned
			}
		case !t.failed.IsZero():
			r.Failed++
			if len(r.Failures) < 5 {
				r.Failures = append(r.Failures, m.name+": "+t.failReason)
			}
		default:
			r.Unfinished++
		}
		if !t.powerOn.IsZero() && (firstOn.IsZero() || t.powerOn.Before(firstOn)) {
			firstOn = t.powerOn
		}
		add("power_on", start, t.powerOn)
		add("dhcp", t.dhcpStart, t.dhcpDone)
		add("first_stage", t.dhcpDone, t.stageDone)
		add("environment", t.stageDone, t.envDone)
		add("inspection", t.registered, t.available)
		add("claim_to_write", t.available, t.writeStart)
		add("write", t.writeStart, t.writeDone)
		add("verify", t.verifyStart, t.verifyDone)
		add("reboot", t.rebootReport, t.provisioned)
		add("total", t.powerOn, t.provisioned)
		ph["report"] = append(ph["report"], t.reports...)
	}
	if !firstOn.IsZero() && !lastProv.IsZero() {
		r.Seconds = lastProv.Sub(firstOn).Seconds()
	}
	for _, name := range []string{"power_on", "dhcp", "first_stage", "environment", "inspection", "claim_to_write",
		"write", "verify", "report", "reboot", "total"} {
		r.Phases = append(r.Phases, phaseOf(name, ph[name]))
	}
}

func mb(n int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }

// Lines are the result as the simulator prints it: the headline
//
//	fleet: N provisioned, F failed in S s; kiln cpu X ms/machine; rss Y MB; store Z MB
//
// then the phases' p50/p99, the store's parts and the events.
func (r *Result) Lines() []string {
	out := []string{fmt.Sprintf("fleet: %d provisioned, %d failed in %.1f s; kiln cpu %.1f ms/machine; rss %s MB; store %s MB",
		r.Provisioned, r.Failed, r.Seconds, r.CPUPerMachineMS, mb(r.PeakRSS), mb(r.StoreBytes))}
	if r.Nodes > 1 {
		killed := "no leader killed"
		if r.KilledNode != "" {
			killed = fmt.Sprintf("leader killed at %.1f s", r.KilledAt)
		}
		out = append(out, fmt.Sprintf("fleet: %d provisioned, %d failed in %.1f s on %d nodes; %s; provisioned twice %d; duplicate addresses %d",
			r.Provisioned, r.Failed, r.Seconds, r.Nodes, killed, r.ProvisionedTwice, r.DupAddrs))
		out = append(out, fmt.Sprintf("fleet: cluster: killed %s with %d machines mid-build, %s elected in %.1f s, restarted ready at %.1f s; provisioned per node %v; live leases per node %v; ACKs %d; builds redone %d; failed checks %d",
			r.KilledNode, r.KilledMidBuild, r.NewLeader, r.ElectedIn, r.RestartedAt, r.NodeProvisioned, r.NodeLeases, r.ACKs, r.Rebuilt, len(r.Problems)))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "fleet: phases p50/p99 s:")
	for _, p := range r.Phases {
		if p.N == 0 {
			fmt.Fprintf(&b, " %s -", p.Name)
			continue
		}
		fmt.Fprintf(&b, " %s %.3f/%.3f", p.Name, p.P50, p.P99)
	}
	out = append(out, b.String())
	var kinds []string
	for k := range r.EventKinds {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var kb strings.Builder
	for _, k := range kinds {
		fmt.Fprintf(&kb, " %s=%d", k, r.EventKinds[k])
	}
	per := 0.0
	if r.N > 0 {
		per = float64(r.MachineEvents) / float64(r.N)
	}
	out = append(out, fmt.Sprintf("fleet: raft log %s MB, bbolt %s MB; events %d (%.1f per machine;%s); kiln cpu %.1f s; wall %.1f s (import %.1f s, enroll %.1f s); unfinished %d, simulator errors %d, netboot retries %d; power-ons %d (%d machines more than once)",
		mb(r.RaftBytes), mb(r.FSMBytes), r.Events, per, kb.String(), r.KilnCPUSeconds, r.WallSeconds, r.ImportSeconds, r.EnrollSeconds, r.Unfinished, r.SimErrors, r.NetbootRetries, r.PowerOns, r.Repowered))
	if r.Metrics != nil {
		out = append(out, metricsLine(r.Metrics, r.N))
	}
	if r.Attest != nil {
		out = append(out, r.Attest.Line())
	}
	for _, e := range r.Errors {
		out = append(out, "fleet: simulator error: "+e)
	}
	for _, e := range r.RetryErrors {
		out = append(out, "fleet: netboot retried after: "+e)
	}
	for _, e := range r.Failures {
		out = append(out, "fleet: kiln failed "+e)
	}
	for _, e := range r.Trails {
		out = append(out, "fleet: trail "+e)
	}
	for _, e := range r.Problems {
		out = append(out, "fleet: check failed: "+e)
	}
	return out
}
