package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/cmd/kiln-agent/agent"
)

// mbrImage returns size bytes of pseudo-random content with an MBR whose one
// Linux partition starts at 1 MiB (the agent's stage step appends cidata to
// that table).
func mbrImage(size int) []byte {
	b := make([]byte, size)
	r := rand.New(rand.NewPCG(12, 6))
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	clear(b[:512])
	e := b[446:]
	e[4] = 0x83
	binary.LittleEndian.PutUint32(e[8:], 2048)
	binary.LittleEndian.PutUint32(e[12:], uint32(size/512-2048))
	b[510], b[511] = 0x55, 0xAA
	return b
}

// throttle is an http.RoundTripper that delivers image bodies (/images/...)
// at about rate bytes per second and counts the bytes delivered, so a test
// can act while the agent is in the middle of its write step.
type throttle struct {
	next      http.RoundTripper
	rate      int
	delivered atomic.Int64
	ranges    atomic.Int64 // image requests with a Range header (resumptions)
}

func (t *throttle) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil || !strings.HasPrefix(req.URL.Path, "/images/") {
		return resp, err
	}
	if req.Header.Get("Range") != "" {
		t.ranges.Add(1)
	}
	resp.Body = &slowBody{rc: resp.Body, t: t}
	return resp, nil
}

type slowBody struct {
	rc io.ReadCloser
	t  *throttle
}

func (s *slowBody) Read(p []byte) (int, error) {
	const chunk = 64 << 10
	if len(p) > chunk {
		p = p[:chunk]
	}
	n, err := s.rc.Read(p)
	s.t.delivered.Add(int64(n))
	time.Sleep(time.Duration(float64(n) / float64(s.t.rate) * float64(time.Second)))
	return n, err
}

func (s *slowBody) Close() error { return s.rc.Close() }

// bootURL returns the boot listener's base URL (http://boot.http_addr) of n.
func (n *serveNode) bootURL(t *testing.T) string {
	t.Helper()
	cfg, err := os.ReadFile(n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	addr := regexp.MustCompile(`http_addr: (\S+)`).FindSubmatch(cfg)
	if addr == nil {
		t.Fatalf("no boot http_addr in %s", cfg)
	}
	return "http://" + string(addr[1])
}

// buildImageSize is the image of the mid-build tests: 16 MiB, 8 s at the
// throttled 2 MiB/s.
const buildImageSize = 16 << 20

// midBuild is one machine whose real agent (in-process, over a fake sysfs
// root and a 64 MiB disk file) has been claimed and is streaming its image.
type midBuild struct {
	t        *testing.T
	id, mac  string
	boot     string // the boot listener the machine netboots from
	tok, url string // kiln.token and kiln.url of its boot script
	img      []byte
	disk     string
	th       *throttle
	rebooted chan string // the post-build netboot's script
}

type buildMachine struct {
	State  string `json:"state"`
	Reason string `json:"reason"`
	Step   *struct {
		Step, State string
	} `json:"step"`
}

func (b *midBuild) get(s *served) (buildMachine, error) {
	var m buildMachine
	code, err := s.do("GET", "/v1/machines/"+b.id, nil, &m)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("HTTP %d", code)
	}
	return m, err
}

func (b *midBuild) netboot() string {
	resp, err := http.Get(b.boot + "/ipxe/" + b.mac)
	if err != nil {
		b.t.Error(err)
		return ""
	}
	script, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return string(script)
}

// startMidBuild uploads an MBR image through s, creates a machine, netboots
// it from boot (its agent's kiln.url), runs the agent until the machine is
// available, provisions it and returns once a quarter of the image has
// streamed, with the machine in the write step.
func startMidBuild(t *testing.T, s *served, boot string) *midBuild {
	t.Helper()
	b := &midBuild{t: t, mac: "02:00:00:00:e2:12", boot: boot, img: mbrImage(buildImageSize),
		th: &throttle{next: http.DefaultTransport, rate: 2 << 20}, rebooted: make(chan string, 1)}
	sum := sha256.Sum256(b.img)
	req, _ := http.NewRequest("POST", s.api+"/v1/images?name=restart.raw&version=1&format=raw&sha256="+hex.EncodeToString(sum[:]),
		strings.NewReader(string(b.img)))
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("upload image: %d %s", resp.StatusCode, body)
	}
	imgID := regexp.MustCompile(`"id":"([^"]+)"`).FindSubmatch(body)
	created, code, err := s.createMachine("restart-1", b.mac)
	if err != nil || code != http.StatusCreated {
		t.Fatalf("create machine: %d %v", code, err)
	}
	b.id = created.ID
	// A node that cannot answer yet (a follower before it has applied the
	// machine's record) serves a script that retries: iPXE fetches again.
	var script string
	var tok, url []string
	waitFor(30*time.Second, func() bool {
		script = b.netboot()
		tok = regexp.MustCompile(agentapi.ArgToken + `=(\S+)`).FindStringSubmatch(script)
		url = regexp.MustCompile(agentapi.ArgURL + `=(\S+)`).FindStringSubmatch(script)
		return tok != nil
	})
	if tok == nil || url == nil || !strings.Contains(script, agentapi.ArgMachine+"="+b.id) {
		t.Fatalf("boot script for %s has no agent arguments:\n%s", b.id, script)
	}
	b.tok, b.url = tok[1], url[1]

	root := fakeRoot(t, b.mac, "0-1")
	b.disk = filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(b.disk, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(b.disk, 64<<20); err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{
		URL: b.url, MachineID: b.id, Token: b.tok, Root: root, IPMIDevice: filepath.Join(root, "no-ipmi"),
		HTTP: &http.Client{Transport: b.th},
		ListDisks: func() ([]agentapi.Disk, error) {
			return []agentapi.Disk{{Name: "vda", Path: b.disk, SizeBytes: 64 << 20, Health: "ok"}}, nil
		},
		// The machine reboots and netboots: the appliance tells it to boot its disk.
		Reboot:    func(bool) error { b.rebooted <- b.netboot(); return nil },
		RetryBase: 50 * time.Millisecond, RetryMax: 500 * time.Millisecond, ReadTestBytes: 1 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() { cancel(); <-done })

	var m buildMachine
	if !waitFor(30*time.Second, func() bool { m, _ = b.get(s); return m.State == "available" }) {
		t.Fatalf("machine %s is %s (%s), want available\n%s", b.id, m.State, m.Reason, tail(s.log.String(), 3000))
	}
	if code, err := s.do("POST", "/v1/machines/"+b.id+"/provision", map[string]any{"claim": map[string]any{"image": string(imgID[1])}}, nil); err != nil || code != http.StatusAccepted {
		t.Fatalf("provision: %d %v", code, err)
	}
	if !waitFor(60*time.Second, func() bool { return b.th.delivered.Load() >= buildImageSize/4 }) {
		m, _ = b.get(s)
		t.Fatalf("image stream did not start: machine %+v, %d bytes\n%s", m, b.th.delivered.Load(), tail(s.log.String(), 3000))
	}
	if m, _ = b.get(s); m.Step == nil || m.Step.Step != agentapi.StepWrite {
		t.Fatalf("machine not in the write step: %+v", m.Step)
	}
	return b
}

// finish waits for the post-build netboot and for the machine to be
// provisioned (read through s), then checks that the image was resumed by
// Range, not fetched again, that the disk holds it, and that every step's
// started and succeeded report is in the store, with no step failed.
func (b *midBuild) finish(s *served) buildMachine {
	t := b.t
	t.Helper()
	var m buildMachine
	select {
	case script := <-b.rebooted:
		if !strings.Contains(script, "exit") || strings.Contains(script, agentapi.ArgToken) {
			t.Errorf("post-build netboot got the agent again:\n%s", script)
		}
	case <-time.After(120 * time.Second):
		m, _ = b.get(s)
		t.Fatalf("agent did not finish the build: machine %+v, %d of %d bytes\n%s", m, b.th.delivered.Load(), buildImageSize, tail(s.log.String(), 3000))
	}
	if !waitFor(30*time.Second, func() bool { m, _ = b.get(s); return m.State == "provisioned" }) {
		t.Fatalf("machine %s is %s (%s), want provisioned\n%s", b.id, m.State, m.Reason, tail(s.log.String(), 3000))
	}
	if got := b.th.delivered.Load(); got >= 2*buildImageSize {
		t.Errorf("image fetched %d bytes for a %d-byte image: the stream was restarted, not resumed", got, buildImageSize)
	}
	// Stage rewrote sector 0 (the appended partition entry): compare the rest.
	f, err := os.Open(b.disk)
	if err != nil {
		t.Fatal(err)
	}
	onDisk := make([]byte, buildImageSize-512)
	_, err = f.ReadAt(onDisk, 512)
	f.Close()
	if err != nil || sha256.Sum256(onDisk) != sha256.Sum256(b.img[512:]) {
		t.Errorf("disk does not hold the image after sector 0 (read: %v)", err)
	}
	var evs struct {
		Events []struct {
			Subject, Kind, To, Message string
		} `json:"events"`
	}
	if code, err := s.do("GET", "/v1/events?after=0&limit=1000", nil, &evs); err != nil || code != http.StatusOK {
		t.Fatalf("events: %d %v", code, err)
	}
	seen := map[string]bool{}
	for _, e := range evs.Events {
		if e.Subject != "machine/"+b.id || e.Kind != "step" {
			continue
		}
		step, _, _ := strings.Cut(e.Message, ":")
		seen[step+" "+e.To] = true
		if e.To == string(agentapi.StateFailed) {
			t.Errorf("step failed: %s", e.Message)
		}
	}
	for _, step := range []string{agentapi.StepCheck, agentapi.StepWrite, agentapi.StepVerify, agentapi.StepStage, agentapi.StepFinalize} {
		for _, st := range []agentapi.State{agentapi.StateStarted, agentapi.StateSucceeded} {
			if !seen[step+" "+string(st)] {
				t.Errorf("no %s %s report in the store (saw %v)", step, st, seen)
			}
		}
	}
	if !seen[agentapi.StepReboot+" "+string(agentapi.StateStarted)] {
		t.Errorf("no reboot started report in the store")
	}
	return m
}

// TestServeRestartMidWriteEndsProvisioned (issue 12 item 6): `kiln serve`
// is SIGKILLed while the real agent code is in the write step (image stream
// throttled to 2 MiB/s), and restarted 3 s later on the same data directory.
// The agent resumes the image by Range across the outage, its reports reach
// the restarted node (its token is valid there: a hash in the replicated
// record; no 403 while the node replays its log), and the machine ends
// provisioned with the image on its disk. Every step's started and
// succeeded report is in the store; no step failed.
func TestServeRestartMidWriteEndsProvisioned(t *testing.T) {
	n := newServeNode(t, "build-1", nil)
	s := n.start(t)
	b := startMidBuild(t, s, n.bootURL(t))
	s.kill(t)
	killedAt := b.th.delivered.Load()
	time.Sleep(3 * time.Second)
	// While the node starts, a step report with the agent's token every
	// 20 ms: until the restarted node acknowledges one, each answer must be
	// "retry" (no connection, 5xx), never 403 (issue 12: the restarted
	// node refused the agent's token while its store replayed the log).
	codes := make(chan map[int]int, 1)
	go func() {
		seen := map[int]int{}
		defer func() { codes <- seen }()
		hb := `{"step":"write","state":"running","progress":0.3,"attempt":1}`
		for end := time.Now().Add(serveReadyWithin); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			req, _ := http.NewRequest("POST", b.url+"/v1/agent/report", strings.NewReader(hb))
			req.Header.Set("Authorization", "Bearer "+b.tok)
			req.Header.Set(agentapi.HeaderMachine, b.id)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				seen[0]++
				continue
			}
			resp.Body.Close()
			seen[resp.StatusCode]++
			if resp.StatusCode < 300 {
				return
			}
		}
	}()
	s = n.start(t)
	probe := <-codes
	if probe[http.StatusForbidden] > 0 || probe[http.StatusNoContent] != 1 {
		t.Errorf("agent reports to the restarting node answered %v (status: count; 0 = no connection), want no 403 and then 204", probe)
	}
	m := b.finish(s)
	if b.th.ranges.Load() < 1 {
		t.Errorf("the image was not resumed by Range (%d ranged requests)", b.th.ranges.Load())
	}
	t.Logf("killed at %d of %d bytes; %d bytes fetched in all, %d ranged requests; reports during the restart %v; machine %s %s",
		killedAt, buildImageSize, b.th.delivered.Load(), b.th.ranges.Load(), probe, m.State, m.Reason)
}

// TestServeClusterLeaderKillMidWriteEndsProvisioned (issue 12 item 6): three
// `kiln serve` nodes; the machine netboots from a follower (its agent talks
// to that node: token, image, reports) and the leader is SIGKILLed while
// the agent is in the write step. The reports the follower cannot commit
// until a new leader is elected are retried until acknowledged, and the
// machine ends provisioned, read on every surviving node. (It needs the
// follower to read its own forwarded writes: before, the follower's
// lifecycle read the machine back before applying its write and left it
// inspecting.)
func TestServeClusterLeaderKillMidWriteEndsProvisioned(t *testing.T) {
	a := newServeNode(t, "mid-a", nil)
	b := newServeNode(t, "mid-b", []string{a.fwd})
	c := newServeNode(t, "mid-c", []string{a.fwd, b.fwd})
	procs := map[*serveNode]*served{a: a.start(t)}
	b.setJoinToken(t, joinToken(t, a.bin, procs[a]))
	c.setJoinToken(t, joinToken(t, a.bin, procs[a]))
	procs[b] = b.start(t)
	procs[c] = c.start(t)
	nodes := []*serveNode{a, b, c}
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
		t.Fatalf("no leader with two peers in 20 s")
	}
	var follower *serveNode
	for _, n := range nodes {
		if n != leader {
			follower = n
			break
		}
	}
	// The image is uploaded to the follower: an image exists on the node
	// that received it (issue 12 item 3 is separate work).
	bld := startMidBuild(t, procs[follower], follower.bootURL(t))
	procs[leader].kill(t)
	killedAt := time.Now()
	m := bld.finish(procs[follower])
	for _, n := range nodes {
		if n == leader {
			continue
		}
		var got buildMachine
		var err error
		if !waitFor(10*time.Second, func() bool { got, err = bld.get(procs[n]); return err == nil && got.State == "provisioned" }) {
			t.Errorf("%s reads the machine as %+v (%v), want provisioned", n.id, got, err)
		}
	}
	t.Logf("leader %s killed mid-write; agent on %s; machine %s %s %.1f s after the kill", leader.id, follower.id,
		m.State, m.Reason, time.Since(killedAt).Seconds())
}
