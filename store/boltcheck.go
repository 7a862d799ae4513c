package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// verifyBoltFile checks a bbolt file's structure with plain bounded reads
// (no mmap), before bbolt itself touches it: bbolt trusts page headers and
// a garbled page can make it read outside its mapping (a fault no recover
// catches). It checks both meta pages (magic, version, FNV-64a checksum)
// and, from the newest valid one, that the file holds every page up to the
// high-water mark, the freelist page, and every branch/leaf page reachable
// from the root (page IDs, flags, element bounds, nested buckets).
// Layout: go.etcd.io/bbolt internal/common (page.go, meta.go, inlinepage).
// It reads the whole tree once: O(file size).
func verifyBoltFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	return verifyBolt(f, st.Size())
}

// verifyBolt is verifyBoltFile over any reader of size bytes.
func verifyBolt(r io.ReaderAt, size int64) error {
	v := &boltVerifier{f: r, size: size, seen: map[uint64]bool{}}
	return v.run()
}

const (
	bpHeader      = 16
	bpBranch      = 0x01
	bpLeaf        = 0x02
	bpMeta        = 0x04
	bpFreelist    = 0x10
	bMagic        = 0xED0CDAED
	bVersion      = 2
	bBucketLeaf   = 0x01
	bElemSize     = 16
	bMaxDepth     = 64
	bNoFreelist   = 0xffffffffffffffff
	bMetaChkBytes = 56 // meta bytes covered by the checksum
)

type boltMeta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64
	txid     uint64
}

type boltVerifier struct {
	f    io.ReaderAt
	size int64
	meta boltMeta
	seen map[uint64]bool
}

func (v *boltVerifier) readAt(off int64, n int) ([]byte, error) {
	if off < 0 || n < 0 || off+int64(n) > v.size {
		return nil, fmt.Errorf("read of %d bytes at %d is past the end of the file (%d bytes): truncated", n, off, v.size)
	}
	b := make([]byte, n)
	if _, err := v.f.ReadAt(b, off); err != nil {
		return nil, err
	}
	return b, nil
}

func parseMeta(p []byte) (boltMeta, error) {
	if len(p) < bpHeader+64 {
		return boltMeta{}, errors.New("short meta page")
	}
	if binary.LittleEndian.Uint16(p[8:])&bpMeta == 0 {
		return boltMeta{}, errors.New("meta page flag missing")
	}
	m := p[bpHeader:]
	h := fnv.New64a()
	h.Write(m[:bMetaChkBytes])
	if h.Sum64() != binary.LittleEndian.Uint64(m[bMetaChkBytes:]) {
		return boltMeta{}, errors.New("meta checksum mismatch")
	}
	if binary.LittleEndian.Uint32(m[0:]) != bMagic {
		return boltMeta{}, errors.New("bad magic")
	}
	if binary.LittleEndian.Uint32(m[4:]) != bVersion {
		return boltMeta{}, errors.New("unsupported version")
	}
	return boltMeta{pageSize: binary.LittleEndian.Uint32(m[8:]), root: binary.LittleEndian.Uint64(m[16:]),
		freelist: binary.LittleEndian.Uint64(m[32:]), pgid: binary.LittleEndian.Uint64(m[40:]),
		txid: binary.LittleEndian.Uint64(m[48:])}, nil
}

func (v *boltVerifier) run() error {
	if v.size < 2*1024 {
		return fmt.Errorf("file is %d bytes: truncated", v.size)
	}
	p0, err := v.readAt(0, bpHeader+64)
	if err != nil {
		return err
	}
	m0, err0 := parseMeta(p0)
	var m1 boltMeta
	err1 := errors.New("meta 0 unreadable")
	if err0 == nil || true {
		ps := int64(m0.pageSize)
		if err0 != nil {
			ps = 4096
		}
		if p1, err := v.readAt(ps, bpHeader+64); err == nil {
			m1, err1 = parseMeta(p1)
		} else {
			err1 = err
		}
	}
	switch {
	case err0 != nil && err1 != nil:
		return fmt.Errorf("both meta pages invalid: %v; %v", err0, err1)
	case err0 != nil:
		v.meta = m1
	case err1 != nil || m0.txid >= m1.txid:
		v.meta = m0
	default:
		v.meta = m1
	}
	ps := uint64(v.meta.pageSize)
	if ps < 512 || ps > 1<<20 || ps&(ps-1) != 0 {
		return fmt.Errorf("meta: bad page size %d", ps)
	}
	if v.meta.pgid < 2 || int64(v.meta.pgid*ps) > v.size || v.meta.pgid > uint64(v.size)/ps+1 {
		return fmt.Errorf("meta says %d pages of %d bytes but the file has %d bytes: truncated", v.meta.pgid, ps, v.size)
	}
	if v.meta.freelist != bNoFreelist {
		if err := v.freelist(v.meta.freelist); err != nil {
			return err
		}
	}
	return v.tree(v.meta.root, 0)
}

// page reads page id with its overflow pages and checks its header.
func (v *boltVerifier) page(id uint64, wantFlags uint16) ([]byte, error) {
	ps := int64(v.meta.pageSize)
	if id < 2 || id >= v.meta.pgid {
		return nil, fmt.Errorf("page id %d outside 2..%d", id, v.meta.pgid-1)
	}
	h, err := v.readAt(int64(id)*ps, bpHeader)
	if err != nil {
		return nil, err
	}
	if got := binary.LittleEndian.Uint64(h); got != id {
		return nil, fmt.Errorf("page %d identifies as %d", id, got)
	}
	if fl := binary.LittleEndian.Uint16(h[8:]); fl&wantFlags == 0 {
		return nil, fmt.Errorf("page %d has flags %#x, want %#x", id, fl, wantFlags)
	}
	ov := uint64(binary.LittleEndian.Uint32(h[12:]))
	if id+ov >= v.meta.pgid {
		return nil, fmt.Errorf("page %d overflow %d runs past high-water page %d", id, ov, v.meta.pgid)
	}
	return v.readAt(int64(id)*ps, int((ov+1)*uint64(ps)))
}

func (v *boltVerifier) freelist(id uint64) error {
	p, err := v.page(id, bpFreelist)
	if err != nil {
		return fmt.Errorf("freelist: %w", err)
	}
	n := uint64(binary.LittleEndian.Uint16(p[10:]))
	data := p[bpHeader:]
	if n == 0xFFFF {
		if len(data) < 8 {
			return errors.New("freelist: short")
		}
		n = binary.LittleEndian.Uint64(data)
		data = data[8:]
	}
	if n > uint64(len(data))/8 {
		return fmt.Errorf("freelist: %d ids do not fit in the page", n)
	}
	for i := uint64(0); i < n; i++ {
		if fid := binary.LittleEndian.Uint64(data[i*8:]); fid < 2 || fid >= v.meta.pgid {
			return fmt.Errorf("freelist: page id %d outside the file", fid)
		}
	}
	return nil
}

func (v *boltVerifier) tree(id uint64, depth int) error {
	if depth > bMaxDepth {
		return errors.New("tree deeper than 64 levels")
	}
	if v.seen[id] {
		return fmt.Errorf("page %d reachable twice", id)
	}
	v.seen[id] = true
	p, err := v.page(id, bpBranch|bpLeaf)
	if err != nil {
		return err
	}
	return v.nodes(p, depth, fmt.Sprintf("page %d", id))
}

// nodes checks the elements of a branch or leaf page held in p (which may
// be an inline bucket page inside a value) and recurses.
func (v *boltVerifier) nodes(p []byte, depth int, where string) error {
	if len(p) < bpHeader {
		return fmt.Errorf("%s: short page", where)
	}
	flags := binary.LittleEndian.Uint16(p[8:])
	n := int(binary.LittleEndian.Uint16(p[10:]))
	if bpHeader+n*bElemSize > len(p) {
		return fmt.Errorf("%s: %d elements do not fit", where, n)
	}
	for i := 0; i < n; i++ {
		eo := bpHeader + i*bElemSize
		e := p[eo : eo+bElemSize]
		switch {
		case flags&bpBranch != 0:
			pos, ksz := int(binary.LittleEndian.Uint32(e)), int(binary.LittleEndian.Uint32(e[4:]))
			if eo+pos+ksz > len(p) || eo+pos < 0 {
				return fmt.Errorf("%s: branch element %d out of bounds", where, i)
			}
			if err := v.tree(binary.LittleEndian.Uint64(e[8:]), depth+1); err != nil {
				return err
			}
		case flags&bpLeaf != 0:
			fl := binary.LittleEndian.Uint32(e)
			pos := int(binary.LittleEndian.Uint32(e[4:]))
			ksz, vsz := int(binary.LittleEndian.Uint32(e[8:])), int(binary.LittleEndian.Uint32(e[12:]))
			end := eo + pos + ksz + vsz
			if pos < 0 || ksz < 0 || vsz < 0 || end > len(p) || end < eo {
				return fmt.Errorf("%s: leaf element %d out of bounds", where, i)
			}
			if fl&bBucketLeaf == 0 {
				continue
			}
			val := p[eo+pos+ksz : end]
			if len(val) < 16 {
				return fmt.Errorf("%s: bucket element %d too short", where, i)
			}
			if root := binary.LittleEndian.Uint64(val); root != 0 {
				if err := v.tree(root, depth+1); err != nil {
					return err
				}
			} else if inl := val[16:]; len(inl) >= bpHeader && binary.LittleEndian.Uint16(inl[8:])&bpLeaf == 0 {
				// bbolt writes an inline bucket as one leaf page; a branch
				// there names child pages, on which bbolt panics
				// (Bucket.pageNode: "inline bucket non-zero page access").
				return fmt.Errorf("%s: inline bucket of element %d is not a leaf page", where, i)
			} else if err := v.nodes(inl, depth+1, where+" inline bucket"); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: neither branch nor leaf (flags %#x)", where, flags)
		}
	}
	return nil
}
