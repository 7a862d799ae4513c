package dhcp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"kiln/deploy/lab/testkit"
)

// TestBenchDHCP measures DORA exchanges per second at under 1% drops for Kiln
// (leases durable in a bbolt file, one fsync'd transaction per group commit)
// and for Kea (kea-dhcp4, memfile with persist: true) on the same veth pair,
// one after the other, driven by perfdhcp in the client namespace.
//
// Method: perfdhcp -r RATE -p benchStep -R benchClients at increasing rates
// (benchRates); a step passes when both DISCOVER-OFFER and REQUEST-ACK drop
// ratios are under 1%; the figure is the highest achieved 4-way exchange rate
// perfdhcp reports among passing steps. Stepping stops at the first failing
// step after a pass.
func TestBenchDHCP(t *testing.T) {
	if os.Getenv("KILN_BENCH") != "1" {
		t.Skip("benchmark: set KILN_BENCH=1")
	}
	testkit.NeedRoot(t, "network namespaces", "ip", "perfdhcp", "kea-dhcp4")
	l := newLab(t)
	l.addClientIP(t)
	cfg := l.config()
	cfg.Subnets = []Subnet{{CIDR: netip.MustParsePrefix("10.71.0.0/16"), Router: l.serverIP,
		PoolStart: netip.MustParseAddr("10.71.128.1"), PoolEnd: netip.MustParseAddr("10.71.255.254"), LeaseTime: time.Hour}}

	// Kiln: one Server (its lease table and bbolt file live across steps),
	// listening only during its steps.
	b := newBoltBackend(t)
	reg := prometheus.NewRegistry()
	s, err := New(cfg, b, reg)
	if err != nil {
		t.Fatal(err)
	}
	kilnUp := func() func() {
		var lerr error
		inNetns(t, l.srvNS, func() { lerr = s.Listen() })
		if lerr != nil {
			t.Fatal(lerr)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); s.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
		return func() { cancel(); <-done }
	}

	// Kea on the same veth pair.
	dir := t.TempDir()
	leaseFile := filepath.Join(dir, "kea-leases4.csv")
	conf := fmt.Sprintf(`{"Dhcp4": {
  "interfaces-config": {"interfaces": [%q], "dhcp-socket-type": "udp"},
  "lease-database": {"type": "memfile", "persist": true, "name": %q, "lfc-interval": 0},
  "multi-threading": {"enable-multi-threading": true, "thread-pool-size": 2, "packet-queue-size": 256},
  "valid-lifetime": 3600,
  "subnet4": [{"id": 1, "subnet": "10.71.0.0/16", "pools": [{"pool": "10.71.128.1 - 10.71.255.254"}],
     "option-data": [{"name": "routers", "data": %q}]}],
  "loggers": [{"name": "kea-dhcp4", "severity": "WARN", "output_options": [{"output": %q}]}]
}}`, l.srvIf, leaseFile, l.serverIP.String(), filepath.Join(dir, "kea.log"))
	confPath := filepath.Join(dir, "kea.json")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	var keaOut syncBuf
	// Server CPU time over all steps (user+system seconds): Kea's from
	// /proc/PID/stat, Kiln's from this process's rusage around its steps
	// (perfdhcp is a separate process, so it is not counted for either).
	var keaCPU, kilnCPU, keaExch, kilnExch float64
	keaUp := func() func() {
		kea := exec.Command("ip", "netns", "exec", l.srvNS, "kea-dhcp4", "-c", confPath)
		kea.Env = append(os.Environ(), "KEA_PIDFILE_DIR="+dir, "KEA_LOCKFILE_DIR="+dir)
		kea.Stdout, kea.Stderr = &keaOut, &keaOut
		if err := kea.Start(); err != nil {
			t.Fatal(err)
		}
		// ready when its socket is bound
		for i := 0; i < 50; i++ {
			out, _ := exec.Command("ip", "netns", "exec", l.srvNS, "ss", "-uln", "sport", "= :67").Output()
			if strings.Contains(string(out), ":67") {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		return func() {
			keaCPU += procCPU(t, kea.Process.Pid) // read before it exits
			kea.Process.Signal(os.Interrupt)
			kea.Wait()
		}
	}

	// Interleave the two servers rate by rate so both see the same machine
	// load; a server is done after two failing steps in a row.
	var kiln, keaRate float64
	kilnFails, keaFails := 0, 0
	for _, r := range benchRates {
		if kilnFails < 2 {
			c0 := selfCPU()
			down := kilnUp()
			var got float64
			kilnFails, got = stepOnce(t, l, "kiln", r, &kiln, kilnFails)
			down()
			kilnCPU += selfCPU() - c0
			kilnExch += got * float64(benchStep)
		}
		if keaFails < 2 {
			down := keaUp()
			var got float64
			keaFails, got = stepOnce(t, l, "kea", r, &keaRate, keaFails)
			down()
			keaExch += got * float64(benchStep)
		}
		if kilnFails >= 2 && keaFails >= 2 {
			break
		}
	}
	batches, leases := b.counts()
	t.Logf("kiln: %d leases durable in %d bbolt transactions", leases, batches)
	if leases == 0 {
		t.Fatal("kiln persisted no leases")
	}
	if mfs, err := reg.Gather(); err == nil {
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if c := m.GetCounter(); c != nil {
					t.Logf("  %s%v = %.0f", mf.GetName(), labelString(m.GetLabel()), c.GetValue())
				}
				if h := m.GetHistogram(); h != nil && h.GetSampleCount() > 0 {
					var tail []string
					for _, bk := range h.GetBucket() {
						tail = append(tail, fmt.Sprintf("<=%.1fms:%.1f%%", 1000*bk.GetUpperBound(), 100*float64(bk.GetCumulativeCount())/float64(h.GetSampleCount())))
					}
					t.Logf("  %s%v mean = %.2f ms over %d; cumulative %s", mf.GetName(), labelString(m.GetLabel()), 1000*h.GetSampleSum()/float64(h.GetSampleCount()), h.GetSampleCount(), strings.Join(tail[4:], " "))
				}
			}
		}
	}
	if fi, err := os.Stat(leaseFile); err != nil || fi.Size() == 0 {
		t.Fatalf("kea wrote no lease file: %v\n%s", err, keaOut.String())
	}
	ratio := 0.0
	if keaRate > 0 {
		ratio = kiln / keaRate
	}
	fmt.Printf("bench: dhcp_dora_per_s kiln=%.0f peer=%.0f unit=exchanges/s ratio=%.2f\n", kiln, keaRate, ratio)
	if kilnExch > 0 && keaExch > 0 {
		k, p := 1e6*kilnCPU/kilnExch, 1e6*keaCPU/keaExch // server CPU µs per DORA exchange
		fmt.Printf("bench: dhcp_cpu_us_per_dora_lower_is_better kiln=%.1f peer=%.1f unit=us ratio=%.2f\n", k, p, k/p)
	}
}

// selfCPU is this process's user+system CPU time in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// procCPU is process pid's user+system CPU time in seconds (/proc/PID/stat
// fields 14 and 15, in clock ticks of 1/100 s on Linux).
func procCPU(t *testing.T, pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Logf("cpu of %d: %v", pid, err)
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from 3 (state) on
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100
}

var (
	benchRates   = []int{500, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 10000, 12000, 14000, 16000, 20000}
	benchStep    = 3 // seconds per rate step
	benchClients = 30000
	reRate       = regexp.MustCompile(`Rate: ([0-9.]+) 4-way exchanges/second`)
	reDrops      = regexp.MustCompile(`drops ratio: ([0-9.]+) ?%`)
)

// stepOnce runs perfdhcp at rate r for benchStep seconds; it raises *best to
// the achieved DORA rate when both drop ratios are under 1% and returns the
// updated count of consecutive failing steps and the achieved rate.
func stepOnce(t *testing.T, l *lab, name string, r int, best *float64, fails int) (int, float64) {
	rcvErrs := func() string {
		out, _ := exec.Command("ip", "netns", "exec", l.srvNS, "sh", "-c", "grep ^Udp: /proc/net/snmp | tail -1").Output()
		f := strings.Fields(string(out))
		if len(f) > 5 {
			return f[5] // RcvbufErrors
		}
		return "?"
	}
	before := rcvErrs()
	defer func() { t.Logf("%s r=%d: server netns UDP RcvbufErrors %s -> %s", name, r, before, rcvErrs()) }()
	args := []string{"netns", "exec", l.cliNS, "perfdhcp", "-4", "-l", l.clientIP.String(),
		"-r", strconv.Itoa(r), "-p", strconv.Itoa(benchStep), "-R", strconv.Itoa(benchClients), "-W", "300000"}
	args = append(args, strings.Fields(os.Getenv("KDH_PERFDHCP_ARGS"))...)
	out, _ := exec.Command("ip", append(args, l.serverIP.String())...).CombinedOutput()
	rm := reRate.FindSubmatch(out)
	dm := reDrops.FindAllSubmatch(out, -1)
	if rm == nil || len(dm) < 2 {
		t.Logf("%s r=%d: unparsable perfdhcp output:\n%s", name, r, out)
		return 2, 0
	}
	rate, _ := strconv.ParseFloat(string(rm[1]), 64)
	d1, _ := strconv.ParseFloat(string(dm[0][1]), 64)
	d2, _ := strconv.ParseFloat(string(dm[1][1]), 64)
	pass := d1 < 1 && d2 < 1
	t.Logf("%s r=%d: achieved %.0f/s, drops discover-offer %.2f%% request-ack %.2f%% pass=%v", name, r, rate, d1, d2, pass)
	if !pass && os.Getenv("KDH_BENCH_DEBUG") != "" {
		t.Logf("%s", out)
	}
	if pass {
		*best = max(*best, rate)
		return 0, rate
	}
	return fails + 1, rate
}

func labelString(ls []*dto.LabelPair) string {
	var parts []string
	for _, l := range ls {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return "{" + strings.Join(parts, ",") + "}"
}
