package leasecheck

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"kiln/deploy/lab/testreq"
)

// Settings of a run, from the environment (the defaults are the short run
// `go test ./...` makes; `make leasecheck` sets the long one).
const (
	envDuration = "KILN_LEASECHECK_DURATION" // e.g. 5m; default 70s
	envClients  = "KILN_LEASECHECK_CLIENTS"  // default 300
	envPool     = "KILN_LEASECHECK_POOL"     // addresses in the pool, default 256
	envLease    = "KILN_LEASECHECK_LEASE"    // lease time, default 20s
	envSeed     = "KILN_LEASECHECK_SEED"     // default: from the clock (printed)
	envBin      = "KILN_BIN"                 // a built bin/kiln; default: go build ./cmd/kiln
)

type settings struct {
	duration, lease time.Duration
	clients, pool   int
	seed            uint64
}

func loadSettings(t *testing.T) settings {
	t.Helper()
	s := settings{duration: 70 * time.Second, lease: 20 * time.Second, clients: 300, pool: 256, seed: uint64(time.Now().UnixNano())}
	dur := func(k string, v *time.Duration) {
		if e := os.Getenv(k); e != "" {
			d, err := time.ParseDuration(e)
			if err != nil || d <= 0 {
				t.Fatalf("%s=%q: want a positive duration like 5m", k, e)
			}
			*v = d
		}
	}
	num := func(k string, v *int, lo, hi int) {
		if e := os.Getenv(k); e != "" {
			n, err := strconv.Atoi(e)
			if err != nil || n < lo || n > hi {
				t.Fatalf("%s=%q: want an integer from %d to %d", k, e, lo, hi)
			}
			*v = n
		}
	}
	dur(envDuration, &s.duration)
	dur(envLease, &s.lease)
	num(envClients, &s.clients, 1, 1<<20)
	num(envPool, &s.pool, 2, maxPool)
	if e := os.Getenv(envSeed); e != "" {
		n, err := strconv.ParseUint(e, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want an unsigned integer", envSeed, e)
		}
		s.seed = n
	}
	if s.lease%time.Second != 0 || s.lease < 4*time.Second {
		t.Fatalf("%s=%s: want whole seconds, at least 4s (option 51 counts seconds)", envLease, s.lease)
	}
	if s.duration < 40*time.Second {
		t.Fatalf("%s=%s: want at least 40s (room for a leader kill, a partition and a restart)", envDuration, s.duration)
	}
	return s
}

// kilnBinary is $KILN_BIN, or this tree's cmd/kiln built into a temporary
// directory.
func kilnBinary(t *testing.T) string {
	t.Helper()
	if b := os.Getenv(envBin); b != "" {
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("%s=%s: %v", envBin, b, err)
		}
		return b
	}
	out := filepath.Join(t.TempDir(), "kiln")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/kiln")
	cmd.Dir = testreq.RepoRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kiln: %v\n%s", err, b)
	}
	return out
}

// faultCount counts the faults injected.
type faultCount struct {
	kills, partitions, isolations, restarts, pauses atomic.Int64
	slowStops                                       atomic.Int64 // SIGTERM not obeyed within the grace
}

func (f *faultCount) total() int64 {
	return f.kills.Load() + f.partitions.Load() + f.isolations.Load() + f.restarts.Load() + f.pauses.Load()
}

// inject runs faults one at a time until until, each followed by a pause
// of 2-5 s: the first three are a leader SIGKILL, a partition and a restart
// in random order, then at random (30% leader kill, 35% partition, of which
// a third isolate the node from the clients too, 20% restart, 15% pause):
//
//   - leader kill: SIGKILL of the raft leader's process, restarted on the
//     same data directory after 2-6 s;
//   - partition: the node's cluster port down for 4-10 s (it keeps serving
//     DHCP clients from the minority side); isolation: both ports down;
//   - restart: SIGTERM of a random node and a start on the same data
//     directory at once;
//   - pause: SIGSTOP of the leader for 2-6 s, then SIGCONT (a stalled
//     process, as a long GC pause or a VM freeze: it resumes believing it
//     leads, with the packets that queued meanwhile).
//
// Every fault ends with the node back and a leader known. The first three
// run even past until. It logs each
// fault with its time since start; an error of the lab itself is returned.
func (l *lab) inject(t *testing.T, rng *rand.Rand, start, until time.Time, fc *faultCount) error {
	kinds := []string{"kill", "partition", "restart"}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	pause := func() { time.Sleep(2*time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))) }
	for i := 0; ; i++ {
		pause()
		// The first three (one of each kind) run whatever the time: on a
		// loaded machine they may outlast a short run, which then goes on
		// until they are done (the caller waits for inject).
		if i >= len(kinds) && time.Now().Add(12*time.Second).After(until) {
			return nil
		}
		kind := ""
		if i < len(kinds) {
			kind = kinds[i]
		} else {
			switch p := rng.IntN(100); {
			case p < 30:
				kind = "kill"
			case p < 65:
				kind = "partition"
			case p < 85:
				kind = "restart"
			default:
				kind = "pause"
			}
		}
		since := func() string {
			return fmt.Sprintf("%5.1f s (%s)", time.Since(start).Seconds(), time.Now().Format("15:04:05.000"))
		}
		switch kind {
		case "kill":
			var ld *node
			waitUntil(20*time.Second, func() bool { ld = l.leader(); return ld != nil })
			if ld == nil {
				return fmt.Errorf("no leader to kill at %s", since())
			}
			down := 2*time.Second + time.Duration(rng.Int64N(int64(4*time.Second)))
			t.Logf("%s: SIGKILL of the leader %s, down %.1f s", since(), ld.id, down.Seconds())
			ld.stop(syscall.SIGKILL, 5*time.Second)
			fc.kills.Add(1)
			time.Sleep(down)
			if err := l.startErr(ld); err != nil {
				return err
			}
		case "partition":
			n := l.nodes[rng.IntN(len(l.nodes))]
			if rng.IntN(2) == 0 {
				if ld := l.leader(); ld != nil {
					n = ld
				}
			}
			iso := rng.IntN(3) == 0
			d := 4*time.Second + time.Duration(rng.Int64N(int64(6*time.Second)))
			what := "partition (cluster port down)"
			if iso {
				what = "isolation (both ports down)"
			}
			t.Logf("%s: %s of %s for %.1f s", since(), what, n.id, d.Seconds())
			if err := l.link(n, iso, false); err != nil {
				return err
			}
			if iso {
				fc.isolations.Add(1)
			} else {
				fc.partitions.Add(1)
			}
			time.Sleep(d)
			if err := l.link(n, true, true); err != nil {
				return err
			}
		case "pause":
			var ld *node
			waitUntil(20*time.Second, func() bool { ld = l.leader(); return ld != nil })
			if ld == nil {
				return fmt.Errorf("no leader to pause at %s", since())
			}
			d := 2*time.Second + time.Duration(rng.Int64N(int64(4*time.Second)))
			t.Logf("%s: SIGSTOP of the leader %s for %.1f s", since(), ld.id, d.Seconds())
			if err := ld.signal(syscall.SIGSTOP); err != nil {
				return err
			}
			fc.pauses.Add(1)
			time.Sleep(d)
			if err := ld.signal(syscall.SIGCONT); err != nil {
				return err
			}
		case "restart":
			n := l.nodes[rng.IntN(len(l.nodes))]
			t.Logf("%s: restart (SIGTERM, start) of %s", since(), n.id)
			took, killed := n.stop(syscall.SIGTERM, 20*time.Second)
			fc.restarts.Add(1)
			if killed {
				t.Logf("%s: %s did not exit within %s of SIGTERM: killed", since(), n.id, took.Round(time.Millisecond))
				fc.slowStops.Add(1)
			} else {
				t.Logf("%s: %s exited %.1f s after SIGTERM", since(), n.id, took.Seconds())
			}
			if err := l.startErr(n); err != nil {
				return err
			}
		}
		var ld *node
		if !waitUntil(30*time.Second, func() bool { ld = l.leader(); return ld != nil }) {
			return fmt.Errorf("no leader 30 s after the %s fault at %s", kind, since())
		}
		t.Logf("%s: healed, leader %s", since(), ld.id)
	}
}

// TestLeaseCheck is the lease-safety test in the spirit of Jepsen (issue
// 12): three real `kiln serve` nodes (a site cluster over mutual TLS, join
// tokens) on one provisioning bridge in network namespaces; hundreds (the
// short run) or thousands (KILN_LEASECHECK_CLIENTS) of simulated DHCP
// clients with their own MACs, in churn against a small pool with a short
// lease; random leader kills, partitions, isolations and restarts for the
// run's duration. Then the checker reads the clients' history of ACKs,
// releases and NAKs and proves that no two clients held one address at
// overlapping times; every node's log never granted an address inside
// another client's hold (its lease events); every node's store, read at the
// end, covers the last hold of every address and is the same on all three.
// It prints
//
//	leasecheck: N clients, A ACKs, F faults (K leader kills, P partitions, R restarts, Z pauses) in S s; violations V
//
// and fails unless V is 0 and the run exercised what it claims (every kind
// of fault, ACKs from every node, addresses passing between clients).
func TestLeaseCheck(t *testing.T) {
	requireLab(t)
	s := loadSettings(t)
	bin := kilnBinary(t)
	l := newLab(t, bin, s.pool, s.lease)
	t0 := time.Now()
	l.form(t)
	t.Logf("cluster of 3 up in %.1f s; %d clients, pool %d, lease %s, %s, seed %d", time.Since(t0).Seconds(),
		s.clients, s.pool, s.lease, s.duration, s.seed)
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range l.nodes {
				t.Logf("--- %s log (tail):\n%s", n.id, n.logTail(40))
			}
		}
	})

	w := newWire(t, l.cli, "c0", l.serverMACs)
	rec := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	until := start.Add(s.duration)
	wait := runClients(ctx, w, rec, s.clients, s.seed, s.lease, min(10*time.Second, s.duration/4))
	var fc faultCount
	ferr := l.inject(t, rand.New(rand.NewPCG(s.seed, 1<<40)), start, until, &fc)
	time.Sleep(time.Until(until))
	cancel()
	wait()
	elapsed := time.Since(start)
	if ferr != nil {
		t.Fatalf("fault injection: %v", ferr)
	}

	// Heal, every node up, the replicas at one applied index.
	for _, n := range l.nodes {
		if err := l.link(n, true, true); err != nil {
			t.Fatal(err)
		}
		if !n.isUp() {
			l.start(t, n)
		}
	}
	if idx, ok := l.converge(60 * time.Second); !ok {
		t.Fatalf("the nodes did not reach one applied index in 60 s: %s", idx)
	}

	h := rec.history()
	r := Check(h)
	var problems []string
	for _, v := range r.Violations {
		problems = append(problems, "history: "+v.String())
	}
	var grants0 []Grant
	for i, n := range l.nodes {
		g, total, err := l.leaseGrants(n)
		if err != nil {
			t.Fatalf("%s events: %v", n.id, err)
		}
		for _, p := range CheckGrants(r, g) {
			problems = append(problems, n.id+" log: "+p)
		}
		if i == 0 {
			grants0 = g
			t.Logf("%s: %d events, %d lease events", n.id, total, len(g))
		} else if d := sameGrants(grants0, g); d != "" {
			problems = append(problems, fmt.Sprintf("%s and %s logs differ: %s", l.nodes[0].id, n.id, d))
		}
	}
	for _, n := range l.nodes {
		n.stop(syscall.SIGTERM, 20*time.Second)
	}
	var recs0 map[netip.Addr]Record
	for i, n := range l.nodes {
		recs, err := storeRecords(n)
		if err != nil {
			t.Fatalf("%s store: %v", n.id, err)
		}
		problems = append(problems, CheckStore(n.id, r, recs)...)
		if i == 0 {
			recs0 = recs
		} else if d := sameRecords(recs0, recs); d != "" {
			problems = append(problems, fmt.Sprintf("%s and %s stores differ: %s", l.nodes[0].id, n.id, d))
		}
	}

	var servers []string
	rec.byServer.Range(func(k, v any) bool {
		servers = append(servers, fmt.Sprintf("%s %d", k.(netip.Addr), v.(*atomic.Int64).Load()))
		return true
	})
	sort.Strings(servers)
	sent := make([]string, 0, len(rec.sent))
	for _, k := range []string{"discover", string(KindSelect), string(KindReboot), string(KindRenew), string(KindRebind)} {
		sent = append(sent, fmt.Sprintf("%s %d", k, rec.sent[k].Load()))
	}
	t.Logf("fault timeline: the clients started at %s", start.Format("15:04:05.000"))
	fmt.Printf("leasecheck: %d clients, %d ACKs, %d faults (%d leader kills, %d partitions, %d restarts, %d pauses) in %.0f s; violations %d\n",
		s.clients, r.Acks, fc.total(), fc.kills.Load(), fc.partitions.Load()+fc.isolations.Load(), fc.restarts.Load(),
		fc.pauses.Load(), elapsed.Seconds(), len(problems))
	fmt.Printf("leasecheck: pool %d, lease %s, seed %d; %d clients ACKed, %d addresses, %d reused, %d handovers, closest handover %s; "+
		"%d isolations among the partitions, %d SIGTERMs not obeyed in 20 s; exchanges: %s; NAKs %d, timeouts %d, releases %d, minority (time-left) ACKs %d; "+
		"ACKs by server: %s; %d lease grants checked per node, %d store records per node\n",
		s.pool, s.lease, s.seed, r.Clients, r.Addresses, r.Reused, r.Handovers, r.MinGap.Round(time.Microsecond),
		fc.isolations.Load(), fc.slowStops.Load(), strings.Join(sent, ", "), rec.naks.Load(), rec.timeouts.Load(), rec.releases.Load(),
		rec.shortAcks.Load(), strings.Join(servers, ", "), len(grants0), len(recs0))

	if len(problems) > 0 {
		t.Logf("the timeline of the first violating addresses (history and %s's log):\n%s", l.nodes[0].id, timeline(r, h, grants0, 5))
		keepLogs(t, l)
	}
	for i, p := range problems {
		if i == 20 {
			t.Errorf("... and %d more", len(problems)-20)
			break
		}
		t.Error(p)
	}
	// The run must have exercised what it claims.
	if fc.kills.Load() == 0 || fc.partitions.Load()+fc.isolations.Load() == 0 || fc.restarts.Load() == 0 {
		t.Errorf("not every kind of fault ran: %d kills, %d partitions, %d restarts", fc.kills.Load(),
			fc.partitions.Load()+fc.isolations.Load(), fc.restarts.Load())
	}
	if len(servers) < 3 {
		t.Errorf("ACKs came from %d servers, want all 3: %v", len(servers), servers)
	}
	if r.Reused == 0 || r.Handovers == 0 {
		t.Errorf("no address passed from one client to another (%d reused): the run did not contend", r.Reused)
	}
	if r.Acks < s.clients {
		t.Errorf("%d ACKs for %d clients: too few to judge", r.Acks, s.clients)
	}
}

// sameGrants reports the first difference between two nodes' lease events.
func sameGrants(a, b []Grant) string {
	if len(a) != len(b) {
		return fmt.Sprintf("%d lease events vs %d", len(a), len(b))
	}
	for i := range a {
		if a[i].MAC != b[i].MAC || a[i].IP != b[i].IP || a[i].State != b[i].State || !a[i].At.Equal(b[i].At) {
			return fmt.Sprintf("event %d: %+v vs %+v", i, a[i], b[i])
		}
	}
	return ""
}

// timeline lists, for the first n addresses with a violation, every ACK,
// stop and log grant of the address and of the clients involved, by time.
func timeline(r Result, h History, grants []Grant, n int) string {
	type row struct {
		at   time.Time
		text string
	}
	var b strings.Builder
	seen := map[netip.Addr]bool{}
	for _, v := range r.Violations {
		ip := v.A.IP
		if seen[ip] || len(seen) == n {
			continue
		}
		seen[ip] = true
		macs := map[string]bool{v.A.MAC: true, v.B.MAC: true}
		from, to := v.A.From.Add(-30*time.Second), v.B.To.Add(10*time.Second)
		var rows []row
		in := func(t time.Time) bool { return !t.Before(from) && t.Before(to) }
		for _, a := range h.Acks {
			if (a.IP == ip || macs[a.MAC]) && in(a.Recv) {
				rows = append(rows, row{a.Sent, fmt.Sprintf("%s sent %s REQUEST for %s", a.MAC, a.Kind, a.IP)},
					row{a.Recv, fmt.Sprintf("%s ACK %s %s from %s, lease %s (until %s)", a.MAC, a.Kind, a.IP, a.Server, a.Lease,
						a.End().Format("15:04:05.000000"))})
			}
		}
		for _, s := range h.Stops {
			if (s.IP == ip || macs[s.MAC]) && in(s.At) {
				rows = append(rows, row{s.At, fmt.Sprintf("%s stop %s (%s)", s.MAC, s.IP, s.Reason)})
			}
		}
		for _, g := range grants {
			if (g.IP == ip || macs[g.MAC]) && in(g.At) {
				rows = append(rows, row{g.At, fmt.Sprintf("log: %s %s %s", g.IP, g.State, g.MAC)})
			}
		}
		sort.SliceStable(rows, func(i, j int) bool { return rows[i].at.Before(rows[j].at) })
		fmt.Fprintf(&b, "--- %s (%s)\n", ip, v)
		for _, r := range rows {
			fmt.Fprintf(&b, "  %s  %s\n", r.at.Format("15:04:05.000000"), r.text)
		}
	}
	return b.String()
}

// keepLogs copies the nodes' logs out of the test's temporary directories
// (removed at its end) to a directory that stays, and says where.
func keepLogs(t *testing.T, l *lab) {
	dir, err := os.MkdirTemp("", "leasecheck-logs-")
	if err != nil {
		t.Logf("keeping the logs: %v", err)
		return
	}
	for _, n := range l.nodes {
		b, err := os.ReadFile(filepath.Join(n.dir, "kiln.log"))
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, n.id+".log"), b, 0o600)
		}
		if err != nil {
			t.Logf("keeping %s's log: %v", n.id, err)
		}
	}
	t.Logf("the nodes' logs are kept in %s", dir)
}
