package store_test

import (
	"context"
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

// bareCluster starts n bare hashicorp/raft nodes with the same raft
// settings, log store (raft-boltdb/v2 on bbolt) and transport as the store.
// The returned func gives the current leader (it follows re-elections).
func bareCluster(t *testing.T, n int) (func() *raft.Raft, func()) {
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
		r, err := raft.NewRaft(p.cfg, &bareFSM{}, p.logs, p.logs, p.snaps, p.trans)
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
// leader) with bare hashicorp/raft (same raft-boltdb log store, TCP
// transport and timeouts, trivial FSM, entries of the same size), for 1
// and 64 concurrent writers on 1 and 3 nodes, in the same run.
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
			// Both systems run side by side; rounds alternate so that the
			// machine's background load hits both alike.
			c := storetest.NewCluster(t, nodes, benchCfg)
			s := c.Nodes[c.Leader()].Store
			r, stop := bareCluster(t, nodes)
			ctx := context.Background()
			var kiln, peer benchResult
			for round := 0; round < benchRounds; round++ {
				kiln.add(drive(t, writers, d, func(w, k int) error {
					id := fmt.Sprintf("m-%d-%02d-%07d", round, w, k)
					_, err := s.PutMachine(ctx, benchMachine(id, (round*64+w)*1_000_000+k), store.W{Actor: "bench"})
					return err
				}))
				peer.add(drive(t, writers, d, func(w, k int) error {
					return r().Apply(payload, 10*time.Second).Error()
				}))
			}
			stop()
			c.Close()
			kiln.finish()
			peer.finish()
			kt, pt := float64(kiln.ops)/kiln.elapsed.Seconds(), float64(peer.ops)/peer.elapsed.Seconds()
			// The peer is the same hashicorp/raft, log store, transport and
			// timeouts with a trivial FSM: the lines show what Kiln's FSM,
			// command encoding and indexes cost on top of raft itself.
			for _, l := range []struct {
				name, unit string
				k, p       float64
			}{
				{"store_commits_per_s_" + name, "ops/s", kt, pt},
				{"store_p50_seconds_" + name, "s", kiln.p50.Seconds(), peer.p50.Seconds()},
				{"store_p99_seconds_" + name, "s", kiln.p99.Seconds(), peer.p99.Seconds()},
			} {
				benchline.Print(t, benchline.Line{Name: l.name, Unit: l.unit, Kiln: l.k,
					Peer: &benchline.Peer{What: "hashicorp-raft+trivial-fsm", Value: l.p}})
			}
		}
	}
}
