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
	hdr := bytes.Clone(head[lbs : lbs+lbs])
	hsz := binary.LittleEndian.Uint32(hdr[12:])
	if hsz < gptHeaderSize || int(hsz) > lbs {
		return PartInfo{}, fmt.Errorf("%w: GPT header size %d", ErrNoPartitionTable, hsz)
	}
	crc := binary.LittleEndian.Uint32(hdr[16:])
	chk := bytes.Clone(hdr[:hsz])
	binary.LittleEndian.PutUint32(chk[16:], 0)
	if crc32.ChecksumIEEE(chk) != crc {
		return PartInfo{}, fmt.Errorf("%w: GPT header CRC mismatch", ErrNoPartitionTable)
	}
	entLBA := int64(binary.LittleEndian.Uint64(hdr[72:]))
	num := int64(binary.LittleEndian.Uint32(hdr[80:]))
	esz := int64(binary.LittleEndian.Uint32(hdr[84:]))
	if esz < 128 || num < 1 || num*esz > 1<<20 {
		return PartInfo{}, fmt.Errorf("%w: GPT entries %d x %d", ErrNoPartitionTable, num, esz)
	}
	arrBytes := num * esz
	arrSectors := alignUp(arrBytes, int64(lbs)) / int64(lbs)
	arr := make([]byte, arrSectors*int64(lbs))
	if _, err := dev.ReadAt(arr, entLBA*int64(lbs)); err != nil {
		return PartInfo{}, fmt.Errorf("read GPT entries: %w", err)
	}
	if crc32.ChecksumIEEE(arr[:arrBytes]) != binary.LittleEndian.Uint32(hdr[88:]) {
		return PartInfo{}, fmt.Errorf("%w: GPT entries CRC mismatch", ErrNoPartitionTable)
	}
	oldArr := bytes.Clone(arr)
	start := alignUp(imageEnd, stageAlign)
	free := int64(-1)
	var zero [16]byte
	for i := int64(0); i < num; i++ {
		e := arr[i*esz:]
		if bytes.Equal(e[:16], zero[:]) {
			if free < 0 {
				free = i
			}
			continue
		}
		end := (int64(binary.LittleEndian.Uint64(e[40:])) + 1) * int64(lbs)
		if end > start {
			start = alignUp(end, stageAlign)
		}
	}
	if free < 0 {
		return PartInfo{}, ErrNoFreeSlot
	}
	lastLBA := diskSize/int64(lbs) - 1
	lastUsable := lastLBA - arrSectors - 1
	first := start / int64(lbs)
	last := first + size/int64(lbs) - 1
	if last > lastUsable {
		return PartInfo{}, fmt.Errorf("%w: need LBA %d..%d, last usable %d", ErrNoRoom, first, last, lastUsable)
	}
	e := arr[free*esz : (free+1)*esz]
	clear(e)
	copy(e[0:16], basicDataGUID[:])
	if _, err := rand.Read(e[16:32]); err != nil {
		return PartInfo{}, err
	}
	e[16+7] = e[16+7]&0x0F | 0x40 // RFC 9562 version 4 (mixed-endian field 3, high byte)
	e[16+8] = e[16+8]&0x3F | 0x80
	binary.LittleEndian.PutUint64(e[32:], uint64(first))
	binary.LittleEndian.PutUint64(e[40:], uint64(last))
	for i, r := range utf16.Encode([]rune(name)) {
		if 56+2*i+1 >= int(esz) || i >= 36 {
			break
		}
		binary.LittleEndian.PutUint16(e[56+2*i:], r)
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
		return PartInfo{}, fmt.Errorf("write backup GPT entries: %w", err)
	}
	if _, err := dev.WriteAt(bak, lastLBA*int64(lbs)); err != nil {
		return PartInfo{}, fmt.Errorf("write backup GPT header: %w", err)
	}
	if _, err := dev.WriteAt(arr, entLBA*int64(lbs)); err != nil {
		return PartInfo{}, fmt.Errorf("write GPT entries: %w", err)
	}
	if _, err := dev.WriteAt(hdr, int64(lbs)); err != nil {
		return PartInfo{}, fmt.Errorf("write GPT header: %w", err)
	}
	info := PartInfo{Scheme: "gpt", Index: int(free) + 1, Start: first * int64(lbs), Size: size, SectorSize: lbs}

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
			return PartInfo{}, fmt.Errorf("write protective MBR: %w", err)
		}
		info.Changed = append(info.Changed, 0)
	}
	if !bytes.Equal(oldHdr, hdr) {
		info.Changed = append(info.Changed, 1)
	}
	for s := int64(0); s < arrSectors; s++ {
		a, b := oldArr[s*int64(lbs):(s+1)*int64(lbs)], arr[s*int64(lbs):(s+1)*int64(lbs)]
		if !bytes.Equal(a, b) && (entLBA+s)*int64(lbs) < imageEnd {
			info.Changed = append(info.Changed, entLBA+s)
		}
	}
	return info, nil
}

func setHeaderCRC(h []byte, hsz uint32) {
	binary.LittleEndian.PutUint32(h[16:], 0)
	binary.LittleEndian.PutUint32(h[16:], crc32.ChecksumIEEE(h[:hsz]))
}
