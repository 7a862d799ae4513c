package httpboot

import (
	"runtime"
	"time"
)

// watchHeap samples HeapInuse every 10 ms until done closes; returns the peak.
func watchHeap(done <-chan struct{}) uint64 {
	var peak uint64
	var ms runtime.MemStats
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		runtime.ReadMemStats(&ms)
		if ms.HeapInuse > peak {
			peak = ms.HeapInuse
		}
		select {
		case <-done:
			return peak
		case <-t.C:
		}
	}
}
