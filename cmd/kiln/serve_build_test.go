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
	cfg, err := os.ReadFile(n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	bootAddr := regexp.MustCompile(`http_addr: (\S+)`).FindSubmatch(cfg)
	if bootAddr == nil {
		t.Fatalf("no boot http_addr in %s", cfg)
	}
	boot := "http://" + string(bootAddr[1])
	s := n.start(t)

	const imgSize = 16 << 20
	img := mbrImage(imgSize)
	sum := sha256.Sum256(img)
	want := hex.EncodeToString(sum[:])
	req, _ := http.NewRequest("POST", s.api+"/v1/images?name=restart.raw&version=1&format=raw&sha256="+want, strings.NewReader(string(img)))
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

	const mac = "02:00:00:00:e2:12"
	created, code, err := s.createMachine("restart-1", mac)
	if err != nil || code != http.StatusCreated {
		t.Fatalf("create machine: %d %v", code, err)
	}
	id := created.ID
	netboot := func() string {
		resp, err := http.Get(boot + "/ipxe/" + mac)
		if err != nil {
			t.Error(err)
			return ""
		}
		script, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return string(script)
	}
	script := netboot()
	tok := regexp.MustCompile(agentapi.ArgToken + `=(\S+)`).FindStringSubmatch(script)
	url := regexp.MustCompile(agentapi.ArgURL + `=(\S+)`).FindStringSubmatch(script)
	if tok == nil || url == nil || !strings.Contains(script, agentapi.ArgMachine+"="+id) {
		t.Fatalf("boot script for %s has no agent arguments:\n%s", id, script)
	}

	root := fakeRoot(t, mac, "0-1")
	disk := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(disk, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, 64<<20); err != nil {
		t.Fatal(err)
	}
	th := &throttle{next: http.DefaultTransport, rate: 2 << 20}
	rebooted := make(chan string, 1)
	a, err := agent.New(agent.Config{
		URL: url[1], MachineID: id, Token: tok[1], Root: root, IPMIDevice: filepath.Join(root, "no-ipmi"),
		HTTP: &http.Client{Transport: th},
		ListDisks: func() ([]agentapi.Disk, error) {
			return []agentapi.Disk{{Name: "vda", Path: disk, SizeBytes: 64 << 20, Health: "ok"}}, nil
		},
		// The machine reboots and netboots: the appliance tells it to boot its disk.
		Reboot:    func(bool) error { rebooted <- netboot(); return nil },
		RetryBase: 50 * time.Millisecond, RetryMax: 500 * time.Millisecond, ReadTestBytes: 1 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() { cancel(); <-done })

	type machine struct {
		State  string `json:"state"`
		Reason string `json:"reason"`
		Step   *struct {
			Step, State string
		} `json:"step"`
	}
	get := func(s *served) (machine, error) {
		var m machine
		code, err := s.do("GET", "/v1/machines/"+id, nil, &m)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("HTTP %d", code)
		}
		return m, err
	}
	var m machine
	if !waitFor(30*time.Second, func() bool { m, _ = get(s); return m.State == "available" }) {
		t.Fatalf("machine %s is %s (%s), want available\n%s", id, m.State, m.Reason, tail(s.log.String(), 3000))
	}
	if code, err := s.do("POST", "/v1/machines/"+id+"/provision", map[string]any{"claim": map[string]any{"image": string(imgID[1])}}, nil); err != nil || code != http.StatusAccepted && code != http.StatusOK {
		t.Fatalf("provision: %d %v", code, err)
	}
	// Kill the appliance a quarter into the image stream.
	if !waitFor(60*time.Second, func() bool { return th.delivered.Load() >= imgSize/4 }) {
		m, _ = get(s)
		t.Fatalf("image stream did not start: machine %+v, %d bytes\n%s", m, th.delivered.Load(), tail(s.log.String(), 3000))
	}
	m, _ = get(s)
	if m.Step == nil || m.Step.Step != agentapi.StepWrite {
		t.Fatalf("machine not in the write step when killed: %+v", m.Step)
	}
	s.kill(t)
	killedAt := th.delivered.Load()
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
			req, _ := http.NewRequest("POST", url[1]+"/v1/agent/report", strings.NewReader(hb))
			req.Header.Set("Authorization", "Bearer "+tok[1])
			req.Header.Set(agentapi.HeaderMachine, id)
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

	select {
	case script := <-rebooted:
		if !strings.Contains(script, "exit") || strings.Contains(script, agentapi.ArgToken) {
			t.Errorf("post-build netboot got the agent again:\n%s", script)
		}
	case <-time.After(120 * time.Second):
		m, _ = get(s)
		t.Fatalf("agent did not finish the build after the restart: machine %+v, %d of %d bytes\n%s", m, th.delivered.Load(), imgSize, tail(s.log.String(), 3000))
	}
	if !waitFor(30*time.Second, func() bool { m, _ = get(s); return m.State == "provisioned" }) {
		t.Fatalf("machine %s is %s (%s), want provisioned\n%s", id, m.State, m.Reason, tail(s.log.String(), 3000))
	}
	if th.ranges.Load() < 1 {
		t.Errorf("the image was not resumed by Range (%d ranged requests)", th.ranges.Load())
	}
	if got := th.delivered.Load(); got >= 2*imgSize {
		t.Errorf("image fetched %d bytes for a %d-byte image: the stream was restarted, not resumed", got, imgSize)
	}
	// Stage rewrote sector 0 (the appended partition entry): compare the rest.
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	onDisk := make([]byte, imgSize-512)
	_, err = f.ReadAt(onDisk, 512)
	f.Close()
	if err != nil || sha256.Sum256(onDisk) != sha256.Sum256(img[512:]) {
		t.Errorf("disk does not hold the image after sector 0 (read: %v)", err)
	}

	// Every step's reports reached the store; none failed.
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
		if e.Subject != "machine/"+id || e.Kind != "step" {
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
	t.Logf("killed at %d of %d bytes; %d bytes fetched in all, %d ranged requests; reports during the restart %v; machine %s %s",
		killedAt, imgSize, th.delivered.Load(), th.ranges.Load(), probe, m.State, m.Reason)
}
