package leasecheck

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"kiln/deploy/lab/testkit"
	"kiln/deploy/lab/testreq"
)

// The lab's network, in namespaces the test creates and removes:
//
//	PREFIX-lan   br0 (provisioning)          br1 (cluster) 10.94.0.254/24
//	PREFIX-k1    p0 10.95.0.1/20 ── kp1 ─ br0   c0 10.94.0.1/24 ── kc1 ─ br1
//	PREFIX-k2    p0 10.95.0.2/20 ── kp2 ─ br0   c0 10.94.0.2/24 ── kc2 ─ br1
//	PREFIX-k3    p0 10.95.0.3/20 ── kp3 ─ br0   c0 10.94.0.3/24 ── kc3 ─ br1
//	PREFIX-cli   c0 10.95.0.10/20 ── kcl ─ br0  (every simulated client: AF_PACKET)
//
// Each node's raft, forward RPC and REST API listen on its cluster address
// (10.94.0.N:7481, :7482, :7480); its DHCP serves 10.95.0.0/20 on p0 with
// the pool from 10.95.8.0. A partition takes the node's cluster port on br1
// down (kcN: the cable pulled at the switch), so the node keeps serving
// DHCP clients but cannot reach raft; an isolation takes both ports down.
// The pool is routed via the clients' address in every node's namespace, so
// a node's unicast replies to thousands of ciaddrs need one neighbour entry.
const (
	subnetCIDR = "10.95.0.0/20"
	cliIP      = "10.95.0.10"
	poolBase   = "10.95.8.0"
	poolRoute  = "10.95.8.0/21"
	maxPool    = 2048
	apiPort    = 7480
)

func nodeProvIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 95, 0, byte(i + 1)})
}
func nodeClusterIP(i int) string { return fmt.Sprintf("10.94.0.%d", i+1) }

// poolEnd is the last of n pool addresses from poolBase.
func poolEnd(n int) netip.Addr {
	a := netip.MustParseAddr(poolBase)
	for range n - 1 {
		a = a.Next()
	}
	return a
}

type lab struct {
	prefix string
	lan    string
	cli    string
	nodes  []*node
	bin    string
	http   *http.Client // dials from inside the lan namespace (br1)
	// server MACs of the nodes' provisioning ports, for unicast frames
	serverMACs map[netip.Addr]net.HardwareAddr
}

// node is one `kiln serve` of the lab and its files.
type node struct {
	i      int
	id     string
	ns     string
	dir    string
	cfg    string
	data   string
	api    string
	logf   *os.File
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	token  string
	up     bool
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newLab builds the network above and writes the nodes' configurations.
func newLab(t *testing.T, bin string, pool int, lease time.Duration) *lab {
	t.Helper()
	l := &lab{prefix: "lc" + testkit.ID(), bin: bin, serverMACs: map[netip.Addr]net.HardwareAddr{}}
	l.lan = testkit.Netns(t, l.prefix+"-lan")
	l.cli = testkit.Netns(t, l.prefix+"-cli")
	for _, br := range []string{"br0", "br1"} {
		testkit.IP(t, "-n", l.lan, "link", "add", br, "type", "bridge", "stp_state", "0", "forward_delay", "0")
		testkit.IP(t, "-n", l.lan, "link", "set", br, "up")
	}
	testkit.IP(t, "-n", l.lan, "addr", "add", "10.94.0.254/24", "dev", "br1")
	port := func(ns, ifname, addr, peer, br string) {
		testkit.IP(t, "link", "add", ifname, "netns", ns, "type", "veth", "peer", "name", peer, "netns", l.lan)
		testkit.IP(t, "-n", l.lan, "link", "set", peer, "master", br, "up")
		testkit.IP(t, "-n", ns, "addr", "add", addr, "dev", ifname)
		testkit.IP(t, "-n", ns, "link", "set", ifname, "up")
	}
	port(l.cli, "c0", cliIP+"/20", "kcl", "br0")
	for i := range 3 {
		n := &node{i: i, id: fmt.Sprintf("lc-%d", i+1), ns: testkit.Netns(t, fmt.Sprintf("%s-k%d", l.prefix, i+1))}
		port(n.ns, "p0", nodeProvIP(i).String()+"/20", fmt.Sprintf("kp%d", i+1), "br0")
		port(n.ns, "c0", nodeClusterIP(i)+"/24", fmt.Sprintf("kc%d", i+1), "br1")
		testkit.IP(t, "-n", n.ns, "route", "add", poolRoute, "via", cliIP, "dev", "p0")
		var link []struct {
			Address string `json:"address"`
		}
		if err := json.Unmarshal([]byte(run(t, "ip", "-n", n.ns, "-j", "link", "show", "p0")), &link); err != nil || len(link) != 1 {
			t.Fatalf("p0 of %s: %v", n.ns, err)
		}
		mac, err := net.ParseMAC(link[0].Address)
		if err != nil {
			t.Fatal(err)
		}
		l.serverMACs[nodeProvIP(i)] = mac
		n.dir = t.TempDir()
		n.cfg, n.data = filepath.Join(n.dir, "kiln.yaml"), filepath.Join(n.dir, "data")
		n.api = fmt.Sprintf("http://%s:%d", nodeClusterIP(i), apiPort)
		raft := "  bootstrap: true\n"
		if i > 0 {
			raft = fmt.Sprintf("  bootstrap: false\n  join: [\"%s:7482\"]\n", nodeClusterIP(0))
		}
		cfg := fmt.Sprintf(`node_id: %s
data_dir: %s
log:
  level: info
api:
  addr: %s:%d
raft:
  addr: %s:7481
  forward_addr: %s:7482
%sboot:
  interface: p0
  server_ip: %s
  http_addr: %s:8080
  dhcp:
    enabled: true
    mode: authoritative
    subnets:
      - cidr: %s
        pool_start: %s
        pool_end: %s
        lease_time: %s
`, n.id, n.data, nodeClusterIP(i), apiPort, nodeClusterIP(i), nodeClusterIP(i), raft, nodeProvIP(i), nodeProvIP(i),
			subnetCIDR, poolBase, poolEnd(pool), lease)
		if err := os.WriteFile(n.cfg, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		l.nodes = append(l.nodes, n)
	}
	tr := &http.Transport{DialContext: nsDialer(l.lan), Proxy: nil, MaxIdleConnsPerHost: 4}
	l.http = &http.Client{Transport: tr, Timeout: 5 * time.Second}
	t.Cleanup(func() {
		for _, n := range l.nodes {
			n.stop(syscall.SIGKILL, 0)
		}
		tr.CloseIdleConnections()
	})
	return l
}

// nsDialer dials from inside namespace ns: a goroutine locked to its thread
// enters ns (setns(2)), connects (a socket stays in the namespace it was
// made in) and goes back; a thread that cannot go back ends with its
// goroutine.
func nsDialer(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type res struct {
			c   net.Conn
			err error
		}
		ch := make(chan res, 1)
		go func() {
			runtime.LockOSThread()
			self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
			if err != nil {
				runtime.UnlockOSThread()
				ch <- res{nil, err}
				return
			}
			defer self.Close()
			target, err := os.Open("/run/netns/" + ns)
			if err != nil {
				runtime.UnlockOSThread()
				ch <- res{nil, err}
				return
			}
			defer target.Close()
			if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
				runtime.UnlockOSThread()
				ch <- res{nil, err}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if rerr := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); rerr != nil {
				if c != nil {
					c.Close()
				}
				ch <- res{nil, rerr} // the thread stays locked and dies with the goroutine
				return
			}
			runtime.UnlockOSThread()
			ch <- res{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// start runs `kiln serve` for n in its namespace (ip netns exec execs kiln
// in place, so the process is kiln's) and waits for /readyz.
func (l *lab) start(t *testing.T, n *node) {
	t.Helper()
	if err := l.startErr(n); err != nil {
		t.Fatal(err)
	}
}

func (l *lab) startErr(n *node) error {
	n.mu.Lock()
	if n.logf == nil {
		f, err := os.OpenFile(filepath.Join(n.dir, "kiln.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			n.mu.Unlock()
			return err
		}
		n.logf = f
	}
	fmt.Fprintf(n.logf, "=== leasecheck: start at %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command("ip", "netns", "exec", n.ns, l.bin, "serve", "--config", n.cfg)
	cmd.Stdout, cmd.Stderr = n.logf, n.logf
	if err := cmd.Start(); err != nil {
		n.mu.Unlock()
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	n.cmd, n.exited, n.up = cmd, exited, true
	n.mu.Unlock()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("%s: kiln serve exited at start:\n%s", n.id, n.logTail(30))
		default:
		}
		if resp, err := l.http.Get(n.api + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				tok, err := os.ReadFile(filepath.Join(n.data, "admin.token"))
				if err != nil {
					return err
				}
				n.token = strings.TrimSpace(string(tok))
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s: not ready in 90 s:\n%s", n.id, n.logTail(30))
}

// stop ends n's process with sig (SIGKILL: no shutdown code runs; SIGTERM:
// a clean stop) and waits for it, up to grace (then SIGKILL). It returns
// how long the process took to exit and whether it had to be killed.
func (n *node) stop(sig syscall.Signal, grace time.Duration) (time.Duration, bool) {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.up = false
	n.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return 0, false
	}
	t0 := time.Now()
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
		return time.Since(t0), false
	case <-time.After(grace):
	}
	_ = cmd.Process.Kill()
	<-exited
	return time.Since(t0), true
}

// signal sends sig to n's running process.
func (n *node) signal(sig syscall.Signal) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil || !n.up {
		return fmt.Errorf("%s: not running", n.id)
	}
	return n.cmd.Process.Signal(sig)
}

func (n *node) isUp() bool { n.mu.Lock(); defer n.mu.Unlock(); return n.up }

func (n *node) logTail(k int) string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "kiln.log"))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > k {
		lines = lines[len(lines)-k:]
	}
	return strings.Join(lines, "\n")
}

// get GETs path on n's API with its admin token into out.
func (l *lab) get(n *node, path string, out any) error {
	req, _ := http.NewRequest("GET", n.api+path, nil)
	req.Header.Set("Authorization", "Bearer "+n.token)
	resp, err := l.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s %s: HTTP %d", n.id, path, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

type raftStatus struct {
	Raft struct {
		Leader   string            `json:"leader"`
		IsLeader bool              `json:"is_leader"`
		Stats    map[string]string `json:"stats"`
	} `json:"raft"`
}

// leader returns the node that says it is the leader with two peers, or nil.
func (l *lab) leader() *node {
	for _, n := range l.nodes {
		if !n.isUp() {
			continue
		}
		var st raftStatus
		if err := l.get(n, "/v1/site/status", &st); err == nil && st.Raft.IsLeader {
			return n
		}
	}
	return nil
}

// form starts node 1 (bootstrap), then nodes 2 and 3 with join tokens from
// `kiln cluster token create`, and waits for a leader with two peers.
func (l *lab) form(t *testing.T) {
	t.Helper()
	l.start(t, l.nodes[0])
	for _, n := range l.nodes[1:] {
		out := run(t, "ip", "netns", "exec", l.nodes[0].ns, l.bin, "--server", l.nodes[0].api, "--token", l.nodes[0].token,
			"cluster", "token", "create", "--ttl", "30m", "-o", "json")
		var tok struct {
			Token string `json:"token"`
		}
		if err := json.Unmarshal([]byte(out), &tok); err != nil || tok.Token == "" {
			t.Fatalf("cluster token create: %q (%v)", out, err)
		}
		b, err := os.ReadFile(n.cfg)
		if err != nil {
			t.Fatal(err)
		}
		cfg := strings.Replace(string(b), "\nboot:\n", "\n  join_token: "+tok.Token+"\nboot:\n", 1)
		if err := os.WriteFile(n.cfg, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		l.start(t, n)
	}
	if !waitUntil(60*time.Second, func() bool {
		for _, n := range l.nodes {
			var st raftStatus
			if l.get(n, "/v1/site/status", &st) == nil && st.Raft.IsLeader && st.Raft.Stats["num_peers"] == "2" {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no leader with two peers in 60 s:\n%s", l.nodes[0].logTail(30))
	}
}

func waitUntil(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// link sets node n's port on br1 (cluster) and, with prov, on br0 up or down.
func (l *lab) link(n *node, prov bool, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	ports := []string{fmt.Sprintf("kc%d", n.i+1)}
	if prov {
		ports = append(ports, fmt.Sprintf("kp%d", n.i+1))
	}
	for _, p := range ports {
		if out, err := exec.Command("ip", "-n", l.lan, "link", "set", p, state).CombinedOutput(); err != nil {
			return fmt.Errorf("ip link set %s %s: %v: %s", p, state, err, out)
		}
	}
	return nil
}

// converge waits until every node reports the same applied index twice in
// a row (no write in flight), up to d.
func (l *lab) converge(d time.Duration) (string, bool) {
	prev := ""
	var last string
	ok := waitUntil(d, func() bool {
		var idx []string
		for _, n := range l.nodes {
			var st raftStatus
			if err := l.get(n, "/v1/site/status", &st); err != nil {
				idx = append(idx, n.id+"=?")
				continue
			}
			idx = append(idx, st.Raft.Stats["applied_index"])
		}
		last = strings.Join(idx, " ")
		same := !strings.Contains(last, "?") && idx[0] == idx[1] && idx[1] == idx[2]
		done := same && last == prev
		prev = last
		return done
	})
	return last, ok
}

// leaseGrants reads every "lease" event of n's log (GET /v1/events, paged):
// the holder or state changes of addresses, at the leader's time.
func (l *lab) leaseGrants(n *node) ([]Grant, int, error) {
	var out []Grant
	after, total := uint64(0), 0
	for {
		var page struct {
			Events []struct {
				Index   uint64    `json:"index"`
				Time    time.Time `json:"time"`
				Subject string    `json:"subject"`
				Kind    string    `json:"kind"`
				To      string    `json:"to"`
				Message string    `json:"message"`
			} `json:"events"`
			Next uint64 `json:"next"`
		}
		if err := l.get(n, "/v1/events?limit=1000&after="+strconv.FormatUint(after, 10), &page); err != nil {
			return nil, 0, err
		}
		if len(page.Events) == 0 {
			return out, total, nil
		}
		for _, e := range page.Events {
			total++
			if e.Kind != "lease" {
				continue
			}
			ip, err := netip.ParseAddr(e.Message)
			if err != nil {
				return nil, 0, fmt.Errorf("%s: lease event %d: address %q", n.id, e.Index, e.Message)
			}
			out = append(out, Grant{MAC: strings.TrimPrefix(e.Subject, "lease/"), IP: ip, State: e.To, At: e.Time})
		}
		next := page.Next
		if next <= after {
			next = page.Events[len(page.Events)-1].Index
		}
		after = next
	}
}

// storeRecords reads a stopped node's address view: the lease_addrs bucket
// of its store/fsm.db (store/leases.go: key the address text, value the lease
// record as JSON), read-only. There is no REST route for leases; the file
// is the store's own, opened after the process has exited.
func storeRecords(n *node) (map[netip.Addr]Record, error) {
	db, err := bbolt.Open(filepath.Join(n.data, "store", "fsm.db"), 0o400, &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	out := map[netip.Addr]Record{}
	err = db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("lease_addrs"))
		if b == nil {
			return fmt.Errorf("%s: fsm.db has no lease_addrs bucket", n.id)
		}
		return b.ForEach(func(k, v []byte) error {
			ip, err := netip.ParseAddr(string(k))
			if err != nil {
				return fmt.Errorf("%s: lease_addrs key %q", n.id, k)
			}
			var r struct {
				MAC    string    `json:"mac"`
				IP     string    `json:"ip"`
				Expiry time.Time `json:"expiry"`
				State  string    `json:"state"`
			}
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("%s: lease_addrs %s: %v", n.id, k, err)
			}
			rip, _ := netip.ParseAddr(r.IP)
			out[ip] = Record{MAC: r.MAC, IP: rip, Expiry: r.Expiry, State: r.State}
			return nil
		})
	})
	return out, err
}

// sameRecords reports the first difference between two nodes' views.
func sameRecords(a, b map[netip.Addr]Record) string {
	if len(a) != len(b) {
		return fmt.Sprintf("%d records vs %d", len(a), len(b))
	}
	for k, ra := range a {
		rb, ok := b[k]
		if !ok || ra.MAC != rb.MAC || ra.State != rb.State || !ra.Expiry.Equal(rb.Expiry) {
			return fmt.Sprintf("%s: %+v vs %+v", k, ra, rb)
		}
	}
	return ""
}

func requireLab(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("leasecheck runs three kiln serve processes in network namespaces for a minute or more")
	}
	testreq.Root(t, "network namespaces, bridges and AF_PACKET sockets for three kiln serve nodes and the simulated clients", "ip")
}
