package agent

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"unicode/utf16"
)

// A minimal FAT16 formatter for the NoCloud cidata volume (Microsoft "FAT: General
// Overview of On-Disk Format" 1.03, and the VFAT long-name extension). It writes a
// boot sector with an extended BPB, two FATs, a 512-entry root directory holding the
// volume label plus one long-name + 8.3 entry pair per file, and the files in contiguous
// cluster chains. Only a root directory is supported: that is all NoCloud needs.

// FATFile is one file of the cidata volume.
type FATFile struct {
	Name string
	Data []byte
}

const (
	fatSector      = 512
	fatSecPerClus  = 4
	fatRootEntries = 512
	fatReserved    = 1
	fatNumFATs     = 2
	fatMinClusters = 4085  // below: FAT12
	fatMaxClusters = 65524 // above: FAT32
)

// fatDate is 2020-01-01 00:00 so that the volume's bytes depend only on its contents.
const fatDate = (2020-1980)<<9 | 1<<5 | 1

// MakeFAT16 formats size bytes of w at offset off as FAT16 with volume label label
// (upper-cased, at most 11 bytes) holding files in the root directory. hiddenSectors is
// the volume's start in 512-byte sectors (BPB_HiddSec). Errors wrap ErrFATLayout.
func MakeFAT16(w io.WriterAt, off, size int64, label string, volID uint32, hiddenSectors uint32, files []FATFile) error {
	total := size / fatSector
	rootSecs := int64(fatRootEntries * 32 / fatSector)
	// Solve for the FAT size: each FAT holds (clusters+2) 16-bit entries.
	fatSecs := int64(1)
	var clusters int64
	for {
		clusters = (total - fatReserved - fatNumFATs*fatSecs - rootSecs) / fatSecPerClus
		need := ((clusters+2)*2 + fatSector - 1) / fatSector
		if need <= fatSecs {
			break
		}
		fatSecs = need
	}
	if clusters < fatMinClusters || clusters > fatMaxClusters {
		return fmt.Errorf("%w: %d clusters in %d bytes", ErrFATLayout, clusters, size)
	}
	if len(label) > 11 {
		return fmt.Errorf("%w: label %q longer than 11 bytes", ErrFATLayout, label)
	}
	lbl := []byte(fmt.Sprintf("%-11s", strings.ToUpper(label)))

	bs := make([]byte, fatSector)
	copy(bs[0:], []byte{0xEB, 0x3C, 0x90})
	copy(bs[3:11], "KILN    ")
	binary.LittleEndian.PutUint16(bs[11:], fatSector)
	bs[13] = fatSecPerClus
	binary.LittleEndian.PutUint16(bs[14:], fatReserved)
	bs[16] = fatNumFATs
	binary.LittleEndian.PutUint16(bs[17:], fatRootEntries)
	if total < 0x10000 {
		binary.LittleEndian.PutUint16(bs[19:], uint16(total))
	} else {
		binary.LittleEndian.PutUint32(bs[32:], uint32(total))
	}
	bs[21] = 0xF8
	binary.LittleEndian.PutUint16(bs[22:], uint16(fatSecs))
	binary.LittleEndian.PutUint16(bs[24:], 63)
	binary.LittleEndian.PutUint16(bs[26:], 255)
	binary.LittleEndian.PutUint32(bs[28:], hiddenSectors)
	bs[36] = 0x80
	bs[38] = 0x29
	binary.LittleEndian.PutUint32(bs[39:], volID)
	copy(bs[43:54], lbl)
	copy(bs[54:62], "FAT16   ")
	bs[510], bs[511] = 0x55, 0xAA

	fat := make([]byte, fatSecs*fatSector)
	binary.LittleEndian.PutUint16(fat[0:], 0xFFF8)
	binary.LittleEndian.PutUint16(fat[2:], 0xFFFF)
	root := make([]byte, rootSecs*fatSector)
	copy(root[0:11], lbl)
	root[11] = 0x08 // ATTR_VOLUME_ID
	binary.LittleEndian.PutUint16(root[24:], fatDate)
	dirPos := 32
	dataStart := off + (fatReserved+fatNumFATs*fatSecs+rootSecs)*fatSector
	clusBytes := int64(fatSecPerClus * fatSector)
	next := int64(2)
	used := map[string]bool{}
	for _, f := range files {
		n := (int64(len(f.Data)) + clusBytes - 1) / clusBytes
		if next+n-2 > clusters {
			return fmt.Errorf("%w: files do not fit", ErrFATLayout)
		}
		first := uint16(0)
		if n > 0 {
			first = uint16(next)
			for c := next; c < next+n; c++ {
				v := uint16(c + 1)
				if c == next+n-1 {
					v = 0xFFFF
				}
				binary.LittleEndian.PutUint16(fat[2*c:], v)
			}
			buf := make([]byte, n*clusBytes)
			copy(buf, f.Data)
			if _, err := w.WriteAt(buf, dataStart+(next-2)*clusBytes); err != nil {
				return fmt.Errorf("write %s: %w", f.Name, err)
			}
			next += n
		}
		ents, err := dirEntries(f.Name, first, uint32(len(f.Data)), used)
		if err != nil {
			return err
		}
		if dirPos+len(ents) > len(root) {
			return fmt.Errorf("%w: root directory full", ErrFATLayout)
		}
		copy(root[dirPos:], ents)
		dirPos += len(ents)
	}
	pos := off
	for _, part := range [][]byte{bs, fat, fat, root} {
		if _, err := w.WriteAt(part, pos); err != nil {
			return fmt.Errorf("write FAT metadata: %w", err)
		}
		pos += int64(len(part))
	}
	return nil
}

// shortName makes a unique 8.3 alias ("USER-D~1") for a long name.
func shortName(name string, used map[string]bool) ([11]byte, error) {
	var out [11]byte
	clean := func(s string) string {
		var b strings.Builder
		for _, r := range strings.ToUpper(s) {
			switch {
			case r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("!#$%&'()-@^_`{}~", r):
				b.WriteRune(r)
			case r == ' ' || r == '.':
			default:
				b.WriteRune('_')
			}
		}
		return b.String()
	}
	base, ext := name, ""
	if i := strings.LastIndex(name, "."); i > 0 {
		base, ext = name[:i], name[i+1:]
	}
	b, e := clean(base), clean(ext)
	if len(e) > 3 {
		e = e[:3]
	}
	if len(b) > 6 {
		b = b[:6]
	}
	for i := 1; i < 10; i++ {
		cand := fmt.Sprintf("%-8s%-3s", fmt.Sprintf("%s~%d", b, i), e)
		if !used[cand] {
			used[cand] = true
			copy(out[:], cand)
			return out, nil
		}
	}
	return out, fmt.Errorf("%w: too many names like %q", ErrFATLayout, name)
}

func lfnChecksum(sn [11]byte) byte {
	var sum byte
	for _, c := range sn {
		sum = (sum&1)<<7 + sum>>1 + c
	}
	return sum
}

// dirEntries returns the VFAT long-name entries (last first) followed by the 8.3 entry.
func dirEntries(name string, cluster uint16, size uint32, used map[string]bool) ([]byte, error) {
	if name == "" || len(name) > 255 {
		return nil, fmt.Errorf("%w: bad name %q", ErrFATLayout, name)
	}
	sn, err := shortName(name, used)
	if err != nil {
		return nil, err
	}
	u := utf16.Encode([]rune(name))
	n := (len(u) + 12) / 13
	padded := make([]uint16, n*13)
	for i := range padded {
		switch {
		case i < len(u):
			padded[i] = u[i]
		case i == len(u):
			padded[i] = 0
		default:
			padded[i] = 0xFFFF
		}
	}
	sum := lfnChecksum(sn)
	out := make([]byte, 0, (n+1)*32)
	for seq := n; seq >= 1; seq-- {
		e := make([]byte, 32)
		e[0] = byte(seq)
		if seq == n {
			e[0] |= 0x40
		}
		e[11] = 0x0F
		e[13] = sum
		chars := padded[(seq-1)*13 : seq*13]
		offs := []int{1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30}
		for i, o := range offs {
			binary.LittleEndian.PutUint16(e[o:], chars[i])
		}
		out = append(out, e...)
	}
	e := make([]byte, 32)
	copy(e[0:11], sn[:])
	e[11] = 0x20 // ATTR_ARCHIVE
	binary.LittleEndian.PutUint16(e[16:], fatDate)
	binary.LittleEndian.PutUint16(e[18:], fatDate)
	binary.LittleEndian.PutUint16(e[24:], fatDate)
	binary.LittleEndian.PutUint16(e[26:], cluster)
	binary.LittleEndian.PutUint32(e[28:], size)
	return append(out, e...), nil
}
