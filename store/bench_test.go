package store_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"kiln/deploy/lab/benchline"
	"kiln/store"
	"kiln/store/storetest"
)

// benchMachine is a PutMachine-sized record (~1 KiB of JSON).
func benchMachine(id string, i int) store.Machine {
	return store.Machine{Meta: store.Meta{ID: id}, Name: id, Site: "site-1", Rack: fmt.Sprintf("r%02d", i%40), RackUnit: i % 42,
		Labels: map[string]string{"pool": "general", "zone": "a"},
		Intended: store.Hardware{Serial: "SN" + id, Vendor: "Dell Inc.", Model: "PowerEdge R650", CPUs: 64,
			MemoryBytes: 512 << 30, GPUs: 0, BMCAddress: "10.1.2.3", Firmware: "2.19.1",
			Disks: []store.Disk{{Serial: "S1" + id, Model: "SAMSUNG MZ7L3960", SizeBytes: 960 << 30},
				{Serial: "S2" + id, Model: "SAMSUNG MZ7L3960", SizeBytes: 960 << 30}},
			NICs: []store.NIC{{Name: "eno1", MAC: mac(2 * i)}, {Name: "eno2", MAC: mac(2*i + 1)}}},
		RootDisk: store.DiskRule{MinSizeBytes: 100 << 30}}
}

const benchRounds = 3

type benchResult struct {
	ops      int
	elapsed  time.Duration
	p50, p99 time.Duration
	lats     []time.Duration
}

func (b *benchResult) add(o benchResult) {
	b.ops += o.ops
	b.elapsed += o.elapsed
	b.lats = append(b.lats, o.lats...)
}

func (b *benchResult) finish() {
	sort.Slice(b.lats, func(i, j int) bool { return b.lats[i] < b.lats[j] })
	if len(b.lats) == 0 {
		return
	}
	b.p50 = b.lats[int(0.50*float64(len(b.lats)-1))]
	b.p99 = b.lats[int(0.99*float64(len(b.lats)-1))]
}

// drive runs writers goroutines calling op for d, and returns throughput
// and latency percentiles of the successful calls.
func drive(t *testing.T, writers int, d time.Duration, op func(w, k int) error) benchResult {
	var mu sync.Mutex
	var lats []time.Duration
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var mine []time.Duration
			for k := 0; time.Now().Before(stop); k++ {
				t0 := time.Now()
				if err := op(w, k); err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					failed.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	el := time.Since(start)
	if f := failed.Load(); f > 0 {
		// Under heavy machine load a leadership change can fail a few
		// writes; many failures mean the figures are not meaningful.
		if int(f) > len(lats)/100 {
			t.Errorf("%d failed writes (of %d), first: %v", f, len(lats)+int(f), firstErr.Load())
		} else {
			t.Logf("%d failed writes (of %d), first: %v", f, len(lats)+int(f), firstErr.Load())
		}
	}
	return benchResult{ops: len(lats), elapsed: el, lats: lats}
}

// bareFSM is the trivial FSM of the peer: it counts entries.
type bareFSM struct{ n atomic.Uint64 }

func (f *bareFSM) Apply(*raft.Log) interface{}         { f.n.Add(1); return nil }
func (f *bareFSM) Snapshot() (raft.FSMSnapshot, error) { return bareSnap{}, nil }
func (f *bareFSM) Restore(rc io.ReadCloser) error      { return rc.Close() }

type bareSnap struct{}

func (bareSnap) Persist(s raft.SnapshotSink) error { return s.Close() }
func (bareSnap) Release()                          {}

// boltFSM is the second peer's FSM (raft.BatchingFSM): the durable part of
// the store's FSM work and nothing else. Every batch raft hands it is ONE
// bbolt write transaction on its own file (NoSync and NoGrowSync, as
// fsm.db) that stores each entry's bytes as a record (key: 64 interleaved
// sequential streams, like the bench's 64 writers' machine IDs), appends a
// small event record keyed by the index, and writes the applied marker.
// No JSON, no checks, no indexes: what is left between it and the store is
// the store's own work per command.
type boltFSM struct{ db *bbolt.DB }

var (
	boltRecs   = []byte("records")
	boltEvents = []byte("events")
	boltMeta   = []byte("meta")
)

func newBoltFSM(t *testing.T) *boltFSM {
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "fsm.db"), 0o600, &bbolt.Options{Timeout: time.Second, NoSync: true, NoGrowSync: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		for _, b := range [][]byte{boltRecs, boltEvents, boltMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &boltFSM{db: db}
}

func (f *boltFSM) Apply(l *raft.Log) interface{} { return f.ApplyBatch([]*raft.Log{l})[0] }

func (f *boltFSM) ApplyBatch(logs []*raft.Log) []interface{} {
	res := make([]interface{}, len(logs))
	err := f.db.Update(func(tx *bbolt.Tx) error {
		recs, evs := tx.Bucket(boltRecs), tx.Bucket(boltEvents)
		for _, l := range logs {
			if l.Type != raft.LogCommand {
				continue
			}
			var k [16]byte
			binary.BigEndian.PutUint64(k[:], l.Index%64)
			binary.BigEndian.PutUint64(k[8:], l.Index/64)
			if err := recs.Put(k[:], l.Data); err != nil {
				return err
			}
			if err := evs.Put(k[8:], []byte(`{"kind":"created","subject":"machine/m-0123456789abcdef","actor":"bench"}`)); err != nil {
				return err
			}
		}
		var ib [8]byte
		binary.BigEndian.PutUint64(ib[:], logs[len(logs)-1].Index)
		return tx.Bucket(boltMeta).Put([]byte("applied"), ib[:])
	})
	for i := range res {
		res[i] = err
	}
	return res
}

func (f *boltFSM) Snapshot() (raft.FSMSnapshot, error) { return bareSnap{}, nil }
func (f *boltFSM) Restore(rc io.ReadCloser) error      { return rc.Close() }

// bareCluster starts n bare hashicorp/raft nodes with the same raft
// settings, log store (raft-boltdb/v2 on bbolt) and transport as the store,
// each with the FSM newFSM returns. The returned func gives the current
// leader (it follows re-elections).
func bareCluster(t *testing.T, n int, newFSM func() raft.FSM) (func() *raft.Raft, func()) {
	var nodes []*raft.Raft
	var closers []func()
	var servers []raft.Server
	type part struct {
		cfg   *raft.Config
		logs  *raftboltdb.BoltStore
		snaps raft.SnapshotStore
		trans *raft.NetworkTransport
	}
	var parts []part
	quiet := hclog.New(&hclog.LoggerOptions{Level: hclog.Error, Output: io.Discard})
	for i := 0; i < n; i++ {
		dir := t.TempDir()
		cfg := raft.DefaultConfig()
		cfg.LocalID = raft.ServerID(fmt.Sprintf("b%d", i))
		cfg.HeartbeatTimeout, cfg.ElectionTimeout = benchHeartbeat, benchHeartbeat
		cfg.LeaderLeaseTimeout, cfg.CommitTimeout = benchLease, benchCommit
		cfg.BatchApplyCh, cfg.NoLegacyTelemetry, cfg.Logger = true, true, quiet
		logs, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db"), BoltOptions: &bbolt.Options{Timeout: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		snaps, _ := raft.NewFileSnapshotStoreWithLogger(dir, 2, quiet)
		trans, err := raft.NewTCPTransportWithLogger("127.0.0.1:0", nil, 3, 10*time.Second, quiet)
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, part{cfg, logs, snaps, trans})
		servers = append(servers, raft.Server{ID: cfg.LocalID, Address: trans.LocalAddr()})
	}
	for i, p := range parts {
		if err := raft.BootstrapCluster(p.cfg, p.logs, p.logs, p.snaps, p.trans, raft.Configuration{Servers: servers}); err != nil {
			t.Fatal(err)
		}
		r, err := raft.NewRaft(p.cfg, newFSM(), p.logs, p.logs, p.snaps, p.trans)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, r)
		p := p
		_ = i
		closers = append(closers, func() { r.Shutdown().Error(); p.trans.Close(); p.logs.Close() })
	}
	stop := func() {
		for _, c := range closers {
			c()
		}
	}
	var cur atomic.Pointer[raft.Raft]
	leader := func() *raft.Raft {
		if r := cur.Load(); r != nil && r.State() == raft.Leader {
			return r
		}
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			for _, r := range nodes {
				if r.State() == raft.Leader {
					cur.Store(r)
					return r
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		return nodes[0] // its Apply will fail with ErrNotLeader
	}
	if leader().State() != raft.Leader {
		stop()
		t.Fatal("bare raft: no leader")
	}
	return leader, stop
}

// Raft timing of both sides of the bench: raft's production defaults for
// heartbeat/election/lease (the short test timeouts flap under load), a
// short commit timeout.
const (
	benchHeartbeat = time.Second
	benchLease     = 500 * time.Millisecond
	benchCommit    = 5 * time.Millisecond
)

func benchCfg(cfg *store.Config) {
	cfg.HeartbeatTimeout, cfg.ElectionTimeout = benchHeartbeat, benchHeartbeat
	cfg.LeaderLeaseTimeout, cfg.CommitTimeout = benchLease, benchCommit
	cfg.ApplyTimeout = 30 * time.Second
}

// TestBenchRaft compares Kiln's store (PutMachine of ~1 KiB records on the
// leader) with bare hashicorp/raft (same raft-boltdb log store, raft
// transport and timeouts, entries of the same size), for 1 and 64
// concurrent writers on 1 and 3 nodes, in the same run. Two peers: a
// trivial FSM (counts entries: raft alone) and boltFSM (raft plus the
// durable bbolt work of an FSM, no encoding or rules).
func TestBenchRaft(t *testing.T) {
	benchline.Need(t, false)
	const d = time.Second
	sample, _ := json.Marshal(benchMachine("m-0123456789abcdef", 1))
	payload := append([]byte{3}, sample...)
	for _, nodes := range []int{1, 3} {
		for _, writers := range []int{1, 64} {
			name := fmt.Sprintf("%dnode_%dw", nodes, writers)
			if only := os.Getenv("KILN_BENCH_ONLY"); only != "" && only != name {
				continue
			}
			// The three systems run side by side; rounds alternate so that
			// the machine's background load hits them alike.
			c := storetest.NewCluster(t, nodes, benchCfg)
			s := c.Nodes[c.Leader()].Store
			r, stop := bareCluster(t, nodes, func() raft.FSM { return &bareFSM{} })
			rb, stopb := bareCluster(t, nodes, func() raft.FSM { return newBoltFSM(t) })
			ctx := context.Background()
			var kiln, peer, bolt benchResult
			for round := 0; round < benchRounds; round++ {
				kiln.add(drive(t, writers, d, func(w, k int) error {
					id := fmt.Sprintf("m-%d-%02d-%07d", round, w, k)
					_, err := s.PutMachine(ctx, benchMachine(id, (round*64+w)*1_000_000+k), store.W{Actor: "bench"})
					return err
				}))
				peer.add(drive(t, writers, d, func(w, k int) error {
					return r().Apply(payload, 10*time.Second).Error()
				}))
				bolt.add(drive(t, writers, d, func(w, k int) error {
					f := rb().Apply(payload, 10*time.Second)
					if err := f.Error(); err != nil {
						return err
					}
					if err, _ := f.Response().(error); err != nil {
						return err
					}
					return nil
				}))
			}
			stop()
			stopb()
			c.Close()
			kiln.finish()
			peer.finish()
			bolt.finish()
			rate := func(b benchResult) float64 { return float64(b.ops) / b.elapsed.Seconds() }
			// The first peer is the same hashicorp/raft, log store, transport
			// and timeouts with a trivial FSM: the lines show what Kiln's FSM,
			// command encoding and indexes cost on top of raft itself. The
			// second adds an FSM's durable bbolt work (store_vs_bolt_*).
			trivial := "hashicorp-raft+trivial-fsm"
			boltPeer := "hashicorp-raft+bbolt-fsm"
			for _, l := range []struct {
				name, unit, what string
				k, p             float64
			}{
				{"store_commits_per_s_" + name, "ops/s", trivial, rate(kiln), rate(peer)},
				{"store_p50_seconds_" + name, "s", trivial, kiln.p50.Seconds(), peer.p50.Seconds()},
				{"store_p99_seconds_" + name, "s", trivial, kiln.p99.Seconds(), peer.p99.Seconds()},
				{"store_vs_bolt_commits_per_s_" + name, "ops/s", boltPeer, rate(kiln), rate(bolt)},
				{"store_vs_bolt_p50_seconds_" + name, "s", boltPeer, kiln.p50.Seconds(), bolt.p50.Seconds()},
			} {
				benchline.Print(t, benchline.Line{Name: l.name, Unit: l.unit, Kiln: l.k,
					Peer: &benchline.Peer{What: l.what, Value: l.p}})
			}
		}
	}
}
