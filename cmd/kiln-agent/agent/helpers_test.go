package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/api/agentapi"
	"kiln/cmd/kiln-agent/inventory"
)

// fakeAppliance implements the agentapi endpoints minimally and serves images.
type fakeAppliance struct {
	t       *testing.T
	srv     *httptest.Server
	mu      sync.Mutex
	tasks   []agentapi.Task // handed out in order (register, then each poll); then poweroff
	reports []agentapi.Report
	reg     *agentapi.Registration // the last registration
	regs    int                    // registrations received (answered or not)
	images  map[string][]byte
	// imageHook may alter the body of one GET (n = 0-based request count for that path).
	imageHook func(w http.ResponseWriter, r *http.Request, n int, data []byte) bool
	gets      map[string]int
	ranges    []string
	// publicImages serves /images/ without the bearer token (for busybox wget in the bench).
	publicImages bool
	// failRegister answers this many registrations with 503 first.
	failRegister int
	// credentials answers GET /v1/agent/credentials; nil = 403 (the gate is closed).
	credentials *agentapi.Credentials
}

const testToken = "tok-123"

func newFakeAppliance(t *testing.T) *fakeAppliance {
	fa := &fakeAppliance{t: t, images: map[string][]byte{}, gets: map[string]int{}}
	mux := http.NewServeMux()
	auth := func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") != "Bearer "+testToken {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return false
		}
		return true
	}
	mux.HandleFunc("POST /v1/agent/register", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		fa.mu.Lock()
		fa.regs++
		if fa.failRegister > 0 {
			fa.failRegister--
			fa.mu.Unlock()
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fa.mu.Unlock()
		var reg agentapi.Registration
		if err := json.NewDecoder(r.Body).Decode(&reg); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		fa.mu.Lock()
		fa.reg = &reg
		fa.mu.Unlock()
		fa.nextTask(w)
	})
	mux.HandleFunc("GET /v1/agent/task", func(w http.ResponseWriter, r *http.Request) {
		if auth(w, r) {
			fa.nextTask(w)
		}
	})
	mux.HandleFunc("POST /v1/agent/report", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		var rep agentapi.Report
		if err := json.NewDecoder(r.Body).Decode(&rep); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		fa.mu.Lock()
		fa.reports = append(fa.reports, rep)
		fa.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/agent/credentials", func(w http.ResponseWriter, r *http.Request) {
		if !auth(w, r) {
			return
		}
		fa.mu.Lock()
		c := fa.credentials
		fa.mu.Unlock()
		if c == nil {
			http.Error(w, "attestation gate closed", http.StatusForbidden)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(c)
	})
	mux.HandleFunc("GET /images/{name}", func(w http.ResponseWriter, r *http.Request) {
		if !fa.publicImages && !auth(w, r) {
			return
		}
		name := r.PathValue("name")
		fa.mu.Lock()
		data, ok := fa.images[name]
		n := fa.gets[name]
		fa.gets[name]++
		if rg := r.Header.Get("Range"); rg != "" {
			fa.ranges = append(fa.ranges, rg)
		}
		hook := fa.imageHook
		fa.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		if hook != nil && hook(w, r, n, data) {
			return
		}
		w.Header().Set("ETag", `"`+name+`-v1"`)
		http.ServeContent(w, r, name, time.Unix(1700000000, 0), bytes.NewReader(data))
	})
	fa.srv = httptest.NewServer(mux)
	t.Cleanup(fa.srv.Close)
	return fa
}

func (fa *fakeAppliance) nextTask(w http.ResponseWriter) {
	fa.mu.Lock()
	task := agentapi.Task{Action: agentapi.ActionPowerOff}
	if len(fa.tasks) > 0 {
		task, fa.tasks = fa.tasks[0], fa.tasks[1:]
	}
	fa.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(task)
}

func (fa *fakeAppliance) imageURL(name string) string { return fa.srv.URL + "/images/" + name }

func (fa *fakeAppliance) Reports() []agentapi.Report {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	return append([]agentapi.Report(nil), fa.reports...)
}

// final returns the last non-running report of step.
func (fa *fakeAppliance) final(step string) (agentapi.Report, bool) {
	reps := fa.Reports()
	for i := len(reps) - 1; i >= 0; i-- {
		if reps[i].Step == step && (reps[i].State == agentapi.StateSucceeded || reps[i].State == agentapi.StateFailed) {
			return reps[i], true
		}
	}
	return agentapi.Report{}, false
}

// runAgent runs the agent against fa until it reboots/powers off; returns the reboot flag.
func runAgent(t *testing.T, fa *fakeAppliance, devPath, serial string) (rebooted bool) {
	t.Helper()
	return runAgentCfg(t, fa, devPath, serial, nil)
}

// runAgentCfg is runAgent with a hook to adjust the Config.
func runAgentCfg(t *testing.T, fa *fakeAppliance, devPath, serial string, adjust func(*Config)) (rebooted bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var console bytes.Buffer
	var called bool
	cfg := Config{
		URL: fa.srv.URL, MachineID: "m-1", Token: testToken, Console: &syncWriter{w: &console},
		RetryBase: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond, Retries: 3,
		ReadTestBytes: 4 << 20,
		ListDisks: func() ([]agentapi.Disk, error) {
			d := inventory.DiskAt("/", filepath.Base(devPath))
			d.Path, d.Serial = devPath, serial
			st, err := os.Stat(devPath)
			if err == nil && st.Mode().IsRegular() {
				d.SizeBytes = uint64(st.Size())
			}
			return []agentapi.Disk{d}, nil
		},
		Reboot: func(reboot bool) error { called, rebooted = true, reboot; return nil },
	}
	if adjust != nil {
		adjust(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = a.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Logf("console:\n%s", console.String())
	if err != nil || !called {
		t.Fatalf("Run: err %v, reboot called %v", err, called)
	}
	return rebooted
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

// newLoop creates a sparse file of size bytes (filled by fill when non-nil) and attaches it
// to a free loop device, detached in Cleanup.
func newLoop(t *testing.T, size int64, fill []byte) (dev, file string) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if fill != nil {
		if _, err := f.Write(fill); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	dev = strings.TrimSpace(run(t, "losetup", "-f", "--show", file))
	t.Cleanup(func() { detachLoop(dev, file) })
	return dev, file
}

// detachLoop detaches dev only while it is still backed by file: loop devices are shared
// with other test suites, and a number we released may already be someone else's.
func detachLoop(dev, file string) {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop/backing_file"))
	if err != nil || strings.TrimSpace(string(b)) != file {
		return
	}
	_ = exec.Command("losetup", "-d", dev).Run()
}

// buildImage makes a disk image of sizeMiB with a partition table (label "gpt" or "dos")
// and one ext4 partition from 1 MiB holding /kiln-marker.txt = marker.
func buildImage(t *testing.T, label string, sizeMiB int, marker string) []byte {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, "image.raw")
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, int64(sizeMiB)<<20); err != nil {
		t.Fatal(err)
	}
	partMiB := sizeMiB - 2
	cmd := exec.Command("sfdisk", "--quiet", img)
	cmd.Stdin = strings.NewReader("label: " + label + "\nstart=2048, size=" + strconv.Itoa(partMiB*2048) + ", type=L\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk: %v\n%s", err, out)
	}
	content := filepath.Join(dir, "root")
	if err := os.MkdirAll(content, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(content, "kiln-marker.txt"), []byte(marker), 0o644); err != nil {
		t.Fatal(err)
	}
	// Fixed UUID/hash seed and timestamps keep the image reproducible.
	c := exec.Command("mkfs.ext4", "-q", "-F", "-E", "offset=1048576,root_owner=0:0", "-U", "6b1f3a52-9d0c-4c1e-8e61-0d4b3f0a7c11",
		"-b", "4096", "-d", content, img, strconv.Itoa(partMiB)+"M")
	c.Env = append(os.Environ(), "E2FSPROGS_FAKE_TIME=1700000000")
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	b, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha(b)
}
