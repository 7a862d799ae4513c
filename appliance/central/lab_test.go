package central_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kiln/api"
	"kiln/appliance/central"
	"kiln/deploy/lab/fleetsim"
	"kiln/deploy/lab/testreq"
)

// TestMain runs the fleet simulation half when fleetsim re-executes the
// test binary inside a site's machines' namespace.
func TestMain(m *testing.M) {
	if fleetsim.IsChild() {
		fleetsim.ChildMain()
	}
	os.Exit(m.Run())
}

func envInt(t *testing.T, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive integer", name, v)
		}
		return n
	}
	return def
}

func envDur(t *testing.T, name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a duration", name, v)
		}
		return d
	}
	return def
}

func ipc(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
}

type runOut struct {
	i   int
	res *fleetsim.Result
	err error
}

// TestSixSitesWANCut is issue 13's six sites and a central puller: six
// fleetsim sites (one kiln serve each in its own namespaces), the central
// (the built cmd/kiln-central) in its own namespace with one veth "WAN"
// to each site's server namespace, following every /v1/events and
// /v1/site/status. Site 3's WAN is cut (link down) for the cut while it
// keeps provisioning, and the central is restarted once during the cut
// (the durable cursor); after the heal every site's full feed (dumped by
// the site itself, in its own namespace) must equal the central's copy:
// the same indexes, the same content, no gap, no duplicate.
//
// Defaults: 6 sites × 20 machines, a 15 s cut. KILN_CENTRAL_SITES,
// KILN_CENTRAL_N (machines per site, ≤ 2044) and KILN_CENTRAL_CUT (e.g.
// 45s) scale it; KILN_ENV_DIR uses the built environment instead of a
// random stand-in.
func TestSixSitesWANCut(t *testing.T) {
	testreq.Root(t, "network namespaces and AF_PACKET", "ip", "sysctl")
	nSites := envInt(t, "KILN_CENTRAL_SITES", 6)
	perSite := envInt(t, "KILN_CENTRAL_N", 20)
	cut := envDur(t, "KILN_CENTRAL_CUT", 15*time.Second)
	// Site 3's WAN is cut in its storm (it keeps provisioning); site 4's
	// is cut when its day 2 (fleetsim.Day2Options) makes its first machine
	// Critical, so its remediation runs while the site is cut off.
	const cutSite, remSite = 3, 4
	if nSites < remSite {
		t.Fatalf("KILN_CENTRAL_SITES=%d: want ≥ %d", nSites, remSite)
	}

	work := t.TempDir()
	bins := map[string]string{}
	for _, b := range []string{"kiln", "kiln-central"} {
		bins[b] = filepath.Join(work, b)
		cmd := exec.Command("go", "build", "-o", bins[b], "./cmd/"+b)
		cmd.Dir = testreq.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/%s: %v\n%s", b, err, out)
		}
	}
	envDir := os.Getenv("KILN_ENV_DIR")
	if envDir == "" {
		envDir = filepath.Join(work, "env")
		_ = os.MkdirAll(envDir, 0o755)
		for _, n := range []string{"vmlinuz", "initramfs"} {
			b := make([]byte, 2<<20)
			_, _ = rand.Read(b)
			if err := os.WriteFile(filepath.Join(envDir, n), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}

	tag := strconv.Itoa(os.Getpid() % 1000)
	ctl := "kc" + tag + "-ctl"
	_ = exec.Command("ip", "netns", "del", ctl).Run()
	ipc(t, "netns", "add", ctl)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ctl).Run() })
	ipc(t, "-n", ctl, "link", "set", "lo", "up")

	// The central's configuration: site i at 10.250.i.2 over its WAN.
	var cfg central.Config
	cfg.StatePath = filepath.Join(work, "central.db")
	cfg.Wait = 10 * time.Second
	cfg.StatusEvery = 5 * time.Second
	cfg.MaxBackoff = 5 * time.Second
	remMark := filepath.Join(work, "site-4-day2-failed") // fleetsim's Day2Options.FailMark
	siteWork := make([]string, nSites+1)
	for i := 1; i <= nSites; i++ {
		siteWork[i] = filepath.Join(work, fmt.Sprintf("site-%d", i))
		cfg.Sites = append(cfg.Sites, central.Site{Name: fmt.Sprintf("site-%d", i),
			Server: fmt.Sprintf("http://10.250.%d.2:7480", i), TokenFile: filepath.Join(siteWork[i], "kiln-data", "admin.token")})
	}
	cfgJS, _ := json.Marshal(map[string]any{"sites": cfg.Sites, "state": cfg.StatePath, "wait": cfg.Wait,
		"status_every": cfg.StatusEvery, "max_backoff": cfg.MaxBackoff})
	cfgPath := filepath.Join(work, "central.json")
	if err := os.WriteFile(cfgPath, cfgJS, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(work, "central.sock")
	centralLog, err := os.Create(filepath.Join(work, "central.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer centralLog.Close()
	var cproc *exec.Cmd
	startCentral := func() {
		cproc = exec.Command("ip", "netns", "exec", ctl, bins["kiln-central"], "-config", cfgPath, "-listen", "unix:"+sock, "-report", "10s")
		cproc.Stdout, cproc.Stderr = centralLog, centralLog
		cproc.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cproc.Start(); err != nil {
			t.Fatal(err)
		}
	}
	stopCentral := func() {
		if cproc == nil {
			return
		}
		_ = cproc.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cproc.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cproc.Process.Kill()
			<-done
		}
		cproc = nil
	}
	defer stopCentral()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
	lag := func() map[string]central.SiteLag {
		resp, err := hc.Get("http://central/v1/central/sites")
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		var out struct{ Items []central.SiteLag }
		if json.NewDecoder(resp.Body).Decode(&out) != nil {
			return nil
		}
		m := map[string]central.SiteLag{}
		for _, l := range out.Items {
			m[l.Site] = l
		}
		return m
	}

	// The six sites.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute+time.Duration(perSite)*time.Second)
	defer cancel()
	runs := make(chan runOut, nSites)
	for i := 1; i <= nSites; i++ {
		logf, err := os.Create(siteWork[i] + ".log")
		if err != nil {
			t.Fatal(err)
		}
		defer logf.Close()
		o := fleetsim.Options{N: perSite, Work: siteWork[i], Prefix: "kc" + tag + "s" + strconv.Itoa(i),
			KilnBin: bins["kiln"], EnvDir: envDir, AgentPoll: time.Second, ImageMiB: 2, EnvBytes: 256 << 10,
			APIListen: "0.0.0.0:7480", Hold: filepath.Join(work, fmt.Sprintf("hold-%d", i)), Out: logf,
			HoldMax: 10*time.Minute + time.Duration(perSite*nSites)*50*time.Millisecond,
			OnLab: func(srv string) error {
				wan := "wan" + strconv.Itoa(i)
				for _, s := range [][]string{
					{"link", "add", wan, "netns", ctl, "type", "veth", "peer", "name", "wan0", "netns", srv},
					{"-n", ctl, "addr", "add", fmt.Sprintf("10.250.%d.1/30", i), "dev", wan},
					{"-n", srv, "addr", "add", fmt.Sprintf("10.250.%d.2/30", i), "dev", "wan0"},
					{"-n", ctl, "link", "set", wan, "up"},
					{"-n", srv, "link", "set", "wan0", "up"},
				} {
					if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
						return fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, bytes.TrimSpace(out))
					}
				}
				return nil
			}}
		if i == remSite {
			o.Day2 = &fleetsim.Day2Options{Hour: 20 * time.Second, FailMark: remMark}
		}
		go func() {
			res, err := fleetsim.Run(ctx, o)
			runs <- runOut{i: i, res: res, err: err}
		}()
	}
	startCentral()
	tail := func(p string) string {
		b, _ := os.ReadFile(p)
		if len(b) > 3000 {
			b = b[len(b)-3000:]
		}
		return string(b)
	}
	finished := map[int]runOut{}
	fatal := func(format string, a ...any) {
		t.Helper()
		t.Logf("central log:\n%s", tail(centralLog.Name()))
		for i := 1; i <= nSites; i++ {
			t.Logf("site-%d log:\n%s", i, tail(siteWork[i]+".log"))
		}
		// End the sites' runs and wait for them: each tears its lab's
		// namespaces down when it returns, which a Fatalf now would skip.
		cancel()
		for wait := time.After(2 * time.Minute); len(finished) < nSites; {
			select {
			case r := <-runs:
				finished[r.i] = r
			case <-wait:
				t.Fatalf("%s (and %d site runs did not end within 2 min of the cancel)", fmt.Sprintf(format, a...), nSites-len(finished))
			}
		}
		t.Fatalf(format, a...)
	}
	poll := func(what string, limit time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for !ok() {
			select {
			case r := <-runs:
				finished[r.i] = r
				if r.err != nil {
					fatal("site-%d: %v (while waiting for %s)", r.i, r.err, what)
				}
			case <-time.After(500 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				fatal("%s: not within %s", what, limit)
			}
		}
	}
	// Site 4's cut, from its first failure for `cut`, beside site 3's.
	var remStart, remEnd time.Time
	var remErr error
	remDone := make(chan struct{})
	go func() {
		defer close(remDone)
		for {
			if _, err := os.Stat(remMark); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		wan := "wan" + strconv.Itoa(remSite)
		remStart = time.Now()
		if out, err := exec.Command("ip", "-n", ctl, "link", "set", wan, "down").CombinedOutput(); err != nil {
			remErr = fmt.Errorf("cut %s: %v: %s", wan, err, out)
			return
		}
		time.Sleep(cut)
		if out, err := exec.Command("ip", "-n", ctl, "link", "set", wan, "up").CombinedOutput(); err != nil {
			remErr = fmt.Errorf("heal %s: %v: %s", wan, err, out)
		}
		remEnd = time.Now()
	}()
	cs := fmt.Sprintf("site-%d", cutSite)
	// Cut once site 3's feed flows into the central and its machines are
	// being provisioned: the central has 10 events per machine of it (a
	// build writes about 45), so the cut falls in the storm, not before it.
	poll("site-3 events at the central", 3*time.Minute+time.Duration(perSite)*100*time.Millisecond, func() bool {
		return lag()[cs].Events >= 10*perSite
	})
	wan := "wan" + strconv.Itoa(cutSite)
	cutStart := time.Now()
	ipc(t, "-n", ctl, "link", "set", wan, "down")
	before := lag()[cs]
	t.Logf("wan cut %s at cursor %d (%d events)", cs, before.Cursor, before.Events)
	time.Sleep(cut / 2)
	stopCentral() // a restart mid-cut: the cursors must resume from the state file
	startCentral()
	time.Sleep(cut - cut/2)
	during := lag()[cs]
	ipc(t, "-n", ctl, "link", "set", wan, "up")
	cutEnd := time.Now()
	t.Logf("wan healed %s after %.0f s: central at cursor %d reachable %v errors %d (%s)", cs, cutEnd.Sub(cutStart).Seconds(),
		during.Cursor, during.Reachable, during.Errors, during.LastError)

	// Every site finished and dumped its feed; the central catches up.
	heads := make([]uint64, nSites+1)
	// The limits grow with the sites' size: six 2,000-machine storms share
	// this machine's cores.
	scale := time.Duration(perSite*nSites) * 50 * time.Millisecond
	poll("every site's run and dump", 10*time.Minute+scale, func() bool {
		for i := 1; i <= nSites; i++ {
			b, err := os.ReadFile(filepath.Join(work, fmt.Sprintf("hold-%d.ready", i)))
			if err != nil {
				return false
			}
			heads[i], _ = strconv.ParseUint(string(b), 10, 64)
		}
		return true
	})
	select {
	case <-remDone:
	case <-time.After(cut + time.Minute):
		fatal("site-%d's day 2 never made a machine Critical (no remediation cut)", remSite)
	}
	if remErr != nil || remEnd.IsZero() {
		fatal("site-%d's WAN cut: %v", remSite, remErr)
	}
	poll("the central caught up", 2*time.Minute+scale/5, func() bool {
		l := lag()
		for i := 1; i <= nSites; i++ {
			if l[fmt.Sprintf("site-%d", i)].Cursor < heads[i] {
				return false
			}
		}
		return true
	})
	final := lag()
	stopCentral()

	// Compare.
	total, equal, gaps, dups, mismatches := 0, 0, 0, 0, 0
	var inCut, provInCut, remInCut, remTransInCut int
	for i := 1; i <= nSites; i++ {
		name := fmt.Sprintf("site-%d", i)
		site := readDump(t, filepath.Join(siteWork[i], "events.jsonl"))
		cp, err := central.ReadCopy(cfg.StatePath, name)
		if err != nil {
			t.Fatal(err)
		}
		type key struct {
			i uint64
			s int
		}
		held := map[key]api.Event{}
		for _, e := range cp.Events {
			if _, dup := held[key{e.Index, e.Seq}]; dup {
				dups++
			}
			held[key{e.Index, e.Seq}] = e
		}
		ok := len(cp.Resyncs) == 0
		inSite := map[key]bool{}
		for _, e := range site {
			if inSite[key{e.Index, e.Seq}] {
				t.Errorf("%s: the site's own feed repeats event %d.%d", name, e.Index, e.Seq)
			}
			inSite[key{e.Index, e.Seq}] = true
			c, has := held[key{e.Index, e.Seq}]
			if !has {
				gaps++
				ok = false
				continue
			}
			a, _ := json.Marshal(e)
			b, _ := json.Marshal(c)
			if !bytes.Equal(a, b) {
				mismatches++
				ok = false
				t.Errorf("%s event %d.%d: site %s, central %s", name, e.Index, e.Seq, a, b)
			}
			if i == remSite && !e.Time.Before(remStart) && e.Time.Before(remEnd) {
				remInCut++
				if e.Kind == "transition" && e.Actor == "remediation" {
					remTransInCut++
				}
			}
			if i == cutSite && !e.Time.Before(cutStart) && e.Time.Before(cutEnd) {
				inCut++
				if e.Kind == "transition" && e.To == "provisioned" {
					provInCut++
				}
			}
		}
		for _, e := range cp.Events {
			if e.Index <= heads[i] && !inSite[key{e.Index, e.Seq}] {
				dups++ // held by the central, never served by the site
				ok = false
			}
		}
		if ok {
			equal++
		}
		total += len(site)
		t.Logf("%s: site %d events (head %d), central %d events (cursor %d), resyncs %d, errors %d", name, len(site), heads[i],
			len(cp.Events), cp.Cursor, len(cp.Resyncs), final[name].Errors)
	}
	for i := 1; i <= nSites; i++ {
		_ = os.WriteFile(filepath.Join(work, fmt.Sprintf("hold-%d", i)), nil, 0o644)
	}
	provisioned := 0
	for len(finished) < nSites {
		r := <-runs
		finished[r.i] = r
	}
	for i := 1; i <= nSites; i++ {
		r := finished[i]
		if r.err != nil || r.res == nil {
			fatal("site-%d: %v", i, r.err)
		}
		provisioned += r.res.Provisioned
		want := perSite // a day-2 site's storm builds only the machines it claims
		if d := r.res.Day2; d != nil {
			want = d.Claimed
		}
		if r.res.Provisioned != want || r.res.SimErrors != 0 {
			t.Errorf("site-%d: %d of %d provisioned, %d failed, %d simulator errors", i, r.res.Provisioned, want, r.res.Failed, r.res.SimErrors)
		}
	}
	d2 := finished[remSite].res.Day2
	if d2 == nil || d2.AFailed == 0 || d2.ARMA != d2.AFailed || d2.ASparesProvisioned != d2.AFailed || d2.ABrakeEngaged || !d2.BBrakeEngaged {
		t.Errorf("site-%d's day 2: %+v; want every mode-A failure rma with its spare provisioned, the brake released in mode A and engaged in mode B", remSite, d2)
	}
	line := fmt.Sprintf("central: %d sites, %d machines provisioned; wan cut %s %.0f s (%d events, %d provisioned at the site meanwhile; central restarted mid-cut); wan cut site-%d %.0f s from its first failure (%d events, %d remediation transitions meanwhile; ladder %s); events central=site for %d/%d sites (%d events); gaps %d; duplicates %d; mismatches %d",
		nSites, provisioned, cs, cutEnd.Sub(cutStart).Seconds(), inCut, provInCut, remSite, remEnd.Sub(remStart).Seconds(), remInCut, remTransInCut, d2Ladder(d2),
		equal, nSites, total, gaps, dups, mismatches)
	fmt.Println(line)
	t.Log(line)
	if equal != nSites || gaps != 0 || dups != 0 || mismatches != 0 {
		fatal("%s", line)
	}
	if inCut == 0 {
		t.Errorf("site-3 wrote no event during the cut: the cut did not overlap its provisioning")
	}
	if remTransInCut == 0 {
		t.Errorf("site-%d made no remediation transition during its cut", remSite)
	}
	if during.Reachable {
		t.Errorf("the central reported %s reachable during the cut", cs)
	}
}

func d2Ladder(d *fleetsim.Day2Result) string {
	if d == nil || d.ALadder == "" {
		return "-"
	}
	return d.ALadder
}

func readDump(t *testing.T, path string) []api.Event {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []api.Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e api.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
