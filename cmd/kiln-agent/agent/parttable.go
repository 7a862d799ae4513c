package agent

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"unicode/utf16"
)

// Partition-table appending (stage step). The image brings its own partition table
// (MBR or GPT); the staged cidata partition is appended AFTER the image's end, aligned to
// 1 MiB, so no byte of the image's file systems changes. What does change inside the image
// range is reported sector by sector (PartInfo.Changed):
//
//   - MBR (https://uefi.org/specs/UEFI/2.10/05_GUID_Partition_Table_Format.html §5.2.1 legacy
//     MBR layout): one free primary slot of sector 0 gets a type 0x0C (FAT32 LBA; Linux and
//     cloud-init do not care about the type, they look for the CIDATA label) entry with
//     LBA-only CHS (FE FF FF). Only sector 0 changes.
//   - GPT (UEFI 2.10 §5.3): the first empty entry of the primary array gets a Basic Data
//     entry named "cidata"; the header's LastUsableLBA and AlternateLBA are moved to the
//     real end of the disk (the image was built for a smaller disk), both CRC32s are
//     recomputed, the backup array and header are written at the disk's end, and the
//     protective MBR's size is widened to the disk (§5.2.3). Changed: sector 0, LBA 1 and the
//     array sector holding the new entry. The image's stale backup header at its own last
//     LBA is left as it was (it lies inside the image range and is no longer referenced).

// PartInfo describes the appended partition. Offsets and sizes are in bytes; Changed lists
// the logical blocks (of SectorSize bytes) below the image end whose contents stage changed.
type PartInfo struct {
	Scheme     string // "mbr" or "gpt"
	Index      int    // 1-based partition number
	Start      int64
	Size       int64
	SectorSize int
	Changed    []int64
}

const stageAlign = 1 << 20

// basicDataGUID is EBD0A0A2-B9E5-4433-87C0-68B6B72699C7 (Microsoft basic data) in on-disk
// mixed-endian order.
var basicDataGUID = guidBytes(0xEBD0A0A2, 0xB9E5, 0x4433, [8]byte{0x87, 0xC0, 0x68, 0xB6, 0xB7, 0x26, 0x99, 0xC7})

func guidBytes(a uint32, b, c uint16, d [8]byte) [16]byte {
	var g [16]byte
	binary.LittleEndian.PutUint32(g[0:], a)
	binary.LittleEndian.PutUint16(g[4:], b)
	binary.LittleEndian.PutUint16(g[6:], c)
	copy(g[8:], d[:])
	return g
}

type readerWriterAt interface {
	io.ReaderAt
	io.WriterAt
}

func alignUp(v, a int64) int64 { return (v + a - 1) / a * a }

// AppendPartition adds a partition of size bytes after imageEnd (bytes) to the partition
// table found on dev (diskSize bytes, logical block size lbs). Errors wrap
// ErrNoPartitionTable, ErrNoFreeSlot or ErrNoRoom.
func AppendPartition(dev readerWriterAt, diskSize int64, lbs int, imageEnd, size int64, name string) (PartInfo, error) {
	if lbs < 512 || lbs&(lbs-1) != 0 {
		return PartInfo{}, fmt.Errorf("%w: logical block size %d", ErrNoPartitionTable, lbs)
	}
	head := make([]byte, 2*lbs)
	if _, err := dev.ReadAt(head, 0); err != nil {
		return PartInfo{}, fmt.Errorf("read partition table: %w", err)
	}
	if string(head[lbs:lbs+8]) == "EFI PART" {
		return appendGPT(dev, diskSize, lbs, imageEnd, size, name, head)
	}
	if head[510] == 0x55 && head[511] == 0xAA && mbrHasPartitions(head[:512]) {
		return appendMBR(dev, diskSize, lbs, imageEnd, size, head[:lbs])
	}
	return PartInfo{}, ErrNoPartitionTable
}

func mbrHasPartitions(s []byte) bool {
	for i := 0; i < 4; i++ {
		e := s[446+16*i:]
		if e[4] != 0 && binary.LittleEndian.Uint32(e[12:]) != 0 {
			return true
		}
	}
	return false
}

func appendMBR(dev readerWriterAt, diskSize int64, lbs int, imageEnd, size int64, sec0 []byte) (PartInfo, error) {
	old := bytes.Clone(sec0)
	start := alignUp(imageEnd, stageAlign)
	free := -1
	for i := 0; i < 4; i++ {
		e := sec0[446+16*i:]
		if e[4] == 0 {
			if free < 0 {
				free = i
			}
			continue
		}
		if e[4] == 0xEE {
			return PartInfo{}, fmt.Errorf("%w: protective MBR without GPT header", ErrNoPartitionTable)
		}
		end := (int64(binary.LittleEndian.Uint32(e[8:])) + int64(binary.LittleEndian.Uint32(e[12:]))) * int64(lbs)
		if end > start {
			start = alignUp(end, stageAlign)
		}
	}
	if free < 0 {
		return PartInfo{}, ErrNoFreeSlot
	}
	if start+size > diskSize || (start+size)/int64(lbs) > 0xFFFFFFFF {
		return PartInfo{}, fmt.Errorf("%w: need %d bytes at %d, disk %d", ErrNoRoom, size, start, diskSize)
	}
	e := sec0[446+16*free : 446+16*free+16]
	e[0] = 0
	copy(e[1:4], []byte{0xFE, 0xFF, 0xFF})
	e[4] = 0x0C
	copy(e[5:8], []byte{0xFE, 0xFF, 0xFF})
	binary.LittleEndian.PutUint32(e[8:], uint32(start/int64(lbs)))
	binary.LittleEndian.PutUint32(e[12:], uint32(size/int64(lbs)))
	if _, err := dev.WriteAt(sec0, 0); err != nil {
		return PartInfo{}, fmt.Errorf("write MBR: %w", err)
	}
	info := PartInfo{Scheme: "mbr", Index: free + 1, Start: start, Size: size, SectorSize: lbs}
	if !bytes.Equal(old, sec0) {
		info.Changed = []int64{0}
	}
	return info, nil
}

const gptHeaderSize = 92

func appendGPT(dev readerWriterAt, diskSize int64, lbs int, imageEnd, size int64, name string, head []byte) (PartInfo, error) {
	infos, _, err := appendGPTParts(dev, diskSize, lbs, imageEnd, []PartSpec{{Name: name, Size: size, Type: basicDataGUID}}, head)
	if err != nil {
		return PartInfo{}, err
	}
	return infos[0], nil
}

// PartSpec is one partition to append: its GPT name, size in bytes (a multiple of the
// logical block size) and type GUID (on-disk byte order; zero = Linux file system data).
type PartSpec struct {
	Name string
	Size int64
	Type [16]byte
}

// linuxDataGUID is 0FC63DAF-8483-4772-8E79-3D69D8477DE4 (Linux file system data).
var linuxDataGUID = guidBytes(0x0FC63DAF, 0x8483, 0x4772, [8]byte{0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47, 0x7D, 0xE4})

// AppendGPTPartitions appends parts, in order, each at the next 1 MiB boundary after
// imageEnd and after every partition already in the table, to the GPT on dev (the
// layered build: one partition per extra layer, then kiln-node). It returns each
// partition and the original contents of every logical block below imageEnd it changed
// (LBA → bytes), so a read-back of the image range can be checked against the image's
// digest. Errors wrap ErrNoPartitionTable (no valid GPT), ErrNoFreeSlot or ErrNoRoom.
func AppendGPTPartitions(dev readerWriterAt, diskSize int64, lbs int, imageEnd int64, parts []PartSpec) ([]PartInfo, map[int64][]byte, error) {
	if lbs < 512 || lbs&(lbs-1) != 0 {
		return nil, nil, fmt.Errorf("%w: logical block size %d", ErrNoPartitionTable, lbs)
	}
	head := make([]byte, 2*lbs)
	if _, err := dev.ReadAt(head, 0); err != nil {
		return nil, nil, fmt.Errorf("read partition table: %w", err)
	}
	if string(head[lbs:lbs+8]) != "EFI PART" {
		return nil, nil, fmt.Errorf("%w: no GPT header at LBA 1", ErrNoPartitionTable)
	}
	return appendGPTParts(dev, diskSize, lbs, imageEnd, parts, head)
}

// gptTable is a parsed, CRC-checked primary GPT.
type gptTable struct {
	hdr        []byte
	hsz        uint32
	entLBA     int64
	num, esz   int64
	arrBytes   int64
	arrSectors int64
	arr        []byte
}

func readGPT(dev io.ReaderAt, lbs int, head []byte) (*gptTable, error) {
	t := &gptTable{hdr: bytes.Clone(head[lbs : lbs+lbs])}
	if string(t.hdr[:8]) != "EFI PART" {
		return nil, fmt.Errorf("%w: no GPT header at LBA 1", ErrNoPartitionTable)
	}
	t.hsz = binary.LittleEndian.Uint32(t.hdr[12:])
	if t.hsz < gptHeaderSize || int(t.hsz) > lbs {
		return nil, fmt.Errorf("%w: GPT header size %d", ErrNoPartitionTable, t.hsz)
	}
	crc := binary.LittleEndian.Uint32(t.hdr[16:])
	chk := bytes.Clone(t.hdr[:t.hsz])
	binary.LittleEndian.PutUint32(chk[16:], 0)
	if crc32.ChecksumIEEE(chk) != crc {
		return nil, fmt.Errorf("%w: GPT header CRC mismatch", ErrNoPartitionTable)
	}
	t.entLBA = int64(binary.LittleEndian.Uint64(t.hdr[72:]))
	t.num = int64(binary.LittleEndian.Uint32(t.hdr[80:]))
	t.esz = int64(binary.LittleEndian.Uint32(t.hdr[84:]))
	if t.esz < 128 || t.esz&(t.esz-1) != 0 || t.num < 1 || t.num*t.esz > 1<<20 || t.entLBA < 2 {
		return nil, fmt.Errorf("%w: GPT entries %d x %d at LBA %d", ErrNoPartitionTable, t.num, t.esz, t.entLBA)
	}
	t.arrBytes = t.num * t.esz
	t.arrSectors = alignUp(t.arrBytes, int64(lbs)) / int64(lbs)
	t.arr = make([]byte, t.arrSectors*int64(lbs))
	if _, err := dev.ReadAt(t.arr, t.entLBA*int64(lbs)); err != nil {
		return nil, fmt.Errorf("read GPT entries: %w", err)
	}
	if crc32.ChecksumIEEE(t.arr[:t.arrBytes]) != binary.LittleEndian.Uint32(t.hdr[88:]) {
		return nil, fmt.Errorf("%w: GPT entries CRC mismatch", ErrNoPartitionTable)
	}
	return t, nil
}

// GPTPart is one used entry of a GPT: 1-based Index, Name, Start and Size in bytes.
type GPTPart struct {
	Index       int
	Name        string
	Start, Size int64
}

// ReadGPTPartitions returns the used entries of dev's primary GPT (CRC-checked).
func ReadGPTPartitions(dev io.ReaderAt, lbs int) ([]GPTPart, error) {
	head := make([]byte, 2*lbs)
	if _, err := dev.ReadAt(head, 0); err != nil {
		return nil, fmt.Errorf("read partition table: %w", err)
	}
	t, err := readGPT(dev, lbs, head)
	if err != nil {
		return nil, err
	}
	var out []GPTPart
	var zero [16]byte
	for i := int64(0); i < t.num; i++ {
		e := t.arr[i*t.esz : (i+1)*t.esz]
		if bytes.Equal(e[:16], zero[:]) {
			continue
		}
		first, last := int64(binary.LittleEndian.Uint64(e[32:])), int64(binary.LittleEndian.Uint64(e[40:]))
		if last < first {
			continue
		}
		var u16 []uint16
		for k := 56; k+1 < int(t.esz) && k < 56+72; k += 2 {
			c := binary.LittleEndian.Uint16(e[k:])
			if c == 0 {
				break
			}
			u16 = append(u16, c)
		}
		out = append(out, GPTPart{Index: int(i) + 1, Name: string(utf16.Decode(u16)), Start: first * int64(lbs), Size: (last - first + 1) * int64(lbs)})
	}
	return out, nil
}

func appendGPTParts(dev readerWriterAt, diskSize int64, lbs int, imageEnd int64, parts []PartSpec, head []byte) ([]PartInfo, map[int64][]byte, error) {
	t, err := readGPT(dev, lbs, head)
	if err != nil {
		return nil, nil, err
	}
	hdr, hsz, entLBA, num, esz, arrBytes, arrSectors, arr := t.hdr, t.hsz, t.entLBA, t.num, t.esz, t.arrBytes, t.arrSectors, t.arr
	oldArr := bytes.Clone(arr)
	start := alignUp(imageEnd, stageAlign)
	var free []int64
	var zero [16]byte
	for i := int64(0); i < num; i++ {
		e := arr[i*esz:]
		if bytes.Equal(e[:16], zero[:]) {
			free = append(free, i)
			continue
		}
		end := (int64(binary.LittleEndian.Uint64(e[40:])) + 1) * int64(lbs)
		if end > start {
			start = alignUp(end, stageAlign)
		}
	}
	if len(free) < len(parts) {
		return nil, nil, fmt.Errorf("%w: %d free GPT entries, %d partitions to add", ErrNoFreeSlot, len(free), len(parts))
	}
	lastLBA := diskSize/int64(lbs) - 1
	lastUsable := lastLBA - arrSectors - 1
	infos := make([]PartInfo, 0, len(parts))
	for k, p := range parts {
		if p.Size <= 0 || p.Size%int64(lbs) != 0 {
			return nil, nil, fmt.Errorf("%w: partition %q size %d is not a positive multiple of %d", ErrNoRoom, p.Name, p.Size, lbs)
		}
		first := start / int64(lbs)
		last := first + p.Size/int64(lbs) - 1
		if last > lastUsable {
			return nil, nil, fmt.Errorf("%w: need LBA %d..%d, last usable %d", ErrNoRoom, first, last, lastUsable)
		}
		typ := p.Type
		if typ == zero {
			typ = linuxDataGUID
		}
		e := arr[free[k]*esz : (free[k]+1)*esz]
		clear(e)
		copy(e[0:16], typ[:])
		if _, err := rand.Read(e[16:32]); err != nil {
			return nil, nil, err
		}
		e[16+7] = e[16+7]&0x0F | 0x40 // RFC 9562 version 4 (mixed-endian field 3, high byte)
		e[16+8] = e[16+8]&0x3F | 0x80
		binary.LittleEndian.PutUint64(e[32:], uint64(first))
		binary.LittleEndian.PutUint64(e[40:], uint64(last))
		for i, r := range utf16.Encode([]rune(p.Name)) {
			if 56+2*i+1 >= int(esz) || i >= 36 {
				break
			}
			binary.LittleEndian.PutUint16(e[56+2*i:], r)
		}
		infos = append(infos, PartInfo{Scheme: "gpt", Index: int(free[k]) + 1, Start: first * int64(lbs), Size: p.Size, SectorSize: lbs})
		start = alignUp((last+1)*int64(lbs), stageAlign)
	}
	arrCRC := crc32.ChecksumIEEE(arr[:arrBytes])

	oldHdr := bytes.Clone(hdr)
	binary.LittleEndian.PutUint64(hdr[32:], uint64(lastLBA))
	binary.LittleEndian.PutUint64(hdr[48:], uint64(lastUsable))
	binary.LittleEndian.PutUint32(hdr[88:], arrCRC)
	setHeaderCRC(hdr, hsz)

	bak := bytes.Clone(hdr)
	binary.LittleEndian.PutUint64(bak[24:], uint64(lastLBA))
	binary.LittleEndian.PutUint64(bak[32:], 1)
	binary.LittleEndian.PutUint64(bak[72:], uint64(lastLBA-arrSectors))
	setHeaderCRC(bak, hsz)

	// Backup first (outside the image), then the primary array and header.
	if _, err := dev.WriteAt(arr, (lastLBA-arrSectors)*int64(lbs)); err != nil {
		return nil, nil, fmt.Errorf("write backup GPT entries: %w", err)
	}
	if _, err := dev.WriteAt(bak, lastLBA*int64(lbs)); err != nil {
		return nil, nil, fmt.Errorf("write backup GPT header: %w", err)
	}
	if _, err := dev.WriteAt(arr, entLBA*int64(lbs)); err != nil {
		return nil, nil, fmt.Errorf("write GPT entries: %w", err)
	}
	if _, err := dev.WriteAt(hdr, int64(lbs)); err != nil {
		return nil, nil, fmt.Errorf("write GPT header: %w", err)
	}
	orig := map[int64][]byte{}
	var changed []int64

	// Protective MBR: widen the 0xEE entry to the whole disk (UEFI 2.10 §5.2.3).
	sec0 := bytes.Clone(head[:lbs])
	for i := 0; i < 4; i++ {
		pe := sec0[446+16*i:]
		if pe[4] == 0xEE {
			n := uint64(lastLBA)
			if n > 0xFFFFFFFF {
				n = 0xFFFFFFFF
			}
			binary.LittleEndian.PutUint32(pe[12:], uint32(n))
		}
	}
	if !bytes.Equal(sec0, head[:lbs]) {
		if _, err := dev.WriteAt(sec0, 0); err != nil {
			return nil, nil, fmt.Errorf("write protective MBR: %w", err)
		}
		changed = append(changed, 0)
		orig[0] = bytes.Clone(head[:lbs])
	}
	if !bytes.Equal(oldHdr, hdr) {
		changed = append(changed, 1)
		orig[1] = oldHdr
	}
	for s := int64(0); s < arrSectors; s++ {
		a, b := oldArr[s*int64(lbs):(s+1)*int64(lbs)], arr[s*int64(lbs):(s+1)*int64(lbs)]
		if !bytes.Equal(a, b) && (entLBA+s)*int64(lbs) < imageEnd {
			changed = append(changed, entLBA+s)
			orig[entLBA+s] = bytes.Clone(a)
		}
	}
	for k := range infos {
		infos[k].Changed = changed
	}
	return infos, orig, nil
}

// ClearPartitionTable makes dev unbootable after a failed build: it zeroes the first MiB
// (protective MBR with its boot code, the primary GPT header and array), the last MiB
// (the backup GPT at the disk's end) and, when imageEnd lies inside the disk, the
// image's own stale backup GPT (the 1 MiB before imageEnd), then fsyncs and checks with
// an O_DIRECT read that the first and last MiB read back as zeros. Firmware then finds
// neither an MBR boot signature nor a GPT and boots the next entry (the network).
func ClearPartitionTable(dev *Device, imageEnd int64) error {
	n := min(int64(eraseCheckBytes), dev.Size)
	ranges := [][2]int64{{0, n}, {dev.Size - n, n}}
	if imageEnd > n && imageEnd < dev.Size-n {
		m := min(int64(eraseCheckBytes), imageEnd-n)
		ranges = append(ranges, [2]int64{imageEnd - m, m})
	}
	for _, r := range ranges {
		if err := zeroRange(dev, r[0], r[1]); err != nil {
			return fmt.Errorf("zero %d+%d: %w", r[0], r[1], err)
		}
	}
	if err := dev.Sync(); err != nil {
		return err
	}
	for _, r := range ranges[:2] {
		if ok, err := isZero(dev.Path, r[0], r[1]); err != nil || !ok {
			return fmt.Errorf("partition table still readable at %d (err %v)", r[0], err)
		}
	}
	return nil
}

func setHeaderCRC(h []byte, hsz uint32) {
	binary.LittleEndian.PutUint32(h[16:], 0)
	binary.LittleEndian.PutUint32(h[16:], crc32.ChecksumIEEE(h[:hsz]))
}
