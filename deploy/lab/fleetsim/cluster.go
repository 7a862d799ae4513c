package fleetsim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// do calls the REST API of the node that answered last, and on a transport
// error or a 502/503/504 answer (a node down, an election under way) the
// next node, for up to a minute: the operator's client of a cluster. A
// body that is an io.Reader is sent once (it cannot be replayed).
func (f *fleet) do(ctx context.Context, method, path string, q url.Values, body any, ctype string, out any) error {
	_, once := body.(io.Reader)
	deadline := time.Now().Add(time.Minute)
	for try := 0; ; try++ {
		f.mu.Lock()
		k := f.nodes[f.cur]
		f.mu.Unlock()
		err := k.do(ctx, method, path, q, body, ctype, out)
		if err == nil || once || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		var ae *apiError
		if errors.As(err, &ae) && ae.Status != 502 && ae.Status != 503 && ae.Status != 504 {
			return err
		}
		f.mu.Lock()
		if f.nodes[f.cur] == k {
			f.cur = (f.cur + 1) % len(f.nodes)
		}
		f.mu.Unlock()
		if try%len(f.nodes) == len(f.nodes)-1 && !sleepCtx(ctx, time.Second) {
			return ctx.Err()
		}
	}
}

// leader is the node whose /v1/site/status says it leads, or nil.
func (f *fleet) leader(ctx context.Context) *kiln {
	for _, k := range f.nodes {
		if !k.running() {
			continue
		}
		var st struct {
			Raft struct {
				IsLeader bool `json:"is_leader"`
			} `json:"raft"`
		}
		c, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := k.do(c, "GET", "/v1/site/status", nil, nil, "", &st)
		cancel()
		if err == nil && st.Raft.IsLeader {
			return k
		}
	}
	return nil
}

// killLeader waits until KillLeaderAt after start, SIGKILLs the leader,
// waits for another node to lead, restarts the killed node after Down and
// waits until it is ready again. It records what it did in res.
func (f *fleet) killLeader(ctx context.Context, start time.Time, res *Result) error {
	if !sleepCtx(ctx, time.Until(start.Add(f.o.KillLeaderAt))) {
		return ctx.Err()
	}
	var old *kiln
	for deadline := time.Now().Add(30 * time.Second); old == nil; {
		if old = f.leader(ctx); old == nil {
			if time.Now().After(deadline) || !sleepCtx(ctx, 500*time.Millisecond) {
				return errors.New("fleetsim: no leader to kill")
			}
		}
	}
	building := 0
	for _, m := range f.machines {
		m.mu.Lock()
		if !m.t.writeStart.IsZero() && m.t.provisioned.IsZero() {
			building++
		}
		m.mu.Unlock()
	}
	t := time.Now()
	old.kill()
	res.KilledNode, res.KilledAt, res.KilledMidBuild = old.id, t.Sub(start).Seconds(), building
	f.say("fleet: %5.1f s  SIGKILL to the leader %s (%d machines mid-build)", res.KilledAt, old.id, building)
	for deadline := time.Now().Add(60 * time.Second); ; {
		if l := f.leader(ctx); l != nil && l != old {
			res.NewLeader, res.ElectedIn = l.id, time.Since(t).Seconds()
			f.say("fleet: %5.1f s  %s leads (%.1f s after the kill)", time.Since(start).Seconds(), l.id, res.ElectedIn)
			break
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 200*time.Millisecond) {
			return errors.New("fleetsim: no new leader 60 s after the kill")
		}
	}
	if !sleepCtx(ctx, time.Until(t.Add(f.o.Down))) {
		return ctx.Err()
	}
	if err := old.start(); err != nil {
		return err
	}
	if err := old.waitReady(ctx, 90*time.Second); err != nil {
		return err
	}
	res.RestartedAt = time.Since(start).Seconds()
	f.say("fleet: %5.1f s  %s restarted and ready", res.RestartedAt, old.id)
	return nil
}

// recordAck notes a DHCPACK the machine with mac received for ip.
func (f *fleet) recordAck(mac string, ip netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.acks == nil {
		f.acks = map[netip.Addr]map[string]bool{}
	}
	if f.acks[ip] == nil {
		f.acks[ip] = map[string]bool{}
	}
	f.acks[ip][mac] = true
	f.ackN++
}

// checkCluster is the end of a cluster run: on every node's replica each
// machine is provisioned (waiting up to 30 s for a replica to catch up),
// none went to provisioned more than once (the transitions in each node's
// event log), and no address is bound to two MACs, in any node's leases
// (GET /v1/leases), across the nodes, or in the ACKs the machines received.
func (f *fleet) checkCluster(ctx context.Context, res *Result) {
	problem := func(format string, a ...any) {
		s := fmt.Sprintf(format, a...)
		res.Problems = append(res.Problems, s)
		f.say("fleet: check: %s", s)
	}
	ours := map[string]bool{}
	for _, m := range f.machines {
		ours[m.id] = true
	}
	twice := map[string]bool{}
	bound := map[string]map[string]bool{} // ip -> MACs bound, over every node
	for _, k := range f.nodes {
		var prov int
		for deadline := time.Now().Add(30 * time.Second); ; {
			n, err := f.countState(ctx, k, "provisioned", ours)
			prov = n
			if err == nil && n == len(f.machines) || time.Now().After(deadline) {
				if err != nil {
					problem("%s: machines: %v", k.id, err)
				}
				break
			}
			sleepCtx(ctx, time.Second)
		}
		res.NodeProvisioned = append(res.NodeProvisioned, prov)
		if prov != len(f.machines) {
			problem("%s: %d of %d machines provisioned in its store", k.id, prov, len(f.machines))
		}
		per, err := f.provisionedTransitions(ctx, k)
		if err != nil {
			problem("%s: events: %v", k.id, err)
		}
		for id, n := range per {
			if n > 1 && ours[id] {
				twice[id] = true
			}
		}
		var ll struct {
			Time  time.Time `json:"time"`
			Items []struct {
				MAC    string    `json:"mac"`
				IP     string    `json:"ip"`
				Expiry time.Time `json:"expiry"`
				State  string    `json:"state"`
			} `json:"items"`
		}
		if err := k.do(ctx, "GET", "/v1/leases", url.Values{"consistent": {"true"}}, nil, "", &ll); err != nil {
			problem("%s: leases: %v", k.id, err)
			continue
		}
		live := 0
		for _, l := range ll.Items {
			if l.State != "bound" || !l.Expiry.After(ll.Time) {
				continue
			}
			live++
			if bound[l.IP] == nil {
				bound[l.IP] = map[string]bool{}
			}
			bound[l.IP][strings.ToLower(l.MAC)] = true
		}
		res.NodeLeases = append(res.NodeLeases, live)
		macs := map[string]bool{}
		for _, l := range ll.Items {
			if l.State == "bound" && l.Expiry.After(ll.Time) {
				macs[strings.ToLower(l.MAC)] = true
			}
		}
		for _, m := range f.machines {
			if !macs[m.mac.String()] {
				problem("%s: no live lease for %s (%s)", k.id, m.name, m.mac)
				break
			}
		}
	}
	for id := range twice {
		res.ProvisionedTwice++
		if len(res.Twice) < 5 {
			res.Twice = append(res.Twice, f.byID[id].name)
		}
	}
	dup := map[string]bool{}
	for ip, macs := range bound {
		if len(macs) > 1 {
			dup[ip] = true
			if len(res.Dups) < 5 {
				res.Dups = append(res.Dups, fmt.Sprintf("lease %s bound to %s", ip, strings.Join(keys(macs), ", ")))
			}
		}
	}
	f.mu.Lock()
	res.ACKs = f.ackN
	for ip, macs := range f.acks {
		if len(macs) > 1 {
			dup[ip.String()] = true
			if len(res.Dups) < 5 {
				res.Dups = append(res.Dups, fmt.Sprintf("ACK of %s to %s", ip, strings.Join(keys(macs), ", ")))
			}
		}
	}
	f.mu.Unlock()
	res.DupAddrs = len(dup)
	for _, m := range f.machines {
		m.mu.Lock()
		if m.t.downloads > 1 {
			res.Rebuilt++
		}
		m.mu.Unlock()
	}
	if res.ProvisionedTwice > 0 {
		problem("%d machines provisioned twice: %s", res.ProvisionedTwice, strings.Join(res.Twice, ", "))
	}
	if res.DupAddrs > 0 {
		problem("%d addresses bound to two clients: %s", res.DupAddrs, strings.Join(res.Dups, "; "))
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// countState counts the machines of ids in state on node k's replica (GET /v1/machines?state=, paged).
func (f *fleet) countState(ctx context.Context, k *kiln, state string, ids map[string]bool) (int, error) {
	n, after := 0, ""
	for {
		var ml struct {
			Items []struct {
				ID    string `json:"id"`
				State string `json:"state"`
			} `json:"items"`
			Next string `json:"next"`
		}
		q := url.Values{"limit": {"500"}, "state": {state}}
		if after != "" {
			q.Set("after", after)
		}
		if err := k.do(ctx, "GET", "/v1/machines", q, nil, "", &ml); err != nil {
			return n, err
		}
		for _, it := range ml.Items {
			if ids[it.ID] && it.State == state {
				n++
			}
		}
		if ml.Next == "" || len(ml.Items) == 0 {
			return n, nil
		}
		after = ml.Next
	}
}

// provisionedTransitions counts, per machine ID, the transitions to
// provisioned in node k's event log.
func (f *fleet) provisionedTransitions(ctx context.Context, k *kiln) (map[string]int, error) {
	per := map[string]int{}
	var after uint64
	for {
		var el struct {
			Events []struct {
				Index   uint64 `json:"index"`
				Subject string `json:"subject"`
				Kind    string `json:"kind"`
				To      string `json:"to"`
			} `json:"events"`
			Next uint64 `json:"next"`
		}
		q := url.Values{"after": {strconv.FormatUint(after, 10)}, "limit": {"1000"}}
		if err := k.do(ctx, "GET", "/v1/events", q, nil, "", &el); err != nil {
			return per, err
		}
		if len(el.Events) == 0 {
			return per, nil
		}
		for _, e := range el.Events {
			if e.Kind == "transition" && e.To == "provisioned" {
				per[strings.TrimPrefix(e.Subject, "machine/")]++
			}
			after = max(after, e.Index)
		}
		if el.Next > after {
			after = el.Next
		}
	}
}

// imageEverywhere waits (up to 90 s) until /v1/site/status lists the run's
// image on every node, as the HA lab's intake does.
func (f *fleet) imageEverywhere(ctx context.Context) error {
	t0 := time.Now()
	for {
		var st struct {
			Images []struct {
				ID    string   `json:"id"`
				Nodes []string `json:"nodes"`
			} `json:"images"`
		}
		if err := f.do(ctx, "GET", "/v1/site/status", nil, nil, "", &st); err == nil {
			for _, iv := range st.Images {
				if iv.ID == f.imageID && len(iv.Nodes) == len(f.nodes) {
					f.say("fleet: image on all %d nodes in %.1f s", len(f.nodes), time.Since(t0).Seconds())
					return nil
				}
			}
		}
		if time.Since(t0) > 90*time.Second {
			return fmt.Errorf("fleetsim: image %s not on every node 90 s after the upload", f.imageID)
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
}
