package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"kiln/api"
	"kiln/appliance/lifecycle/lifecycletest"
	"kiln/store"
)

const (
	tAdmin  = "cli-admin-token"
	tViewer = "cli-viewer-token"
)

type cliEnv struct {
	t   *testing.T
	d   *lifecycletest.Domain
	st  *store.Store
	url string
}

// newCLIEnv serves package api over the real domain (lifecycle controller
// and store, as the appliance wires them) on a real 127.0.0.1 listener.
func newCLIEnv(t *testing.T) *cliEnv {
	t.Helper()
	d := lifecycletest.New(t)
	s, err := api.New(api.Config{Tokens: []api.TokenSpec{
		{Name: "admin", Role: api.RoleAdmin, SHA256: api.HashToken(tAdmin)},
		{Name: "viewer", Role: api.RoleViewer, SHA256: api.HashToken(tViewer)},
	}, ErrorClasses: lifecycletest.ErrorClasses()}, d.Backend(), prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	// Keep the default token file and env out of the tests.
	t.Setenv("KILN_TOKEN", "")
	t.Setenv("KILN_TOKEN_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("KILN_SERVER", "")
	return &cliEnv{t: t, d: d, st: d.Store, url: srv.URL}
}

// syncBuf is a goroutine-safe buffer (events --follow writes while the test reads).
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// run executes `kiln ARGS...` (client commands only) and returns stdout, stderr and the error.
func (e *cliEnv) runCtx(ctx context.Context, stdin string, args ...string) (string, string, error) {
	root := &cobra.Command{Use: "kiln", SilenceUsage: true, SilenceErrors: true}
	addClientCommands(root)
	var out, errb syncBuf
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	return out.String(), errb.String(), err
}

func (e *cliEnv) run(args ...string) (string, string, error) {
	return e.runCtx(context.Background(), "", append([]string{"--server", e.url}, args...)...)
}

func (e *cliEnv) admin(args ...string) string {
	e.t.Helper()
	out, stderr, err := e.run(append([]string{"--token", tAdmin}, args...)...)
	if err != nil {
		e.t.Fatalf("kiln %v: %v\n%s", args, err, stderr)
	}
	return out
}

// addEvent appends ev to the store's event log.
func (e *cliEnv) addEvent(ev store.Event) {
	e.t.Helper()
	if err := e.st.AppendEvents(context.Background(), []store.Event{ev}); err != nil {
		e.t.Fatal(err)
	}
}

// imageData reads the catalog's file of image name.
func (e *cliEnv) imageData(name string) []byte {
	e.t.Helper()
	f, _, err := e.d.Catalog.Open(name)
	if err != nil {
		e.t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// password opens the sealed credential stored under key ("" when none).
func (e *cliEnv) password(key string) string {
	e.t.Helper()
	sealed, err := e.st.Secret(key)
	if err != nil {
		return ""
	}
	pw, err := e.d.Sealer.Open(sealed)
	if err != nil {
		e.t.Fatal(err)
	}
	return string(pw)
}

// machine records a machine as a test fixture, straight into the store,
// walked along legal transitions to state.
func (e *cliEnv) machine(name string, i int, state store.MachineState) store.Machine {
	e.t.Helper()
	m, err := e.st.PutMachine(context.Background(), store.Machine{Name: name, State: store.StateRegistered, Rack: "r1",
		Intended: store.Hardware{NICs: []store.NIC{{MAC: fmt.Sprintf("52:54:00:00:10:%02x", i)}}}}, store.W{})
	if err != nil {
		e.t.Fatal(err)
	}
	steps := map[store.MachineState][]store.MachineState{
		store.StateAvailable:   {store.StateInspecting, store.StateAvailable},
		store.StateProvisioned: {store.StateInspecting, store.StateAvailable, store.StateProvisioning, store.StateProvisioned},
	}[state]
	for _, st := range steps {
		m.State = st
		if m, err = e.st.PutMachine(context.Background(), m, store.W{}); err != nil {
			e.t.Fatal(err)
		}
	}
	return m
}

func TestCLIMachinesListAndGet(t *testing.T) {
	e := newCLIEnv(t)
	var ids []string
	for i := 0; i < 5; i++ {
		st := store.StateAvailable
		if i == 4 {
			st = store.StateRegistered
		}
		ids = append(ids, e.machine(fmt.Sprintf("node-%d", i), i, st).ID)
	}
	out := e.admin("machines", "list", "--limit", "2")
	if !strings.HasPrefix(out, "ID ") || !strings.Contains(out, "STATE") {
		t.Fatalf("table header:\n%s", out)
	}
	for _, id := range ids {
		if !strings.Contains(out, id) {
			t.Fatalf("%s missing (pagination through 3 pages):\n%s", id, out)
		}
	}
	out, stderr, err := e.run("--token", tViewer, "machines", "list", "--limit", "2", "--all=false", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var ml api.MachineList
	if err := json.Unmarshal([]byte(out), &ml); err != nil || len(ml.Items) != 2 || ml.Next == "" {
		t.Fatalf("json page: %v %s", err, out)
	}
	_ = stderr
	out = e.admin("machines", "list", "--state", "registered", "-o", "yaml")
	if !strings.Contains(out, "items:") || !strings.Contains(out, "state: registered") || strings.Contains(out, "state: available") {
		t.Fatalf("yaml state filter:\n%s", out)
	}
	out = e.admin("machines", "get", ids[0])
	if !strings.Contains(out, "node-0") || !strings.Contains(out, "52:54:00:00:10:00") || !strings.Contains(out, "available") {
		t.Fatalf("get:\n%s", out)
	}
}

func TestCLIErrorsSayWhatToDo(t *testing.T) {
	e := newCLIEnv(t)
	reg := e.machine("n", 1, store.StateRegistered)
	avail := e.machine("a", 2, store.StateAvailable)

	_, _, err := e.run("--token", "wrong", "machines", "list")
	if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "set KILN_TOKEN or --token") {
		t.Fatalf("401: %v", err)
	}
	_, _, err = e.run("machines", "list")
	if err == nil || !strings.Contains(err.Error(), "no token") {
		t.Fatalf("no token: %v", err)
	}
	_, _, err = e.run("--token", tViewer, "machines", "erase", avail.ID)
	if err == nil || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), "operator or admin token") {
		t.Fatalf("403: %v", err)
	}
	_, _, err = e.run("--token", tAdmin, "machines", "get", "nope")
	if err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), "kiln machines list") {
		t.Fatalf("404: %v", err)
	}
	_, _, err = e.run("--token", tAdmin, "machines", "release", reg.ID)
	if err == nil || !strings.Contains(err.Error(), "wrong_state") || !strings.Contains(err.Error(), "state is registered") ||
		!strings.Contains(err.Error(), "kiln machines get") {
		t.Fatalf("wrong state: %v", err)
	}
	_, _, err = e.run("--token", tAdmin, "machines", "provision", avail.ID)
	if err == nil || !strings.Contains(err.Error(), "--image is required") {
		t.Fatalf("missing image: %v", err)
	}
	_, _, err = e.run("--token", tAdmin, "machines", "list", "--state", "melted")
	if err == nil || !strings.Contains(err.Error(), "fix state") {
		t.Fatalf("validation: %v", err)
	}
	_, _, err = e.run("--token", tAdmin, "machines", "list", "-o", "xml")
	if err == nil || !strings.Contains(err.Error(), "table, json or yaml") {
		t.Fatalf("-o: %v", err)
	}
	// Nothing listens: say how to fix it.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	_, _, err = e.runCtx(context.Background(), "", "--server", dead, "--token", tAdmin, "status")
	if err == nil || !strings.Contains(err.Error(), "is `kiln serve` running") {
		t.Fatalf("unreachable: %v", err)
	}
}

func TestCLITokenSources(t *testing.T) {
	e := newCLIEnv(t)
	t.Setenv("KILN_TOKEN", tViewer)
	if _, _, err := e.run("status"); err != nil {
		t.Fatalf("KILN_TOKEN: %v", err)
	}
	t.Setenv("KILN_TOKEN", "")
	p := filepath.Join(t.TempDir(), "admin.token")
	if err := os.WriteFile(p, []byte(tAdmin+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KILN_TOKEN_FILE", p)
	out, _, err := e.run("status")
	if err != nil || !strings.Contains(out, "Raft:") || !strings.Contains(out, "leader") {
		t.Fatalf("token file: %v\n%s", err, out)
	}
	// KILN_SERVER is the default --server.
	t.Setenv("KILN_SERVER", e.url)
	if _, _, err := e.runCtx(context.Background(), "", "status"); err != nil {
		t.Fatalf("KILN_SERVER: %v", err)
	}
}

func TestCLIActionsImportStatus(t *testing.T) {
	e := newCLIEnv(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "plan.csv")
	os.WriteFile(good, []byte("name,serial,macs,rack\nn1,S1,52:54:00:00:20:01,r1\nn2,S2,52:54:00:00:20:02,r1\n"), 0o600)
	bad := filepath.Join(dir, "bad.csv")
	os.WriteFile(bad, []byte("name,serial,macs,rack\nn1,S1,52:54:00:00:20:01,r1\nn2,S2,nomac,r1\n"), 0o600)

	_, _, err := e.run("--token", tAdmin, "import", bad)
	if err == nil || !strings.Contains(err.Error(), "line 3, field macs") || !strings.Contains(err.Error(), "nothing was imported") {
		t.Fatalf("bad import: %v", err)
	}
	out := e.admin("import", good)
	if !strings.Contains(out, "imported 2 machine(s)") {
		t.Fatalf("import: %s", out)
	}
	// An empty file imports nothing and says so.
	if _, _, err := e.run("--token", tAdmin, "import", "--format", "csv", "-", "-o", "json"); err == nil || !strings.Contains(err.Error(), "no rows") {
		t.Fatalf("empty import: %v", err)
	}
	if _, _, err := e.runCtx(context.Background(), "name,serial,macs,rack\nn3,S3,52:54:00:00:20:03,r2\n",
		"--server", e.url, "--token", tAdmin, "import", "--format", "csv", "-"); err != nil {
		t.Fatalf("stdin import: %v", err)
	}

	m := e.machine("p", 9, store.StateProvisioned)
	out = e.admin("machines", "release", m.ID, "--reason", "decommission")
	if !strings.Contains(out, "erasing") {
		t.Fatalf("release: %s", out)
	}
	evs, _ := e.st.Events(0, 0)
	if last := evs[len(evs)-1]; last.Reason != "decommission" || last.Actor != "token:admin" {
		t.Fatalf("event %+v", last)
	}
	a := e.machine("q", 10, store.StateAvailable)
	e.admin("machines", "inspect", a.ID)
	if got, _ := e.st.GetMachine(a.ID); got.State != store.StateInspecting {
		t.Fatalf("inspect: %s", got.State)
	}

	out = e.admin("status")
	if !strings.Contains(out, "Machines:") || !strings.Contains(out, "registered:") || !strings.Contains(out, "erasing:") {
		t.Fatalf("status:\n%s", out)
	}
	out = e.admin("status", "-o", "json")
	var st api.SiteStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Total < 5 {
		t.Fatalf("status json %v %+v", err, st)
	}
}

func TestCLIImagesAndProvision(t *testing.T) {
	e := newCLIEnv(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	p := filepath.Join(t.TempDir(), "ubuntu-24.04.img")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := e.run("--token", tAdmin, "images", "upload", p, "--version", "24.04", "-o", "json")
	if err != nil {
		t.Fatalf("upload: %v %s", err, stderr)
	}
	var im store.Image
	if err := json.Unmarshal([]byte(out), &im); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if im.Name != "ubuntu-24.04" || im.Format != "raw" || im.SHA256 != hex.EncodeToString(sum[:]) || !bytes.Equal(e.imageData(im.Name), data) {
		t.Fatalf("image %+v", im)
	}
	if !strings.Contains(stderr, "uploading") || !strings.Contains(stderr, "hashing") {
		t.Fatalf("no progress bar on stderr: %q", stderr)
	}
	p2 := filepath.Join(t.TempDir(), "other.img")
	if err := os.WriteFile(p2, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err = e.run("--token", tAdmin, "images", "upload", p2, "--version", "x", "--sha256", strings.Repeat("0", 64), "-q")
	if err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("wrong digest accepted: %v", err)
	}
	out = e.admin("images", "list")
	if !strings.Contains(out, im.ID) || !strings.Contains(out, "24.04") || strings.Count(out, "\n") != 2 {
		t.Fatalf("list:\n%s", out)
	}

	a := e.machine("w", 3, store.StateAvailable)
	out = e.admin("machines", "provision", a.ID, "--image", im.ID, "--role", "worker", "--hostname", "w3", "--label", "pool=gpu")
	// The claim waits on the available machine until its agent's next task poll starts the build.
	if !strings.Contains(out, a.ID) || !strings.Contains(out, "available") {
		t.Fatalf("provision: %s", out)
	}
	got, _ := e.st.GetMachine(a.ID)
	if got.Claim == nil || got.Claim.Role != "worker" || got.Claim.Labels["pool"] != "gpu" || got.Claim.Hostname != "w3" {
		t.Fatalf("claim %+v", got.Claim)
	}

	pw := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pw, []byte("s3cret\n"), 0o600)
	out = e.admin("bmc", "enroll", a.ID, "--address", "10.99.1.10", "--driver", "ipmi", "--username", "admin", "--password-file", pw)
	if !strings.Contains(out, "10.99.1.10") || strings.Contains(out, "s3cret") {
		t.Fatalf("bmc: %s", out)
	}
	if e.password("bmc/"+a.ID) != "s3cret" {
		t.Fatalf("password not stored: %s", out)
	}
	_, _, err = e.run("--token", tAdmin, "bmc", "enroll", a.ID, "--address", "x", "--username", "u")
	if err == nil || !strings.Contains(err.Error(), "KILN_BMC_PASSWORD") {
		t.Fatalf("no password: %v", err)
	}
}

func TestCLIEventsFollow(t *testing.T) {
	e := newCLIEnv(t)
	e.addEvent(store.Event{Subject: "machine/m-1", Kind: "created", To: "registered", Actor: "token:admin"})
	out := e.admin("events")
	if !strings.Contains(out, "machine/m-1") || !strings.Contains(out, "-→registered") {
		t.Fatalf("events:\n%s", out)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root := &cobra.Command{Use: "kiln", SilenceUsage: true, SilenceErrors: true}
	addClientCommands(root)
	var buf syncBuf
	root.SetOut(&buf)
	root.SetErr(io.Discard)
	root.SetArgs([]string{"--server", e.url, "--token", tAdmin, "events", "--follow", "--wait", "2s", "-o", "json"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()

	waitFor := func(sub string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(buf.String(), sub) {
			if time.Now().After(deadline) {
				t.Fatalf("%q not printed; got:\n%s", sub, buf.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("machine/m-1")
	time.Sleep(300 * time.Millisecond) // the follower is now long-polling
	e.addEvent(store.Event{Subject: "machine/m-2", Kind: "transition", From: "available", To: "provisioning"})
	waitFor("machine/m-2")
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("follow ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("events --follow did not stop on cancel")
	}
	// One JSON object per event, each printed once.
	dec := json.NewDecoder(strings.NewReader(buf.String()))
	n := 0
	for dec.More() {
		var ev api.Event
		if err := dec.Decode(&ev); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(ev.Subject, "machine/") { // the store's own (node/...) events aside
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d events printed:\n%s", n, buf.String())
	}
}

// `-o yaml` prints integers as integers (the JSON round trip used to turn
// 67108864 into 6.7108864e+07); `events` shows each event's message (the
// step names and results of a build) and `events -o json` is one compact
// object per line.
func TestCLIYAMLIntegersAndEventMessages(t *testing.T) {
	e := newCLIEnv(t)
	m := e.machine("node-y", 1, store.StateAvailable)
	m.Discovered = &store.Hardware{MemoryBytes: 479645696, Disks: []store.Disk{{Name: "vda", SizeBytes: 67108864}}}
	if _, err := e.st.PutMachine(context.Background(), m, store.W{}); err != nil {
		t.Fatal(err)
	}
	out := e.admin("machines", "get", m.ID, "-o", "yaml")
	if !strings.Contains(out, "size_bytes: 67108864") || !strings.Contains(out, "memory_bytes: 479645696") || strings.Contains(out, "e+") {
		t.Fatalf("yaml numbers:\n%s", out)
	}

	e.addEvent(store.Event{Subject: "machine/" + m.ID, Kind: "step", To: "succeeded", Actor: "agent",
		Message: "write: 26214400 bytes in 1.1s\tline two\nthree"})
	out = e.admin("events")
	if !strings.Contains(out, "MESSAGE") || !strings.Contains(out, "write: 26214400 bytes in 1.1s line two three") {
		t.Fatalf("events table lacks the message:\n%s", out)
	}
	out = e.admin("events", "-o", "json")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var ev store.Event
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &ev); err != nil || ev.Kind != "step" {
		t.Fatalf("events -o json: last line %q is not one event: %v", lines[len(lines)-1], err)
	}
}
