package agent

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"kiln/api/agentapi"
)

// The overwrite: one pass of a keyed pseudo-random pattern — AES-128-CTR keystream under a
// random per-erase key, the counter block of byte offset o being o/16 (big-endian), so any
// block's expected content can be computed on its own — then a read-back with O_DIRECT
// (full, or the first and last MiB plus K random 4 KiB blocks). A pattern, not zeros: a
// device that drops writes and returns zeros for unwritten (thin, discarded) blocks
// cannot pass, and the old content cannot match by accident. One pass is NIST SP 800-88
// Rev. 1 "Clear" for magnetic media; flash keeps remapped blocks the host cannot reach,
// which only a firmware method (sanitize, format, security erase) covers.

// pattern generates the expected content of the device at any offset.
type pattern struct{ block cipher.Block }

func newPattern() (*pattern, error) {
	key := make([]byte, 16)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return &pattern{block: b}, nil
}

// fill writes the pattern of [off, off+len(dst)) into dst; off is a multiple of 16.
func (p *pattern) fill(dst []byte, off int64) {
	var iv [16]byte
	binary.BigEndian.PutUint64(iv[8:], uint64(off/16))
	clear(dst)
	cipher.NewCTR(p.block, iv[:]).XORKeyStream(dst, dst)
}

// writeSkipping writes buf at off except for the parts inside skip (the test hook of a
// faulty writer).
func writeSkipping(dev *Device, buf []byte, off int64, skip []byteRange) error {
	end := off + int64(len(buf))
	cur := off
	for _, s := range skip {
		sEnd := s.off + s.n
		if sEnd <= cur || s.off >= end {
			continue
		}
		if s.off > cur {
			if _, err := dev.WriteAt(buf[cur-off:s.off-off], cur); err != nil {
				return err
			}
		}
		cur = min(sEnd, end)
	}
	if cur < end {
		_, err := dev.WriteAt(buf[cur-off:], cur)
		return err
	}
	return nil
}

// overwrite writes the pattern over the whole of dev and verifies it (ErasePolicy.Verify),
// filling c (method overwrite, outcome erased, verify_failed or failed).
func (a *Agent) overwrite(ctx context.Context, dev *Device, c *agentapi.DiskErase, pol agentapi.ErasePolicy, frac func(float64)) {
	c.Method = agentapi.EraseOverwrite
	fin := func(outcome, format string, args ...any) {
		c.Outcome = outcome
		attempt(c, agentapi.EraseOverwrite, outcome, format, args...)
	}
	pat, err := newPattern()
	if err != nil {
		fin(agentapi.EraseFailed, "pattern key: %v", err)
		return
	}
	buf := make([]byte, writeBufSize)
	start := time.Now()
	for off := int64(0); off < dev.Size; off += int64(len(buf)) {
		if ctx.Err() != nil {
			fin(agentapi.EraseFailed, "stopped at %d of %d bytes: %v", off, dev.Size, ctx.Err())
			return
		}
		n := min(int64(len(buf)), dev.Size-off)
		pat.fill(buf[:n], off)
		if err := writeSkipping(dev, buf[:n], off, a.cfg.erase.skipWrite); err != nil {
			fin(agentapi.EraseFailed, "write at %d: %v", off, err)
			return
		}
		frac(0.5 * float64(off+n) / float64(dev.Size))
	}
	if err := dev.Sync(); err != nil {
		fin(agentapi.EraseFailed, "sync: %v", err)
		return
	}
	writeSecs := time.Since(start).Seconds()
	var offs []int64 // nil: every block
	what := "full read-back"
	if pol.Verify != agentapi.VerifyFull {
		offs = sampleOffsets(dev.Size, pol.SampleBlocks)
		offs = mergeOffsets(offs, headTail(dev.Size))
		what = fmt.Sprintf("sampled read-back (first and last MiB + %d random 4 KiB blocks)", pol.SampleBlocks)
	}
	vstart := time.Now()
	checked, bad, first, err := verifyPattern(ctx, dev, pat, offs, func(f float64) { frac(0.5 + 0.5*f) })
	c.Coverage = float64(checked) / float64(dev.Size)
	if err != nil {
		c.Verification = fmt.Sprintf("%s failed after %d bytes: %v", what, checked, err)
		fin(agentapi.EraseFailed, "read-back: %v", err)
		return
	}
	c.Mismatches, c.FirstMismatch = bad, max(first, 0)
	c.Verification = fmt.Sprintf("%s of the pattern: %d bytes compared, %d 4 KiB blocks mismatched", what, checked, bad)
	if bad > 0 {
		c.Verification += fmt.Sprintf(", first at byte %d", first)
		c.Verified = false
		fin(agentapi.EraseVerifyFailed, "%d blocks not overwritten, first at byte %d", bad, first)
		return
	}
	c.Verified = true
	fin(agentapi.EraseErased, "1 pass AES-128-CTR pattern (random key), %d bytes written in %.1fs (%.0f MB/s), %d read back in %.1fs",
		dev.Size, writeSecs, float64(dev.Size)/1e6/max(writeSecs, 1e-9), checked, time.Since(vstart).Seconds())
}

// headTail returns the 4 KiB block offsets of the first and last MiB of a device.
func headTail(size int64) []int64 {
	var out []int64
	n := min(int64(eraseCheckBytes), size)
	for o := int64(0); o < n; o += eraseBlock {
		out = append(out, o)
	}
	last := ((size - 1) / eraseBlock) * eraseBlock
	for o := last; o >= 0 && o >= size-n; o -= eraseBlock {
		out = append(out, o)
	}
	return out
}

// mergeOffsets returns the sorted union of two offset lists.
func mergeOffsets(a, b []int64) []int64 {
	set := map[int64]bool{}
	for _, o := range append(append([]int64(nil), a...), b...) {
		set[o] = true
	}
	out := make([]int64, 0, len(set))
	for o := range set {
		out = append(out, o)
	}
	slices.Sort(out)
	return out
}

// verifyPattern reads dev back with O_DIRECT and compares it with pat: every byte when
// offs is nil, else the 4 KiB blocks at offs (sorted, distinct). It returns the bytes
// compared, the mismatched 4 KiB blocks and the first one's offset (-1 when none).
func verifyPattern(ctx context.Context, dev *Device, pat *pattern, offs []int64, frac func(float64)) (checked, bad, first int64, err error) {
	f, err := openDirect(dev.Path)
	if err != nil {
		return 0, 0, -1, err
	}
	defer f.Close()
	first = -1
	compare := func(got, want []byte, off int64) {
		for i := 0; i < len(got); i += eraseBlock {
			j := min(i+eraseBlock, len(got))
			if !bytes.Equal(got[i:j], want[i:j]) {
				bad++
				if first < 0 {
					first = off + int64(i)
				}
			}
		}
		checked += int64(len(got))
	}
	if offs == nil {
		got, want := alignedBuf(writeBufSize), make([]byte, writeBufSize)
		for off := int64(0); off < dev.Size; off += int64(len(got)) {
			if ctx.Err() != nil {
				return checked, bad, first, ctx.Err()
			}
			n := min(int64(len(got)), dev.Size-off)
			if k, err := f.ReadAt(got[:n], off); int64(k) < n {
				return checked, bad, first, fmt.Errorf("read at %d: %v", off, err)
			}
			pat.fill(want[:n], off)
			compare(got[:n], want[:n], off)
			frac(float64(off+n) / float64(dev.Size))
		}
		return checked, bad, first, nil
	}
	got, want := alignedBuf(eraseBlock), make([]byte, eraseBlock)
	for i, off := range offs {
		if ctx.Err() != nil {
			return checked, bad, first, ctx.Err()
		}
		n := min(int64(eraseBlock), dev.Size-off)
		if k, err := f.ReadAt(got[:n], off); int64(k) < n {
			return checked, bad, first, fmt.Errorf("read at %d: %v", off, err)
		}
		pat.fill(want[:n], off)
		compare(got[:n], want[:n], off)
		frac(float64(i+1) / float64(len(offs)))
	}
	return checked, bad, first, nil
}
