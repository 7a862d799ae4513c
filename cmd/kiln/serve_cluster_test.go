package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// siteRaft is the part of GET /v1/site/status this test reads.
type siteRaft struct {
	Raft struct {
		Leader   string            `json:"leader"`
		IsLeader bool              `json:"is_leader"`
		Stats    map[string]string `json:"stats"`
	} `json:"raft"`
}

func (s *served) raft() (siteRaft, error) {
	var st siteRaft
	code, err := s.do("GET", "/v1/site/status", nil, &st)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("site status: HTTP %d", code)
	}
	return st, err
}

// machineIDs lists every machine with ?consistent=true (a raft barrier
// through the leader first), page by page.
func (s *served) machineIDs() (map[string]bool, error) {
	ids := map[string]bool{}
	after := ""
	for {
		var page struct {
			Items []struct {
				ID string `json:"id"`
			} `json:"items"`
			Next string `json:"next"`
		}
		code, err := s.do("GET", "/v1/machines?consistent=true&limit=500&after="+url.QueryEscape(after), nil, &page)
		if err != nil || code != http.StatusOK {
			return nil, fmt.Errorf("consistent list after %q: HTTP %d, %v", after, code, err)
		}
		for _, m := range page.Items {
			ids[m.ID] = true
		}
		if page.Next == "" {
			return ids, nil
		}
		after = page.Next
	}
}

// waitFor polls cond every 100 ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestServeClusterLeaderSIGKILL runs a site cluster of three `kiln serve`
// processes on loopback (the first bootstraps, two join with
// raft.bootstrap: false and raft.join), streams machine creations at every
// node's API, and kills the leader's process with SIGKILL in the middle of
// the stream. Then: the two survivors elect a new leader; every write
// acknowledged (201) before or after the kill is present on both survivors
// (read with ?consistent=true); writes resume through the survivors; and the
// killed node, restarted on its data directory, catches up on everything.
func TestServeClusterLeaderSIGKILL(t *testing.T) {
	start := time.Now()
	a := newServeNode(t, "site-a", nil)
	b := newServeNode(t, "site-b", []string{a.fwd})
	c := newServeNode(t, "site-c", []string{a.fwd, b.fwd})
	nodes := []*serveNode{a, b, c}
	procs := map[*serveNode]*served{a: a.start(t)}
	// Each joiner gets its own one-time token (`kiln cluster token create`);
	// raft and the forward RPC then run over mutual TLS.
	b.setJoinToken(t, joinToken(t, a.bin, procs[a]))
	c.setJoinToken(t, joinToken(t, a.bin, procs[a]))
	procs[b] = b.start(t)
	procs[c] = c.start(t)
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				st, err := procs[n].raft()
				t.Logf("--- %s: raft %+v (%v); log (tail)\n%s", n.id, st.Raft, err, tail(procs[n].log.String(), 30))
			}
		}
	})
	// Membership: the leader sees two peers (the joins are done).
	var leader *serveNode
	if !waitFor(20*time.Second, func() bool {
		for _, n := range nodes {
			if st, err := procs[n].raft(); err == nil && st.Raft.IsLeader && st.Raft.Stats["num_peers"] == "2" {
				leader = n
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no leader with two peers in 20 s; logs:\n--- a\n%s\n--- b\n%s\n--- c\n%s", procs[a].log, procs[b].log, procs[c].log)
	}
	t.Logf("cluster of 3 up in %.1f s, leader %s", time.Since(start).Seconds(), leader.id)

	type ack struct {
		id    string
		after bool // acknowledged after the kill
	}
	var (
		mu     sync.Mutex
		acked  []ack
		killed bool
		other  = map[string]int{} // unacknowledged answers, for the failure message
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w, n := range nodes {
		wg.Add(1)
		go func(w int, s *served) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				m, code, err := s.createMachine(fmt.Sprintf("site-%d-%d", w, i), fmt.Sprintf("02:00:01:%02x:%02x:%02x", w, (i>>8)&0xff, i&0xff))
				mu.Lock()
				switch {
				case err == nil && code == http.StatusCreated && m.ID != "":
					acked = append(acked, ack{m.ID, killed})
				case err != nil:
					other["error"]++
				default:
					other[fmt.Sprint(code)]++
				}
				mu.Unlock()
				if err != nil || code != http.StatusCreated {
					time.Sleep(50 * time.Millisecond) // the node is gone or has no leader yet
				}
			}
		}(w, procs[n])
	}
	count := func(afterKill bool) int {
		mu.Lock()
		defer mu.Unlock()
		k := 0
		for _, a := range acked {
			if !afterKill || a.after {
				k++
			}
		}
		return k
	}
	// Under -race on a loaded 2-core machine a replicated write can take
	// ~100 ms: wait for up to 20 s for a stream to be under way.
	if !waitFor(20*time.Second, func() bool { return count(false) >= 100 }) && count(false) < 20 {
		close(stop)
		wg.Wait()
		t.Fatalf("only %d writes acknowledged before the kill (others: %v)", count(false), other)
	}
	mu.Lock()
	killed = true
	before := len(acked)
	mu.Unlock()
	procs[leader].kill(t)
	killedAt := time.Now()
	t.Logf("SIGKILL of the leader %s (pid %d) after %d acknowledged writes", leader.id, procs[leader].cmd.Process.Pid, before)

	var survivors []*serveNode
	for _, n := range nodes {
		if n != leader {
			survivors = append(survivors, n)
		}
	}
	var newLeader *serveNode
	if !waitFor(20*time.Second, func() bool {
		for _, n := range survivors {
			if st, err := procs[n].raft(); err == nil && st.Raft.IsLeader {
				newLeader = n
				return true
			}
		}
		return false
	}) {
		close(stop)
		wg.Wait()
		t.Fatalf("no new leader among the survivors 20 s after the kill; logs:\n--- %s\n%s\n--- %s\n%s",
			survivors[0].id, procs[survivors[0]].log, survivors[1].id, procs[survivors[1]].log)
	}
	t.Logf("new leader %s elected %.1f s after the kill", newLeader.id, time.Since(killedAt).Seconds())
	resumed := waitFor(20*time.Second, func() bool { return count(true) >= 50 })
	close(stop)
	wg.Wait()
	if !resumed && count(true) == 0 {
		t.Fatalf("no write acknowledged in 20 s after the new leader (answers: %v)", other)
	}
	total := count(false)
	t.Logf("%d writes acknowledged, %d of them after the kill (unacknowledged answers: %v)", total, count(true), other)

	check := func(n *serveNode) {
		t.Helper()
		ids, err := procs[n].machineIDs()
		if err != nil {
			t.Fatalf("%s: %v", n.id, err)
		}
		missing := 0
		mu.Lock()
		defer mu.Unlock()
		for _, a := range acked {
			if !ids[a.id] {
				if missing++; missing <= 5 {
					t.Errorf("%s: acknowledged machine %s (after the kill: %v) is missing", n.id, a.id, a.after)
				}
			}
		}
		if missing > 0 {
			t.Fatalf("%s: %d of %d acknowledged writes missing", n.id, missing, len(acked))
		}
	}
	for _, n := range survivors {
		check(n)
	}

	// The killed node restarts on its data directory (it has state: no join)
	// and catches up with what was written while it was down.
	restart := time.Now()
	procs[leader] = leader.start(t)
	check(leader)
	if st, err := procs[leader].raft(); err != nil || st.Raft.Leader == "" {
		t.Fatalf("restarted %s: no leader known (%v)", leader.id, err)
	}
	t.Logf("restarted %s caught up on all %d writes in %.1f s; whole test %.1f s", leader.id, total,
		time.Since(restart).Seconds(), time.Since(start).Seconds())
	if strings.Contains(procs[newLeader].log.String(), "panic") {
		t.Errorf("%s logged a panic:\n%s", newLeader.id, procs[newLeader].log)
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
