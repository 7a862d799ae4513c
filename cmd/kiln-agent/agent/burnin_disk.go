package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// diskAlign is the alignment of the disk burn-in's regions and I/O (bytes):
// a multiple of every logical block size, as O_DIRECT needs.
const (
	diskAlign  = 1 << 20
	diskIOSize = 1 << 20
	diskBlock  = 4096 // the pattern's unit: each block carries its own offset
)

// diskResult is DiskBurnIn's outcome: bytes written and read back, regions
// completed, and the first error (I/O error or mismatch, with its offset).
type diskResult struct {
	Bytes   uint64
	Regions int
	Err     error
}

// diskRegions places n regions of size bytes (both multiples of diskAlign)
// evenly over a disk of total bytes: the first at 0, the last ending at
// the disk's last aligned byte.
func diskRegions(total, size int64, n int) []int64 {
	if size > total {
		size = total / diskAlign * diskAlign
	}
	if n < 1 || size <= 0 {
		return nil
	}
	span := (total - size) / diskAlign * diskAlign
	if n == 1 || span == 0 {
		return []int64{0}
	}
	offs := make([]int64, 0, n)
	for i := 0; i < n; i++ {
		off := span * int64(i) / int64(n-1) / diskAlign * diskAlign
		if len(offs) > 0 && off == offs[len(offs)-1] {
			continue
		}
		offs = append(offs, off)
	}
	return offs
}

// diskFill fills buf (at disk offset off) with the keyed pattern: each
// 4 KiB block starts with its offset and the key, then xorshift64 words
// seeded by both, so a block written to or read from the wrong place is a
// mismatch too.
func diskFill(buf []byte, off int64, key uint64) {
	for b := 0; b < len(buf); b += diskBlock {
		o := uint64(off) + uint64(b)
		binary.LittleEndian.PutUint64(buf[b:], o)
		binary.LittleEndian.PutUint64(buf[b+8:], key)
		x := o ^ key | 1
		for i := b + 16; i < b+diskBlock; i += 8 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			binary.LittleEndian.PutUint64(buf[i:], x)
		}
	}
}

// DiskBurnIn writes the keyed pattern over regions evenly spread on path
// (O_DIRECT, regionBytes each, at most n of them; see diskRegions), syncs,
// reads every region back (O_DIRECT: from the device, not the page cache)
// and compares, then zeroes the regions again. It stops at the first I/O
// error or mismatch, or when d has passed (what was written is still read
// back). The caller has checked
// that the disk holds nothing to keep. afterWrite, when set (tests: a fault
// injected into the medium), runs between the sync and the read-back.
func DiskBurnIn(ctx context.Context, path string, regionBytes int64, n int, d time.Duration, key uint64, afterWrite func(offs []int64), progress func(float64)) diskResult {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		return diskResult{Err: fmt.Errorf("open %s with O_DIRECT: %v", path, err)}
	}
	defer f.Close()
	total, err := f.Seek(0, 2)
	if err != nil || total <= 0 {
		return diskResult{Err: fmt.Errorf("size of %s: %d bytes, %v", path, total, err)}
	}
	regionBytes = max(regionBytes/diskAlign*diskAlign, diskAlign)
	offs := diskRegions(total, regionBytes, n)
	if len(offs) == 0 {
		return diskResult{Err: fmt.Errorf("%s (%d bytes) is smaller than one %d-byte region", path, total, diskAlign)}
	}
	regionBytes = min(regionBytes, total/diskAlign*diskAlign)
	buf, want := alignedBuf(diskIOSize), make([]byte, diskIOSize)
	deadline := time.Now().Add(d)
	var res diskResult
	all := float64(2 * int64(len(offs)) * regionBytes)
	var done float64
	written := 0
	for _, off := range offs {
		if written > 0 && time.Now().After(deadline) {
			break
		}
		for o := off; o < off+regionBytes; o += diskIOSize {
			if ctx.Err() != nil {
				return diskResult{Bytes: res.Bytes, Err: ctx.Err()}
			}
			diskFill(buf, o, key)
			if k, err := f.WriteAt(buf, o); err != nil || k != len(buf) {
				res.Err = fmt.Errorf("write %s at offset %d: %d of %d bytes: %v", path, o, k, len(buf), err)
				return res
			}
			done += diskIOSize
			if progress != nil {
				progress(done / all)
			}
		}
		written++
	}
	if err := f.Sync(); err != nil {
		res.Err = fmt.Errorf("sync %s: %v", path, err)
		return res
	}
	if afterWrite != nil {
		afterWrite(offs[:written])
	}
	for _, off := range offs[:written] {
		for o := off; o < off+regionBytes; o += diskIOSize {
			if ctx.Err() != nil {
				res.Err = ctx.Err()
				return res
			}
			k, err := f.ReadAt(buf, o)
			if err != nil || k != len(buf) {
				res.Err = fmt.Errorf("read %s at offset %d: %d of %d bytes: %v", path, o, k, len(buf), err)
				return res
			}
			diskFill(want, o, key)
			for b := 0; b < len(buf); b += 8 {
				if g, w := binary.LittleEndian.Uint64(buf[b:]), binary.LittleEndian.Uint64(want[b:]); g != w {
					res.Err = fmt.Errorf("mismatch on %s at offset %d: reads %#016x, wrote %#016x", path, o+int64(b), g, w)
					return res
				}
			}
			res.Bytes += diskIOSize
			done += diskIOSize
			if progress != nil {
				progress(done / all)
			}
		}
		res.Regions++
	}
	// Leave the regions zeroed (what a new disk holds; the build's own checks
	// expect zeros outside what it writes). A write failing here fails the test too.
	clear(buf)
	for _, off := range offs[:written] {
		for o := off; o < off+regionBytes; o += diskIOSize {
			if k, err := f.WriteAt(buf, o); err != nil || k != len(buf) {
				res.Err = fmt.Errorf("zero %s at offset %d: %d of %d bytes: %v", path, o, k, len(buf), err)
				return res
			}
		}
	}
	if err := f.Sync(); err != nil {
		res.Err = fmt.Errorf("sync %s: %v", path, err)
	}
	return res
}
