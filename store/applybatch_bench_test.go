package store

import (
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
)

func benchMachineRec(id string, i int) Machine {
	mac := func(n int) string {
		return fmt.Sprintf("52:54:%02x:%02x:%02x:%02x", byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	return Machine{Meta: Meta{ID: id}, Name: id, Site: "site-1", Rack: fmt.Sprintf("r%02d", i%40), RackUnit: i % 42,
		Labels: map[string]string{"pool": "general", "zone": "a"},
		Intended: Hardware{Serial: "SN" + id, Vendor: "Dell Inc.", Model: "PowerEdge R650", CPUs: 64,
			MemoryBytes: 512 << 30, BMCAddress: "10.1.2.3", Firmware: "2.19.1",
			Disks: []Disk{{Serial: "S1" + id, Model: "SAMSUNG MZ7L3960", SizeBytes: 960 << 30},
				{Serial: "S2" + id, Model: "SAMSUNG MZ7L3960", SizeBytes: 960 << 30}},
			NICs: []NIC{{Name: "eno1", MAC: mac(2 * i)}, {Name: "eno2", MAC: mac(2*i + 1)}}},
		RootDisk: DiskRule{MinSizeBytes: 100 << 30}}
}

// BenchmarkApplyBatch64: one 64-entry batch of single-machine creates
// (random IDs, as prepare assigns them) into a growing fsm.db. ns/op is
// per batch.
func BenchmarkApplyBatch64(b *testing.B) { benchApplyBatch(b, 64, false) }

// BenchmarkApplyBatch64Leader: the same with the entries predecoded, as on
// the leader (decoding is then done by the writers, not timed here).
func BenchmarkApplyBatch64Leader(b *testing.B) { benchApplyBatch(b, 64, true) }

// BenchmarkApplyBatch1Leader: one single-entry batch per op (one writer:
// every command is its own bbolt transaction), predecoded.
func BenchmarkApplyBatch1Leader(b *testing.B) { benchApplyBatch(b, 1, true) }

func benchApplyBatch(b *testing.B, size int, pre bool) {
	f, err := openFSM(filepath.Join(b.TempDir(), "fsm.db"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	defer f.close()
	idx := uint64(0)
	n := 0
	mk := func() []*raft.Log {
		logs := make([]*raft.Log, size)
		for i := range logs {
			idx++
			n++
			c := &command{Type: CmdPutMachinesV2, Time: t0, Machines: []Machine{benchMachineRec(randID("m-"), n)}}
			data, err := encodeCommand(c)
			if err != nil {
				b.Fatal(err)
			}
			logs[i] = &raft.Log{Index: idx, Type: raft.LogCommand, Data: data}
		}
		return logs
	}
	for i := 0; i < 300*64/size; i++ { // ~19k machines already stored
		f.ApplyBatch(mk())
	}
	for b.Loop() { // b.Loop: the warm-up above runs once, not per b.N probe
		b.StopTimer()
		logs := mk()
		var dones []func()
		if pre {
			for _, l := range logs {
				dones = append(dones, f.predecode(l.Data))
			}
		}
		b.StartTimer()
		for _, r := range f.ApplyBatch(logs) {
			if r.(*applyResult).Err != nil {
				b.Fatal(r.(*applyResult).Err)
			}
		}
		for _, d := range dones {
			d()
		}
	}
}
