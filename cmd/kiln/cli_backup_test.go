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
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"kiln/api"
	"kiln/api/client"
	"kiln/appliance"
	"kiln/store"
)

// backupNode is an in-process appliance (so the test can read its store
// record by record) on free loopback ports.
type backupNode struct {
	cfg   appliance.Config
	a     *appliance.Appliance
	url   string
	token string
	stop  func()
}

func backupConfig(t *testing.T, dataDir, nodeID string) appliance.Config {
	t.Helper()
	p := freePorts(t, 4)
	cfg := appliance.DefaultConfig()
	cfg.NodeID = nodeID
	cfg.DataDir = dataDir
	cfg.API.Addr = fmt.Sprintf("127.0.0.1:%d", p[0])
	cfg.Raft.Addr = fmt.Sprintf("127.0.0.1:%d", p[1])
	cfg.Raft.ForwardAddr = fmt.Sprintf("127.0.0.1:%d", p[2])
	cfg.Boot.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", p[3])
	return cfg
}

func runBackupNode(t *testing.T, cfg appliance.Config) *backupNode {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := appliance.New(cfg, "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	n := &backupNode{cfg: cfg, a: a, url: "http://" + cfg.API.Addr}
	stopped := false
	n.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("appliance %s: %v", cfg.NodeID, err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("appliance %s did not stop", cfg.NodeID)
		}
	}
	t.Cleanup(n.stop)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get(n.url + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("appliance %s not ready within 30 s", cfg.NodeID)
		}
	}
	tok, err := os.ReadFile(filepath.Join(cfg.DataDir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	n.token = strings.TrimSpace(string(tok))
	return n
}

// storeRecords is every machine, lease, image and secret of s as JSON, and
// every event at or below index upTo, keyed by kind and ID.
func storeRecords(t *testing.T, s *store.Store, upTo uint64) map[string]string {
	t.Helper()
	out := map[string]string{}
	add := func(k string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		out[k] = string(b)
	}
	ms, _, err := s.ListMachines(store.ListOptions{Limit: 100000})
	must(t, err)
	for _, m := range ms {
		add("machine/"+m.ID, m)
	}
	ls, err := s.Leases()
	must(t, err)
	for _, l := range ls {
		add("lease/"+l.MAC, l)
	}
	is, err := s.ListImages()
	must(t, err)
	for _, im := range is {
		add("image/"+im.ID, im)
	}
	evs, err := s.Events(0, 1000000)
	must(t, err)
	for _, ev := range evs {
		if ev.Index <= upTo {
			add(fmt.Sprintf("event/%d/%d", ev.Index, ev.Seq), ev)
		}
	}
	return out
}

// TestCLIBackupRestore: `kiln backup --images` of a running node, then
// `kiln restore` into a fresh data directory (a non-empty one is refused),
// then the restored node started as a one-node cluster: it holds the same
// machines, leases, images (records, and the image file, byte for byte)
// and events, record by record, and takes writes. A backup without
// --images references the image by digest and restore lists it.
func TestCLIBackupRestore(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kiln binary and runs two appliances")
	}
	bin := kilnBinary(t)
	src := runBackupNode(t, backupConfig(t, t.TempDir(), "bk-src"))
	ctx := context.Background()
	cl, err := client.New(client.Config{Server: src.url, Token: src.token})
	must(t, err)
	for i := 0; i < 5; i++ {
		_, err := cl.CreateMachine(ctx, api.MachineSpec{Name: fmt.Sprintf("bk-%d", i),
			Intended: store.Hardware{NICs: []store.NIC{{MAC: fmt.Sprintf("02:00:00:00:bb:%02x", i)}}}})
		must(t, err)
	}
	img := bytes.Repeat([]byte("kiln backup image "), 4096)
	sum := sha256.Sum256(img)
	_, err = cl.UploadImage(ctx, client.ImageMeta{Name: "bk-img", Version: "1", SHA256: hex.EncodeToString(sum[:])}, bytes.NewReader(img), int64(len(img)))
	must(t, err)
	// Leases come from DHCP; written here through the store's own write.
	st := src.a.Store
	must(t, st.PutLeases(ctx, []store.Lease{
		{MAC: "02:00:00:00:bb:00", IP: "10.96.0.100", Expiry: time.Now().Add(time.Hour).UTC().Truncate(time.Second), State: "bound"},
		{MAC: "02:00:00:00:bb:01", IP: "10.96.0.101", Expiry: time.Now().Add(time.Hour).UTC().Truncate(time.Second), State: "bound"}}))
	must(t, os.MkdirAll(src.cfg.Boot.EnvDir, 0o755))
	must(t, os.WriteFile(filepath.Join(src.cfg.Boot.EnvDir, "vmlinuz"), []byte("kernel bytes"), 0o644))

	run := func(wantErr bool, args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if (err != nil) != wantErr {
			t.Fatalf("kiln %s: %v (want error %v)\n%s", strings.Join(args, " "), err, wantErr, out.String())
		}
		return out.String()
	}
	// What the backup must hold, read before it is taken: the node's own
	// loops (spares_low, once per crossing on each leader) may append events
	// after it, and the restored node appends its own; both come after
	// last and are not compared.
	last := st.LastEventIndex()
	want := storeRecords(t, st, last)
	if len(want) < 15 {
		t.Fatalf("only %d records to compare", len(want))
	}
	dir := t.TempDir()
	full, refs := filepath.Join(dir, "full.tar"), filepath.Join(dir, "refs.tar")
	t.Logf("%s", run(false, "--server", src.url, "--token", src.token, "backup", full, "--images"))
	run(false, "--server", src.url, "--token", src.token, "backup", refs)
	src.stop() // the site is gone

	// A non-empty data directory is refused and left as it was.
	busy := filepath.Join(dir, "busy")
	must(t, os.MkdirAll(busy, 0o700))
	must(t, os.WriteFile(filepath.Join(busy, "keep"), []byte("x"), 0o600))
	if out := run(true, "restore", full, "--data-dir", busy, "--node-id", "bk-new"); !strings.Contains(out, "not empty") {
		t.Fatalf("restore into a non-empty dir: %s", out)
	}
	if _, err := os.Stat(filepath.Join(busy, "keep")); err != nil {
		t.Fatalf("the refused directory was changed: %v", err)
	}
	// A backup by reference lists the image to copy.
	if out := run(false, "restore", refs, "--data-dir", filepath.Join(dir, "refs"), "--node-id", "bk-ref"); !strings.Contains(out, "missing bk-img") {
		t.Fatalf("restore of a backup without images does not list the image: %s", out)
	}

	newCfg := backupConfig(t, filepath.Join(dir, "new"), "bk-new")
	out := run(false, "restore", full, "--data-dir", newCfg.DataDir, "--node-id", "bk-new", "--raft-addr", newCfg.Raft.Addr,
		"--site-key", filepath.Join(src.cfg.DataDir, "site.key"))
	t.Logf("%s", out)
	if !strings.Contains(out, "images restored: 1") || !strings.Contains(out, "environment vmlinuz sha256:") {
		t.Fatalf("restore output: %s", out)
	}
	dst := runBackupNode(t, newCfg)
	if !dst.a.Store.IsLeader() {
		t.Fatal("the restored node does not lead its one-node cluster")
	}
	got := storeRecords(t, dst.a.Store, last)
	if !reflect.DeepEqual(want, got) {
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: want %s\n got %s", k, v, got[k])
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("%s: not in the original", k)
			}
		}
		t.FailNow()
	}
	file, err := os.ReadFile(filepath.Join(dst.cfg.Boot.ImageDir, "bk-img"))
	if err != nil || !bytes.Equal(file, img) {
		t.Fatalf("restored image file: %d bytes, %v; want the %d uploaded", len(file), err, len(img))
	}
	cl2, err := client.New(client.Config{Server: dst.url, Token: dst.token})
	must(t, err)
	if _, err := cl2.CreateMachine(ctx, api.MachineSpec{Name: "after-restore", Intended: store.Hardware{NICs: []store.NIC{{MAC: "02:00:00:00:cc:01"}}}}); err != nil {
		t.Fatalf("write on the restored node: %v", err)
	}
	t.Logf("%d records compared (machines, leases, images, events ≤ %d)", len(want), last)
}

// TestCLIClusterRecover: three `kiln serve` nodes; two are SIGKILLed for
// good and the survivor cannot take a write; `kiln cluster recover
// --config` on the stopped survivor (refused while it runs) makes it a
// one-node cluster that keeps every acknowledged machine and takes writes.
func TestCLIClusterRecover(t *testing.T) {
	a := newServeNode(t, "rc-a", nil)
	b := newServeNode(t, "rc-b", []string{a.fwd})
	c := newServeNode(t, "rc-c", []string{a.fwd})
	pa := a.start(t)
	b.setJoinToken(t, joinToken(t, a.bin, pa))
	pb := b.start(t)
	c.setJoinToken(t, joinToken(t, a.bin, pa))
	pc := c.start(t)
	ids := map[string]bool{}
	for i := 0; i < 5; i++ {
		m, code, err := pa.createMachine(fmt.Sprintf("rc-%d", i), fmt.Sprintf("02:00:00:00:dd:%02x", i))
		if err != nil || code != http.StatusCreated {
			t.Fatalf("create: %d %v", code, err)
		}
		ids[m.ID] = true
	}
	pb.kill(t)
	pc.kill(t) // gone for good
	if _, code, err := pa.createMachine("no-quorum", "02:00:00:00:dd:ff"); err == nil && code == http.StatusCreated {
		t.Fatal("a write without quorum succeeded")
	}
	run := func(wantErr bool, args ...string) string {
		t.Helper()
		out, err := exec.Command(a.bin, args...).CombinedOutput()
		if (err != nil) != wantErr {
			t.Fatalf("kiln %s: %v (want error %v)\n%s", strings.Join(args, " "), err, wantErr, out)
		}
		return string(out)
	}
	run(true, "cluster", "recover", "--config", a.cfg) // the node still runs: raft.db is locked
	pa.kill(t)
	out := run(false, "cluster", "recover", "--config", a.cfg)
	t.Logf("%s", out)
	pa = a.start(t)
	got, err := pa.machineIDs()
	must(t, err)
	for id := range ids {
		if !got[id] {
			t.Fatalf("acknowledged machine %s lost in recovery (have %v)", id, got)
		}
	}
	if _, code, err := pa.createMachine("after-recover", "02:00:00:00:dd:fe"); err != nil || code != http.StatusCreated {
		t.Fatalf("write after recovery: %d %v", code, err)
	}
	out, _ = kilnCLI(t, a.bin, pa, false, "cluster", "members", "-o", "json")
	var list api.ClusterMemberList
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Items) != 1 || list.Items[0].ID != "rc-a" || !list.Items[0].Leader {
		t.Fatalf("members after recovery: %s (%v)", out, err)
	}
}
