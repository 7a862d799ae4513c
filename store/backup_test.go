package store_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"kiln/store"
	"kiln/store/storetest"
)

// fill writes machines, leases, images, secrets, a job and caller events.
func fill(t *testing.T, s *store.Store, prefix string, n int) {
	t.Helper()
	ctx := ctxT(t)
	putN(t, s, prefix, 0, n)
	img, err := s.PutImage(ctx, store.Image{Meta: store.Meta{ID: "img-" + prefix}, Name: "ubuntu-" + prefix,
		Version: "24.04", SHA256: fmt.Sprintf("%064x", n), Size: 1 << 20, Format: "raw"}, store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	_ = img
	var ls []store.Lease
	for i := 0; i < n; i++ {
		ls = append(ls, store.Lease{MAC: fmt.Sprintf("02:00:00:%02x:00:%02x", len(prefix), i), IP: fmt.Sprintf("10.9.%d.%d", len(prefix), i+10),
			Expiry: time.Now().Add(time.Hour).UTC().Truncate(time.Second), State: "bound"})
	}
	if err := s.PutLeases(ctx, ls); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSecret(ctx, "bmc/"+prefix, []byte("sealed-"+prefix), store.W{Actor: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendEvents(ctx, []store.Event{{Subject: "machine/" + prefix, Kind: "note", Message: "hello " + prefix}}); err != nil {
		t.Fatal(err)
	}
}

// records is every record of s as JSON, keyed by kind and ID, and every
// event up to index upTo.
func records(t *testing.T, s *store.Store, upTo uint64) map[string]string {
	t.Helper()
	out := map[string]string{}
	add := func(k string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := out[k]; dup {
			t.Fatalf("duplicate key %s", k)
		}
		out[k] = string(b)
	}
	ms, _, err := s.ListMachines(store.ListOptions{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		add("machine/"+m.ID, m)
	}
	ls, err := s.Leases()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		add("lease/"+l.MAC, l)
	}
	is, err := s.ListImages()
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range is {
		add("image/"+im.ID, im)
	}
	keys, err := s.SecretKeys()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		v, err := s.Secret(k)
		if err != nil {
			t.Fatal(err)
		}
		add("secret/"+k, v)
	}
	evs, err := s.Events(0, 100000)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Index <= upTo {
			add(fmt.Sprintf("event/%d/%d", ev.Index, ev.Seq), ev)
		}
	}
	return out
}

func sameRecords(t *testing.T, what string, want, got map[string]string) {
	t.Helper()
	if reflect.DeepEqual(want, got) {
		return
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s: want %s, got %q", what, k, v, got[k])
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: %s: not in the original", what, k)
		}
	}
	t.FailNow()
}

// TestBackupRestore: a backup taken on a follower of a 3-node cluster,
// restored into a fresh directory, opens as a one-node cluster that leads
// itself and holds the same machines, leases, images, secrets and events
// (record by record); it takes writes after the backed-up index. A
// non-empty directory is refused.
func TestBackupRestore(t *testing.T) {
	c := storetest.NewCluster(t, 3)
	li := c.Leader()
	fill(t, c.Nodes[li].Store, "bk", 20)
	fol := c.Nodes[c.Follower()].Store
	var buf bytes.Buffer
	var info store.BackupInfo
	if err := fol.Backup(ctxT(t), func(i store.BackupInfo, snap io.WriterTo) error {
		info = i
		n, err := snap.WriteTo(&buf)
		if err == nil && n != i.Size {
			err = fmt.Errorf("wrote %d bytes, info says %d", n, i.Size)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if info.Index == 0 || info.Index < c.Nodes[li].Store.LastEventIndex() {
		t.Fatalf("backup at index %d, the leader's last event is at %d", info.Index, c.Nodes[li].Store.LastEventIndex())
	}
	want := records(t, c.Nodes[li].Store, info.Index)
	if len(want) < 60 {
		t.Fatalf("only %d records to compare", len(want))
	}

	dir := filepath.Join(t.TempDir(), "restored")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "junk"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := store.RestoreDataDir(dir, "r0", "127.0.0.1:1", bytes.NewReader(buf.Bytes())); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("restore into a non-empty directory: %v, want ErrInvalid", err)
	}
	dir = filepath.Join(t.TempDir(), "fresh")
	cfg := storetest.Config("r0", dir)
	if _, err := store.RestoreDataDir(dir, "r0", "127.0.0.1:0", bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	c.Close() // the old cluster is gone
	r, err := store.Open(cfg, storetest.Logger(), nil)
	if err != nil {
		t.Fatalf("open the restored directory: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	go func() { _ = r.Run(ctxT(t), nil) }()
	wctx, wcancel := context.WithTimeout(ctxT(t), 10*time.Second)
	defer wcancel()
	if err := r.WaitLeader(wctx); err != nil || !r.IsLeader() {
		t.Fatalf("restored node does not lead itself: leader=%v %v", r.IsLeader(), err)
	}
	sameRecords(t, "restored", want, records(t, r, info.Index))
	m, err := r.PutMachine(ctxT(t), store.Machine{Name: "after-restore"}, store.W{Actor: "test"})
	if err != nil {
		t.Fatalf("write on the restored node: %v", err)
	}
	if m.ResourceVersion <= info.Index {
		t.Fatalf("first write after restore at index %d, backup was at %d", m.ResourceVersion, info.Index)
	}
	t.Logf("backup of %d bytes at index %d; %d records compared; first write after restore at %d",
		info.Size, info.Index, len(want), m.ResourceVersion)
}

// TestRecoverCluster: a 3-node cluster loses two nodes for good; the
// survivor alone has no quorum and takes no writes; after RecoverCluster
// (offline, with the survivor as the only server) it starts as a one-node
// cluster with every acknowledged write and takes writes again.
func TestRecoverCluster(t *testing.T) {
	c := storetest.NewCluster(t, 3)
	fill(t, c.Nodes[c.Leader()].Store, "rc", 10)
	if err := c.Nodes[0].Store.Barrier(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	last := c.Nodes[0].Store.LastEventIndex()
	want := records(t, c.Nodes[0].Store, last)
	c.Stop(1)
	c.Stop(2) // gone for good
	s0 := c.Nodes[0].Store
	ctx, cancel := context.WithTimeout(ctxT(t), 2*time.Second)
	defer cancel()
	if _, err := s0.PutMachine(ctx, store.Machine{Name: "no-quorum"}, store.W{Actor: "test"}); err == nil {
		t.Fatal("a write without quorum succeeded")
	}
	c.Stop(0)

	sv := []store.RecoverServer{{ID: "n0", RaftAddr: c.Nodes[0].Cfg.RaftAddr}}
	if _, err := store.RecoverCluster(c.Nodes[0].Cfg.DataDir, "n1", sv, nil); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("recover naming servers without this node: %v, want ErrInvalid", err)
	}
	idx, err := store.RecoverCluster(c.Nodes[0].Cfg.DataDir, "n0", sv, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Restart(0)
	s0 = c.Nodes[0].Store
	if got := c.Leader(); got != 0 {
		t.Fatalf("leader %d, want the survivor", got)
	}
	got := records(t, s0, last)
	for k, v := range got {
		// The write refused for want of quorum may be in the survivor's
		// log: recovery replays uncommitted entries too (raft.RecoverCluster).
		if strings.Contains(v, `"name":"no-quorum"`) {
			t.Logf("the unacknowledged write is kept: %s", k)
			delete(got, k)
		}
	}
	sameRecords(t, "recovered", want, got)
	m, err := s0.PutMachine(ctxT(t), store.Machine{Name: "after-recover"}, store.W{Actor: "test"})
	if err != nil {
		t.Fatalf("write after recovery: %v", err)
	}
	ms, err := s0.Members()
	if err != nil || len(ms) != 1 || ms[0].ID != "n0" {
		t.Fatalf("members after recovery: %+v %v", ms, err)
	}
	t.Logf("recovered at index %d; %d records kept; first write after at %d", idx, len(want), m.ResourceVersion)
}
