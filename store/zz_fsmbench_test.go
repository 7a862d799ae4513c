package store

import (
	"fmt"
	"log/slog"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func benchBatch(b *testing.B, n int) {
	f, err := openFSM(filepath.Join(b.TempDir(), "fsm.db"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	defer f.close()
	idx := uint64(0)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		logs := make([]*raft.Log, n)
		for j := range logs {
			idx++
			id := fmt.Sprintf("m-%02d-%07d", j, i)
			d, _ := encodeCommand(&command{Type: CmdPutMachines, Time: time.Now(), Machines: []Machine{{Meta: Meta{ID: id}, Name: id, Intended: Hardware{Serial: "x", NICs: []NIC{{MAC: fmt.Sprintf("02:00:%02x:%02x:%02x:%02x", j, i>>16&255, i>>8&255, i&255)}}}}}})
			logs[j] = &raft.Log{Index: idx, Type: raft.LogCommand, Data: d}
		}
		f.ApplyBatch(logs)
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "us/cmd")
}
func BenchmarkApply1(b *testing.B)  { benchBatch(b, 1) }
func BenchmarkApply64(b *testing.B) { benchBatch(b, 64) }
