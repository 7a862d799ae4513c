package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"kiln/api/agentapi"
	"kiln/cmd/kiln-agent/inventory"
	"kiln/deploy/lab/testreq"
)

func TestSelectDisk(t *testing.T) {
	disks := []agentapi.Disk{
		{Name: "sda", Path: "/dev/sda", Serial: "S1", WWN: "naa.1", SizeBytes: 2000},
		{Name: "sdb", Path: "/dev/sdb", Serial: "S2", SizeBytes: 500},
		{Name: "sdc", Path: "/dev/sdc", Serial: "S3", SizeBytes: 1000},
		{Name: "sdd", Path: "/dev/sdd", Serial: "USB", SizeBytes: 800, Removable: true},
	}
	for _, tc := range []struct {
		rule   agentapi.DiskRule
		want   string
		reason agentapi.Reason
	}{
		{agentapi.DiskRule{Serial: "S1"}, "sda", ""},
		{agentapi.DiskRule{WWN: "NAA.1"}, "sda", ""},
		{agentapi.DiskRule{Serial: "nope"}, "", agentapi.ReasonDiskNotFound},
		{agentapi.DiskRule{MinSizeBytes: 600}, "sdc", ""}, // smallest ≥ 600, USB stick skipped
		{agentapi.DiskRule{}, "sdb", ""},
		{agentapi.DiskRule{MinSizeBytes: 5000}, "", agentapi.ReasonDiskNotFound},
	} {
		d, err := SelectDisk(disks, tc.rule)
		if tc.reason != "" {
			se, ok := err.(*StepError)
			if !ok || se.Reason != tc.reason {
				t.Errorf("%+v: err %v", tc.rule, err)
			}
			continue
		}
		if err != nil || d.Name != tc.want {
			t.Errorf("%+v: got %s %v want %s", tc.rule, d.Name, err, tc.want)
		}
	}
}

// memDisk is an in-memory ReaderAt/WriterAt.
type memDisk []byte

func (m memDisk) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(m)) {
		return 0, os.ErrInvalid
	}
	return copy(p, m[off:]), nil
}
func (m memDisk) WriteAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > int64(len(m)) {
		return 0, os.ErrInvalid
	}
	return copy(m[off:], p), nil
}

// TestMakeFAT16 formats a file and checks it with fsck.fat and mtools (no root needed).
func TestMakeFAT16(t *testing.T) {
	testreq.Commands(t, "fsck.fat", "mcopy")
	hk, err := NewHostKey("host@t")
	if err != nil {
		t.Fatal(err)
	}
	files, err := SeedFiles(stageData(), hk)
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, FATFile{Name: "a-rather-long-file-name-beyond-thirteen.txt", Data: bytes.Repeat([]byte("x"), 5000)}, FATFile{Name: "empty", Data: nil})
	m := make(memDisk, 16<<20)
	if err := MakeFAT16(m, 0, int64(len(m)), "cidata", 0x1234, 0, files); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "fat.img")
	os.WriteFile(p, m, 0o644)
	if out, err := exec.Command("fsck.fat", "-n", "-v", p).CombinedOutput(); err != nil {
		t.Fatalf("fsck.fat: %v\n%s", err, out)
	}
	for _, f := range files {
		c := exec.Command("mcopy", "-i", p, "::"+f.Name, "-")
		c.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
		got, err := c.Output()
		if err != nil || !bytes.Equal(got, f.Data) {
			t.Errorf("%s: err %v, %d bytes want %d", f.Name, err, len(got), len(f.Data))
		}
	}
	if err := MakeFAT16(make(memDisk, 1<<20), 0, 1<<20, "cidata", 1, 0, files); err == nil {
		t.Error("1 MiB volume accepted (would be FAT12)")
	}
}

func TestSeedFilesNeedsIdentity(t *testing.T) {
	if _, err := SeedFiles(&agentapi.StageData{Hostname: "x"}, HostKey{}); err == nil {
		t.Error("missing instance id accepted")
	}
}

// gptDisk builds an in-memory disk of n sectors with a minimal valid GPT (128 entries) and
// one partition 2048..lastImage-34, as an image of imageSectors would carry.
func gptDisk(n, imageSectors int64) memDisk {
	m := make(memDisk, n*512)
	m[510], m[511] = 0x55, 0xAA
	pe := m[446:]
	pe[4] = 0xEE
	binary.LittleEndian.PutUint32(pe[8:], 1)
	binary.LittleEndian.PutUint32(pe[12:], uint32(imageSectors-1))
	arr := make([]byte, 128*128)
	copy(arr, basicDataGUID[:])
	arr[16] = 1
	binary.LittleEndian.PutUint64(arr[32:], 2048)
	binary.LittleEndian.PutUint64(arr[40:], uint64(imageSectors-34))
	copy(m[2*512:], arr)
	h := m[512 : 512+92]
	copy(h, "EFI PART")
	binary.LittleEndian.PutUint32(h[8:], 0x00010000)
	binary.LittleEndian.PutUint32(h[12:], 92)
	binary.LittleEndian.PutUint64(h[24:], 1)
	binary.LittleEndian.PutUint64(h[32:], uint64(imageSectors-1))
	binary.LittleEndian.PutUint64(h[40:], 34)
	binary.LittleEndian.PutUint64(h[48:], uint64(imageSectors-34))
	binary.LittleEndian.PutUint64(h[72:], 2)
	binary.LittleEndian.PutUint32(h[80:], 128)
	binary.LittleEndian.PutUint32(h[84:], 128)
	binary.LittleEndian.PutUint32(h[88:], crc32.ChecksumIEEE(arr))
	setHeaderCRC(h, 92)
	return m
}

// smallGPT is the first 3 sectors of a GPT disk of 64 sectors whose partition array has 4
// entries (one sector): a fuzz seed of 1.5 KiB (the Go fuzzer slows down a lot on seeds of
// tens of KiB, such as gptDisk's 17 KiB head with its 128-entry array).
func smallGPT() []byte {
	m := gptDisk(64, 64)
	h := m[512 : 512+92]
	binary.LittleEndian.PutUint32(h[80:], 4)
	binary.LittleEndian.PutUint32(h[88:], crc32.ChecksumIEEE(m[2*512:2*512+4*128]))
	setHeaderCRC(h, 92)
	return bytes.Clone(m[:3*512])
}

func TestAppendPartitionGPTInMemory(t *testing.T) {
	const n, img = 40960, 8192 // 20 MiB disk, 4 MiB image
	m := gptDisk(n, img)
	info, err := AppendPartition(m, int64(len(m)), 512, img*512, 8<<20, "cidata")
	if err != nil {
		t.Fatal(err)
	}
	if info.Scheme != "gpt" || info.Index != 2 || info.Start != 4<<20 || len(info.Changed) != 3 {
		t.Fatalf("%+v", info)
	}
	// Backup header at the last LBA with a valid CRC pointing back to LBA 1.
	bak := bytes.Clone(m[(n-1)*512 : (n-1)*512+92])
	if string(bak[:8]) != "EFI PART" || binary.LittleEndian.Uint64(bak[32:]) != 1 {
		t.Fatal("no backup header")
	}
	crc := binary.LittleEndian.Uint32(bak[16:])
	setHeaderCRC(bak, 92)
	if binary.LittleEndian.Uint32(bak[16:]) != crc {
		t.Error("backup header CRC")
	}
	if _, err := AppendPartition(m, int64(len(m)), 512, img*512, 64<<20, "cidata"); err == nil {
		t.Error("oversized partition accepted")
	}
	if _, err := AppendPartition(make(memDisk, 1<<20), 1<<20, 512, 0, 4096, "x"); err == nil {
		t.Error("blank disk accepted")
	}
}

func TestForeign(t *testing.T) {
	blank := make(memDisk, 1<<20)
	if s, _ := Foreign(blank, 512); s != "" {
		t.Errorf("blank: %q", s)
	}
	if s, _ := Foreign(gptDisk(4096, 4096), 512); s != "GPT partition table" {
		t.Errorf("gpt: %q", s)
	}
	ext := make(memDisk, 1<<20)
	binary.LittleEndian.PutUint16(ext[1080:], 0xEF53)
	if s, _ := Foreign(ext, 512); !strings.Contains(s, "ext") {
		t.Errorf("ext: %q", s)
	}
}

// FuzzAppendPartition: partition tables come from images fetched over the network. When
// AppendPartition succeeds: the partition is where the stage step is specified to put it
// (1 MiB aligned, at or after the image end, of the requested size, on the disk); every
// sector below the image end that changed is in PartInfo.Changed; nothing is written inside
// the new partition (the cidata volume would overwrite it); Foreign sees the partition table
// of the reported scheme; and the result is itself a table AppendPartition reads, placing a
// further partition after this one.
func FuzzAppendPartition(f *testing.F) {
	f.Add(smallGPT(), int64(64))
	mbr := make([]byte, 512)
	mbr[510], mbr[511] = 0x55, 0xAA
	mbr[446+4] = 0x83
	binary.LittleEndian.PutUint32(mbr[446+8:], 1)
	binary.LittleEndian.PutUint32(mbr[446+12:], 10)
	f.Add(mbr, int64(8))
	f.Add([]byte{}, int64(0))
	// A 3 MiB disk: the image end (at most 1 MiB) rounded up, a 64 KiB partition and room
	// for a GPT backup. (Multi-MiB disks made each run of the fuzzer slow.)
	const disk, size = 3 << 20, 64 << 10
	f.Fuzz(func(t *testing.T, head []byte, imgSectors int64) {
		m := make(memDisk, disk)
		copy(m, head)
		if imgSectors < 0 || imgSectors > 2048 {
			imgSectors = 64
		}
		end := imgSectors * 512
		before := bytes.Clone(m)
		info, err := AppendPartition(m, disk, 512, end, size, "cidata")
		if err != nil {
			if !errors.Is(err, ErrNoPartitionTable) && !errors.Is(err, ErrNoFreeSlot) && !errors.Is(err, ErrNoRoom) {
				t.Fatalf("unclassified error %v", err)
			}
			if !bytes.Equal(m, before) {
				t.Fatalf("refused (%v) but wrote to the disk", err)
			}
			return
		}
		if info.Start%stageAlign != 0 || info.Start < end || info.Size != size || info.Start+info.Size > disk {
			t.Fatalf("partition outside the free area: %+v (image end %d)", info, end)
		}
		listed := map[int64]bool{}
		for _, s := range info.Changed {
			listed[s] = true
		}
		for s := int64(0); s*512 < end; s++ {
			if !bytes.Equal(m[s*512:(s+1)*512], before[s*512:(s+1)*512]) && !listed[s] {
				t.Fatalf("sector %d below the image end changed but is not in Changed %v", s, info.Changed)
			}
		}
		if !bytes.Equal(m[info.Start:info.Start+info.Size], before[info.Start:info.Start+info.Size]) {
			t.Fatalf("the partition table was written inside the new partition %+v", info)
		}
		want := map[string]string{"mbr": "MBR partition table", "gpt": "GPT partition table"}[info.Scheme]
		if got, _ := Foreign(m, 512); got != want {
			t.Fatalf("after appending a %s partition, Foreign says %q", info.Scheme, got)
		}
		again, err := AppendPartition(m, disk, 512, end, size, "cidata")
		switch {
		case errors.Is(err, ErrNoFreeSlot) || errors.Is(err, ErrNoRoom):
		case err != nil:
			t.Fatalf("the table AppendPartition wrote does not read back: %v (first %+v)", err, info)
		case again.Start < info.Start+info.Size:
			t.Fatalf("a second partition %+v overlaps the first %+v", again, info)
		}
	})
}

// FuzzContentRange: the Content-Range header of a resumed image response (RFC 9110 §14.4:
// "bytes" SP first-pos "-" last-pos "/" complete-length, first-pos 1*DIGIT). A header built
// from any positions gives back its first-pos; an accepted arbitrary header starts with
// "bytes " and the decimal digits of the value returned.
func FuzzContentRange(f *testing.F) {
	for _, s := range []string{"bytes 100-199/200", "bytes */200", "", "bytes -1-2/3", "items 1-2/3", "bytes +5-9/10", "bytes 007-9/10", "bytes 5_0-9/10", "bytes 9223372036854775808-1/2"} {
		f.Add(s, uint64(100), uint64(199), uint64(200))
	}
	f.Fuzz(func(t *testing.T, s string, first, last, total uint64) {
		first &= 1<<63 - 1
		h := fmt.Sprintf("bytes %d-%d/%d", first, last, total)
		if v, err := contentRangeStart(h); err != nil || v != int64(first) {
			t.Fatalf("%q -> %d, %v", h, v, err)
		}
		v, err := contentRangeStart(s)
		if err != nil {
			return
		}
		digits, _, ok := strings.Cut(strings.TrimPrefix(s, "bytes "), "-")
		n, perr := strconv.ParseUint(digits, 10, 63)
		if !strings.HasPrefix(s, "bytes ") || !ok || digits == "" || strings.Trim(digits, "0123456789") != "" || perr != nil || int64(n) != v {
			t.Fatalf("%q accepted as %d", s, v)
		}
	})
}

// FuzzForeign: disk heads are arbitrary bytes. Foreign reads only the first 128 KiB (what
// follows does not change its answer), answers one of its documented descriptions, and
// sees a partition table whenever AppendPartition would append to one.
func FuzzForeign(f *testing.F) {
	f.Add(smallGPT(), []byte("tail"))
	f.Add([]byte{}, []byte{})
	known := map[string]bool{"": true, "GPT partition table": true, "MBR partition table": true, "ext2/3/4 file system": true,
		"XFS file system": true, "LVM2 physical volume": true, "swap signature": true, "ISO9660 file system": true,
		"btrfs file system": true, "FAT file system": true}
	f.Fuzz(func(t *testing.T, b, tail []byte) {
		head := memDisk(append(b, make([]byte, 512)...))
		got, err := Foreign(head, 512)
		if err != nil || !known[got] {
			t.Fatalf("Foreign -> %q, %v", got, err)
		}
		// No signature is made of zeros: zero padding to 128 KiB keeps the answer, and
		// whatever follows 128 KiB does not change it.
		if len(head) < 128<<10 {
			padded := make(memDisk, 128<<10+len(tail))
			copy(padded, head)
			if g, _ := Foreign(padded[:128<<10], 512); g != got {
				t.Fatalf("zero padding changed %q to %q", got, g)
			}
			copy(padded[128<<10:], tail)
			if g, _ := Foreign(padded, 512); g != got {
				t.Fatalf("bytes after 128 KiB changed %q to %q", got, g)
			}
		}
		m := make(memDisk, len(head)+(1<<20)+(128<<10))
		copy(m, head)
		if _, err := AppendPartition(m, int64(len(m)), 512, int64(len(head)), 4096, "cidata"); !errors.Is(err, ErrNoPartitionTable) &&
			got != "GPT partition table" && got != "MBR partition table" {
			t.Fatalf("AppendPartition reads a table (%v) where Foreign sees %q", err, got)
		}
	})
}

func TestParseATAStatusSense(t *testing.T) {
	mk := func(mid, high byte) []byte {
		s := make([]byte, 8+14)
		s[0], s[7] = 0x72, 14
		d := s[8:]
		d[0], d[1], d[9], d[11] = 0x09, 0x0c, mid, high
		return s
	}
	for _, tc := range []struct {
		in   []byte
		want string
	}{{mk(0x4F, 0xC2), HealthOK}, {mk(0xF4, 0x2C), HealthFailing}, {mk(0, 0), "not_reported"}, {[]byte{0x70}, "not_reported"}} {
		if got := parseATAStatusSense(tc.in); got != tc.want {
			t.Errorf("% x: %s want %s", tc.in, got, tc.want)
		}
	}
}

// FuzzParseATAStatusSense: sense bytes come from the device (SPC-4 §4.5.2 descriptor
// format 0x72, SAT-3 §12.2.2.7 ATA Status Return descriptor 0x09: LBA mid at byte 9, LBA
// high at byte 11; SMART RETURN STATUS gives 4Fh/C2h for OK, F4h/2Ch for threshold
// exceeded). Arbitrary bytes give one of the three answers; an ATA descriptor placed after
// any chain of other descriptors gives the answer of its LBA mid/high.
func FuzzParseATAStatusSense(f *testing.F) {
	f.Add([]byte{0x72, 0, 0, 0, 0, 0, 0, 14, 0x09, 0x0c, 0, 0, 0, 0, 0, 0, 0, 0x4F, 0, 0xC2, 0, 0}, []byte{0x00, 2, 1, 2}, byte(0x4F), byte(0xC2))
	f.Add([]byte{0x70}, []byte{}, byte(0xF4), byte(0x2C))
	f.Fuzz(func(t *testing.T, b, others []byte, mid, high byte) {
		if got := parseATAStatusSense(b); got != HealthOK && got != HealthFailing && got != inventory.HealthNotReported {
			t.Fatalf("% x -> %q", b, got)
		}
		sense := []byte{0x72, 0, 0, 0, 0, 0, 0, 0}
		for rest := others; len(rest) >= 2; {
			typ, n := rest[0], int(rest[1])%16
			if typ == ataSenseDesc {
				typ = 0x00
			}
			if n > len(rest)-2 {
				n = len(rest) - 2
			}
			sense = append(append(sense, typ, byte(n)), rest[2:2+n]...)
			rest = rest[2+n:]
		}
		d := make([]byte, 14)
		d[0], d[1], d[9], d[11] = ataSenseDesc, 12, mid, high
		sense = append(sense, d...)
		want := inventory.HealthNotReported
		switch {
		case mid == 0x4F && high == 0xC2:
			want = HealthOK
		case mid == 0xF4 && high == 0x2C:
			want = HealthFailing
		}
		if got := parseATAStatusSense(sense); got != want {
			t.Fatalf("% x -> %q, want %q", sense, got, want)
		}
	})
}

func TestParseLANIPResponse(t *testing.T) {
	for in, want := range map[string]string{
		"\x00\x11\x0a\x63\x01\x0b": "10.99.1.11",
		"\x00\x11\x00\x00\x00\x00": "",
		"\xc1":                     "",
		"":                         "",
	} {
		if got := parseLANIPResponse([]byte(in)); got != want {
			t.Errorf("% x: %q want %q", in, got, want)
		}
	}
}

// FuzzAppendGPTPartitions: the layered build's table update on arbitrary disk heads. When
// it succeeds, ReadGPTPartitions reads back every appended partition, in order, with its
// name and size, 1 MiB aligned, at or after the image end, not overlapping each other or
// any other entry, on the disk; orig holds the old contents of exactly the changed sectors
// below the image end (restoring them restores the image range); when it fails, nothing
// was written.
func FuzzAppendGPTPartitions(f *testing.F) {
	f.Add(smallGPT(), int64(64), uint8(2))
	f.Add([]byte{}, int64(0), uint8(1))
	const disk = 6 << 20
	f.Fuzz(func(t *testing.T, head []byte, imgSectors int64, nparts uint8) {
		m := make(memDisk, disk)
		copy(m, head)
		if imgSectors < 0 || imgSectors > 2048 {
			imgSectors = 64
		}
		end := imgSectors * 512
		var specs []PartSpec
		for i := 0; i < int(nparts%4)+1; i++ {
			specs = append(specs, PartSpec{Name: fmt.Sprintf("kiln-layer-%d", i), Size: int64(i+1) * 64 << 10})
		}
		before := bytes.Clone(m)
		infos, orig, err := AppendGPTPartitions(m, disk, 512, end, specs)
		if err != nil {
			if !errors.Is(err, ErrNoPartitionTable) && !errors.Is(err, ErrNoFreeSlot) && !errors.Is(err, ErrNoRoom) {
				t.Fatalf("unclassified error %v", err)
			}
			if !bytes.Equal(m, before) {
				t.Fatalf("refused (%v) but wrote to the disk", err)
			}
			return
		}
		parts, err := ReadGPTPartitions(m, 512)
		if err != nil {
			t.Fatalf("the table written does not read back: %v", err)
		}
		byIndex := map[int]GPTPart{}
		for _, p := range parts {
			byIndex[p.Index] = p
		}
		for k, in := range infos {
			p, ok := byIndex[in.Index]
			if !ok || p.Name != specs[k].Name || p.Start != in.Start || p.Size != specs[k].Size || in.Start%stageAlign != 0 || in.Start < end || in.Start+in.Size > disk {
				t.Fatalf("partition %d: info %+v, read back %+v (%v)", k, in, p, ok)
			}
			for _, q := range parts {
				if q.Index != p.Index && q.Start < p.Start+p.Size && p.Start < q.Start+q.Size {
					t.Fatalf("%+v overlaps %+v", p, q)
				}
			}
		}
		restored := bytes.Clone(m[:end])
		for lba, b := range orig {
			if lba*512 >= end {
				t.Fatalf("orig holds LBA %d at or after the image end", lba)
			}
			copy(restored[lba*512:], b)
		}
		if !bytes.Equal(restored, before[:end]) {
			t.Fatal("restoring orig does not give back the image range")
		}
	})
}

// TestJudgeReadBack: verify's attribution of a wrong read-back by the CRC-32C
// of the stream against the read-back's (cmd/kiln-agent/DESIGN.md "Decisions", its write pipeline).
func TestJudgeReadBack(t *testing.T) {
	img := []byte("the pinned image")
	want := fmt.Sprintf("%x", sha256.Sum256(img))
	bad := bytes.Clone(img)
	bad[3] ^= 1
	badSum := fmt.Sprintf("%x", sha256.Sum256(bad))
	crc := func(b []byte) uint32 { return crc32.Checksum(b, streamTable) }
	for _, tc := range []struct {
		name         string
		disk, stream []byte
		attempt      int
		reason       agentapi.Reason
		inMsg        string
	}{
		{"good", img, img, 0, "", ""},
		{"served wrong", bad, bad, 0, agentapi.ReasonDigestMismatch, "the disk holds exactly the stream"},
		{"disk wrong", bad, img, 0, agentapi.ReasonVerifyMismatch, "the stream's"},
		{"disk wrong after a rewrite", bad, img, 1, agentapi.ReasonDigestMismatch, "(attempt 2)"},
	} {
		got := want
		if !bytes.Equal(tc.disk, img) {
			got = badSum
		}
		err := judgeReadBack("image", got, want, crc(tc.disk), crc(tc.stream), tc.attempt)
		if tc.reason == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		var se *StepError
		if !errors.As(err, &se) || se.Reason != tc.reason || se.Step != agentapi.StepVerify || !strings.Contains(se.Error(), tc.inMsg) {
			t.Errorf("%s: %v, want %s naming %q", tc.name, err, tc.reason, tc.inMsg)
		}
	}
}
