package agent

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// memChunk is the memory burn-in's allocation unit (bytes): the region is
// mapped in chunks of this size, all held at once, so that the test covers
// that much distinct physical memory rather than reusing one chunk's pages.
const memChunk = 64 << 20

// Memory patterns, in the order they run over the whole region (each
// written to every chunk, then verified in every chunk).
const (
	memAddress = "address" // each 64-bit word holds its own index (address-in-address)
	memWalking = "walking" // word i holds 1<<(i mod 64), then its complement (walking ones, walking zeros)
	memRandom  = "random"  // an xorshift64 sequence from a per-run seed
)

// memFault, when set (tests), is called between a pattern's write and its
// verification of one chunk; it may change words (a flipped bit).
type memFault func(chunk int, pattern string, words []uint64)

// memResult is MemoryBurnIn's outcome: bytes mapped and tested, pattern
// passes completed over the whole region, and the first mismatch.
type memResult struct {
	Bytes  uint64
	Passes uint64
	Err    error
}

// MemoryBurnIn maps size bytes (rounded down to whole chunks, at least one)
// and runs the patterns over all of it until every pattern has run once
// and, while d has not passed, again with a new seed; a pass cut short by
// d still verifies what it wrote. The first word that reads back different
// from what was written fails the test, naming the chunk, offset and bits.
func MemoryBurnIn(ctx context.Context, size uint64, d time.Duration, seed uint64, fault memFault, progress func(float64)) memResult {
	n := int(max(size/memChunk, 1))
	chunks := make([][]uint64, 0, n)
	defer func() {
		for _, c := range chunks {
			_ = unix.Munmap(unsafe.Slice((*byte)(unsafe.Pointer(&c[0])), len(c)*8))
		}
	}()
	for i := 0; i < n; i++ {
		b, err := unix.Mmap(-1, 0, memChunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			if len(chunks) == 0 {
				return memResult{Err: fmt.Errorf("map %d bytes: %v", memChunk, err)}
			}
			break // test what could be mapped
		}
		chunks = append(chunks, unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), memChunk/8))
	}
	res := memResult{Bytes: uint64(len(chunks)) * memChunk}
	start := time.Now()
	deadline := start.Add(d)
	patterns := []string{memAddress, memWalking, memRandom}
	steps := float64(len(patterns) * len(chunks) * 2)
	for pass := uint64(0); ; pass++ {
		for pi, pat := range patterns {
			s := seed ^ (pass+1)*0x9E3779B97F4A7C15 ^ uint64(pi)
			for ci, c := range chunks {
				if ctx.Err() != nil {
					res.Err = ctx.Err()
					return res
				}
				memFill(pat, c, uint64(ci)*uint64(len(c)), s)
				if pass == 0 && progress != nil {
					progress(float64(pi*len(chunks)*2+ci) / steps)
				}
			}
			for ci, c := range chunks {
				if fault != nil {
					fault(ci, pat, c)
				}
				if i, got, want, bad := memVerify(pat, c, uint64(ci)*uint64(len(c)), s); bad {
					res.Err = fmt.Errorf("pattern %s, pass %d: chunk %d offset %#x (word %d) reads %#016x, wrote %#016x (bits %#016x differ)",
						pat, pass+1, ci, i*8, uint64(ci)*uint64(len(c))+uint64(i), got, want, got^want)
					return res
				}
				if pass == 0 && progress != nil {
					progress(float64(pi*len(chunks)*2+len(chunks)+ci) / steps)
				}
			}
		}
		res.Passes++
		if time.Now().After(deadline) {
			return res
		}
	}
}

// memWord is the value pattern pat puts in word i (global index g) of a
// chunk; random patterns are generated in sequence (memFill, memVerify).
func memWord(pat string, g uint64) uint64 {
	switch pat {
	case memAddress:
		return g
	case memWalking:
		return 1 << (g % 64)
	}
	return 0
}

// memFill writes pattern pat to c, whose first word has global index base.
// The walking pattern's second half (walking zeros) is written by
// memVerify as it checks the first: ones, then zeros.
func memFill(pat string, c []uint64, base, seed uint64) {
	if pat == memRandom {
		x := seed | 1
		for i := range c {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			c[i] = x
		}
		return
	}
	for i := range c {
		c[i] = memWord(pat, base+uint64(i))
	}
}

// memVerify checks c against pattern pat and returns the first differing
// word. For the walking pattern it then writes each word's complement and
// checks that too (walking zeros).
func memVerify(pat string, c []uint64, base, seed uint64) (int, uint64, uint64, bool) {
	switch pat {
	case memRandom:
		x := seed | 1
		for i := range c {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			if c[i] != x {
				return i, c[i], x, true
			}
		}
		return 0, 0, 0, false
	case memWalking:
		for i := range c {
			w := memWord(pat, base+uint64(i))
			if c[i] != w {
				return i, c[i], w, true
			}
			c[i] = ^w
		}
		for i := range c {
			w := ^memWord(pat, base+uint64(i))
			if c[i] != w {
				return i, c[i], w, true
			}
		}
		return 0, 0, 0, false
	}
	for i := range c {
		w := memWord(pat, base+uint64(i))
		if c[i] != w {
			return i, c[i], w, true
		}
	}
	return 0, 0, 0, false
}
