package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// The CPU burn-in's known-answer work unit (cmd/kiln-agent/DESIGN.md
// "Burn-in"): three kernels whose results are fixed by mathematics or by the
// algorithm, compared against the constants below (computed once, off the
// machine under test), so that a CPU that miscomputes fails the unit instead
// of only getting warm.
const (
	// cpuSHASeed hashed, then the digest hashed cpuSHARounds times more.
	cpuSHASeed   = "kiln burn-in cpu"
	cpuSHARounds = 8192
	cpuSHAWant   = "bc72ba35fc766d57893239ef7308a29e226b431e28a18053996fbc8e88bdce62"
	// cpuSieveN: the primes below 2^17, counted by a sieve of Eratosthenes: π(131072) = 12251.
	cpuSieveN    = 1 << 17
	cpuSieveWant = 12251
	// cpuFloatTerms of Σ 1/k² summed in order, k = 1.. (IEEE-754 double, no fused operations):
	// the bits of the result.
	cpuFloatTerms = 100000
	cpuFloatWant  = 0x3ffa519be5fbb345
	// cpuMulTerms of an xorshift64 sequence multiplied by 0x2545F4914F6CDD1D and summed mod 2^64.
	cpuMulTerms = 100000
	cpuMulWant  = 0x59db48a2be7f0913
)

// cpuFault, when set (tests), is called before each unit on each CPU; true
// flips one bit of that unit's SHA-256 chain midway, as a miscomputing ALU would.
type cpuFault func(cpu int, unit uint64) bool

// cpuUnit runs one known-answer unit and returns the first wrong result ("" = all right).
func cpuUnit(flip bool, sieve []bool) string {
	h := sha256.Sum256([]byte(cpuSHASeed))
	for i := 0; i < cpuSHARounds; i++ {
		if flip && i == cpuSHARounds/2 {
			h[7] ^= 0x10
		}
		h = sha256.Sum256(h[:])
	}
	if got := hex.EncodeToString(h[:]); got != cpuSHAWant {
		return fmt.Sprintf("sha256 chain gave %s, want %s", got, cpuSHAWant)
	}
	clear(sieve)
	n := 0
	for i := 2; i < cpuSieveN; i++ {
		if !sieve[i] {
			n++
			for j := i * i; j < cpuSieveN; j += i {
				sieve[j] = true
			}
		}
	}
	if n != cpuSieveWant {
		return fmt.Sprintf("sieve counted %d primes below %d, want %d", n, cpuSieveN, cpuSieveWant)
	}
	s := 0.0
	for k := 1; k <= cpuFloatTerms; k++ {
		s += 1 / (float64(k) * float64(k))
	}
	if b := math.Float64bits(s); b != cpuFloatWant {
		return fmt.Sprintf("float sum gave %#x, want %#x", b, uint64(cpuFloatWant))
	}
	x, acc := uint64(0x9E3779B97F4A7C15), uint64(0)
	for i := 0; i < cpuMulTerms; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		acc += x * 0x2545F4914F6CDD1D
	}
	if acc != cpuMulWant {
		return fmt.Sprintf("multiply sum gave %#x, want %#x", acc, uint64(cpuMulWant))
	}
	return ""
}

// cpuResult is CPUBurnIn's outcome: units computed over all CPUs and the first wrong one.
type cpuResult struct {
	CPUs  int
	Units uint64
	Err   error // the first miscomputation (names the CPU), nil when every unit was right
}

// CPUBurnIn runs known-answer units on every CPU the agent may run on (its
// affinity mask), one goroutine locked to each CPU, for d (at least one unit
// per CPU), and stops all of them at the first wrong result. progress
// receives the fraction of d elapsed.
func CPUBurnIn(ctx context.Context, d time.Duration, fault cpuFault, progress func(float64)) cpuResult {
	var set unix.CPUSet
	cpus := []int{}
	if err := unix.SchedGetaffinity(0, &set); err == nil {
		for i := 0; i < 1024; i++ {
			if set.IsSet(i) {
				cpus = append(cpus, i)
			}
		}
	}
	pinned := len(cpus) > 0
	if !pinned {
		for i := 0; i < runtime.NumCPU(); i++ {
			cpus = append(cpus, i)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	deadline := start.Add(d)
	var units atomic.Uint64
	var once sync.Once
	var firstErr error
	var wg sync.WaitGroup
	for _, cpu := range cpus {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if pinned {
				// Locked and never unlocked: the thread, pinned to cpu, ends with
				// the goroutine instead of going back to the scheduler.
				runtime.LockOSThread()
				var one unix.CPUSet
				one.Set(cpu)
				_ = unix.SchedSetaffinity(0, &one) // the thread only; a refusal leaves it unpinned
			}
			sieve := make([]bool, cpuSieveN)
			for u := uint64(0); ; u++ {
				if u > 0 && (ctx.Err() != nil || time.Now().After(deadline)) {
					return
				}
				if msg := cpuUnit(fault != nil && fault(cpu, u), sieve); msg != "" {
					once.Do(func() { firstErr = fmt.Errorf("cpu %d, unit %d: %s", cpu, u, msg) })
					cancel()
					return
				}
				units.Add(1)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-done:
			return cpuResult{CPUs: len(cpus), Units: units.Load(), Err: firstErr}
		case <-t.C:
			if progress != nil && d > 0 {
				progress(min(1, float64(time.Since(start))/float64(d)))
			}
		}
	}
}
