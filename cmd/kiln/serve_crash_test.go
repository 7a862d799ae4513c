package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"kiln/deploy/lab/testkit"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// freePorts is testkit.FreePorts (ports below the ephemeral range).
func freePorts(t *testing.T, n int) []int { t.Helper(); return testkit.FreePorts(t, n) }

// served is one running `kiln serve` process.
type served struct {
	cmd   *exec.Cmd
	api   string
	token string
	log   *lockedBuffer
}

// lockedBuffer collects a process's output; it is read while the process
// runs (failure messages), so writes and reads are serialised.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

var kilnBin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// TestMain removes the kiln binary the tests built (kilnBinary).
func TestMain(m *testing.M) {
	code := m.Run()
	if kilnBin.dir != "" {
		os.RemoveAll(kilnBin.dir)
	}
	os.Exit(code)
}

// kilnBinary builds this command once per test process and returns the
// binary's path.
func kilnBinary(t *testing.T) string {
	t.Helper()
	kilnBin.once.Do(func() {
		if kilnBin.dir, kilnBin.err = os.MkdirTemp("", "kiln-test-bin-"); kilnBin.err != nil {
			return
		}
		kilnBin.path = filepath.Join(kilnBin.dir, "kiln")
		if out, err := exec.Command("go", "build", "-o", kilnBin.path, ".").CombinedOutput(); err != nil {
			kilnBin.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if kilnBin.err != nil {
		t.Fatal(kilnBin.err)
	}
	return kilnBin.path
}

// serveNode is one `kiln serve` node's files: the binary, its kiln.yaml and
// data directory, and the addresses (127.0.0.1:PORT) in that config.
type serveNode struct {
	id, bin, cfg, data     string
	apiAddr, raftAddr, fwd string
}

// newServeNode writes a node's config in a temp dir: node ID nodeID, free
// 127.0.0.1 ports for the API, raft, raft forwarding and HTTP boot. With
// join empty the node bootstraps a one-node cluster on an empty data dir;
// with join (members' forward addresses) it sets raft.bootstrap: false and
// raft.join, as a further node of a site cluster. It skips in -short.
func newServeNode(t *testing.T, nodeID string, join []string) *serveNode {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the kiln binary")
	}
	dir := t.TempDir()
	n := &serveNode{id: nodeID, bin: kilnBinary(t), cfg: filepath.Join(dir, "kiln.yaml"), data: filepath.Join(dir, "data")}
	p := freePorts(t, 4)
	n.apiAddr = fmt.Sprintf("127.0.0.1:%d", p[0])
	n.raftAddr = fmt.Sprintf("127.0.0.1:%d", p[1])
	n.fwd = fmt.Sprintf("127.0.0.1:%d", p[2])
	raft := "  bootstrap: true\n"
	if len(join) > 0 {
		raft = fmt.Sprintf("  bootstrap: false\n  join: [\"%s\"]\n", strings.Join(join, `", "`))
	}
	body := fmt.Sprintf("node_id: %s\ndata_dir: %s\napi:\n  addr: %s\nraft:\n  addr: %s\n  forward_addr: %s\n%sboot:\n  http_addr: 127.0.0.1:%d\n",
		nodeID, n.data, n.apiAddr, n.raftAddr, n.fwd, raft, p[3])
	if err := os.WriteFile(n.cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return n
}

// start runs `kiln serve` on n and waits until it is ready (see startServe).
func (n *serveNode) start(t *testing.T) *served {
	t.Helper()
	return startServe(t, n.bin, n.cfg, n.data, n.apiAddr)
}

// startServe runs `kiln serve --config cfg` and waits up to 30 s for its
// /readyz to answer 200, then reads its admin token from dataDir.
// serveReadyWithin bounds the wait for /readyz: generous, since CI runs these
// tests on 2 loaded cores under -race.
const serveReadyWithin = 60 * time.Second

// createMachine POSTs a machine with one NIC to s and returns its ID (empty
// unless the answer is 201), the status code and a transport error.
func (s *served) createMachine(name, mac string) (m struct {
	ID string `json:"id"`
}, code int, err error) {
	code, err = s.do("POST", "/v1/machines", map[string]any{
		"name":     name,
		"intended": map[string]any{"nics": []map[string]string{{"mac": mac}}},
	}, &m)
	return m, code, err
}

func startServe(t *testing.T, bin, cfg string, dataDir string, apiAddr string) *served {
	t.Helper()
	s := &served{api: "http://" + apiAddr, log: &lockedBuffer{}}
	s.cmd = exec.Command(bin, "serve", "--config", cfg)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s.cmd.ProcessState == nil {
			_ = s.cmd.Process.Kill()
			_ = s.cmd.Wait()
		}
	})
	deadline := time.Now().Add(serveReadyWithin)
	for time.Now().Before(deadline) {
		resp, err := http.Get(s.api + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				tok, err := os.ReadFile(filepath.Join(dataDir, "admin.token"))
				if err != nil {
					t.Fatal(err)
				}
				s.token = strings.TrimSpace(string(tok))
				return s
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Not ready: say what the node thinks (its raft view) before the log.
	status := ""
	if tok, err := os.ReadFile(filepath.Join(dataDir, "admin.token")); err == nil {
		s.token = strings.TrimSpace(string(tok))
		var st map[string]any
		if _, err := s.do("GET", "/v1/site/status", nil, &st); err == nil {
			status = fmt.Sprint(st["raft"])
		}
	}
	t.Fatalf("kiln serve not ready in %s (raft: %s):\n%s", serveReadyWithin, status, s.log)
	return nil
}

// kill ends the process with SIGKILL (no shutdown code runs) and reaps it.
func (s *served) kill(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = s.cmd.Wait()
}

func (s *served) do(method, path string, body any, out any) (int, error) {
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, s.api+path, rd)
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, nil
}

// TestServeCrashKeepsAcknowledgedWrites kills `kiln serve` with SIGKILL while
// four writers stream machine creations through the API, restarts it on the
// same data directory and requires every acknowledged (201) write to be there.
func TestServeCrashKeepsAcknowledgedWrites(t *testing.T) {
	n := newServeNode(t, "crash-1", nil)
	s := n.start(t)

	var mu sync.Mutex
	var acked []string
	other := map[int]int{} // non-201 answers by status, for the failure message
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				m, code, err := s.createMachine(fmt.Sprintf("crash-%d-%d", w, i), fmt.Sprintf("02:00:00:%02x:%02x:%02x", w, (i>>8)&0xff, i&0xff))
				if err != nil {
					return // the server is gone; this write was not acknowledged
				}
				mu.Lock()
				if code == http.StatusCreated && m.ID != "" {
					acked = append(acked, m.ID)
				} else {
					other[code]++
				}
				mu.Unlock()
			}
		}(w)
	}
	// Let writes flow, then kill in the middle of the stream. Under -race on a
	// loaded 2-core machine a write can take ~100 ms: wait for up to 30 s.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 150 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.kill(t)
	close(stop)
	wg.Wait()
	if len(acked) < 20 {
		t.Fatalf("only %d writes acknowledged before the kill (other answers by status: %v); log:\n%s", len(acked), other, s.log)
	}

	s2 := n.start(t)
	missing := 0
	for _, id := range acked {
		code, err := s2.do("GET", "/v1/machines/"+id, nil, nil)
		if err != nil || code != http.StatusOK {
			missing++
			if missing < 5 {
				t.Errorf("acknowledged machine %s lost after SIGKILL (status %d, %v)", id, code, err)
			}
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d acknowledged writes lost", missing, len(acked))
	}
	t.Logf("%d acknowledged writes, all present after SIGKILL and restart", len(acked))
}

// TestServeCorruptDataFileNamesIt: a garbled FSM file stops start-up with an
// error naming the file, and the file is left as it was (no silent reset).
func TestServeCorruptDataFileNamesIt(t *testing.T) {
	n := newServeNode(t, "c-1", nil)
	s := n.start(t)
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	_ = s.cmd.Wait()

	var victims []string
	_ = filepath.Walk(n.data, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() && strings.HasSuffix(p, ".db") {
			victims = append(victims, p)
		}
		return nil
	})
	if len(victims) == 0 {
		t.Fatal("no .db files in the data dir")
	}
	for _, v := range victims {
		orig, err := os.ReadFile(v)
		if err != nil {
			t.Fatal(err)
		}
		garbled := bytes.Repeat([]byte{0xA5}, len(orig))
		if err := os.WriteFile(v, garbled, 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(n.bin, "serve", "--config", n.cfg).CombinedOutput()
		if err == nil {
			t.Fatalf("kiln serve started on a garbled %s", v)
		}
		if !strings.Contains(string(out), filepath.Base(v)) {
			t.Errorf("start-up error does not name %s:\n%s", v, out)
		}
		if strings.Contains(string(out), "panic") {
			t.Errorf("start-up panicked on a garbled %s:\n%s", v, out)
		}
		after, _ := os.ReadFile(v)
		if !bytes.Equal(after, garbled) {
			t.Errorf("%s was changed by the failed start (silent reset?)", v)
		}
		if err := os.WriteFile(v, orig, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
