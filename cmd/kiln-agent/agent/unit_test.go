package agent

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"kiln/api/agentapi"
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

// FuzzAppendPartition: partition tables come from images fetched over the network.
func FuzzAppendPartition(f *testing.F) {
	f.Add([]byte(gptDisk(64, 64)[:34*512]), int64(64))
	mbr := make([]byte, 512)
	mbr[510], mbr[511] = 0x55, 0xAA
	mbr[446+4] = 0x83
	binary.LittleEndian.PutUint32(mbr[446+8:], 1)
	binary.LittleEndian.PutUint32(mbr[446+12:], 10)
	f.Add(mbr, int64(8))
	f.Add([]byte{}, int64(0))
	f.Fuzz(func(t *testing.T, head []byte, imgSectors int64) {
		m := make(memDisk, 8<<20)
		copy(m, head)
		if imgSectors < 0 || imgSectors > 8192 {
			imgSectors = 64
		}
		info, err := AppendPartition(m, int64(len(m)), 512, imgSectors*512, 1<<20, "cidata")
		if err == nil && (info.Start < imgSectors*512 || info.Start+info.Size > int64(len(m))) {
			t.Fatalf("partition outside the free area: %+v", info)
		}
	})
}

// FuzzContentRange: the Content-Range header of a resumed image response.
func FuzzContentRange(f *testing.F) {
	for _, s := range []string{"bytes 100-199/200", "bytes */200", "", "bytes -1-2/3", "items 1-2/3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := contentRangeStart(s)
		if err == nil && !strings.HasPrefix(s, "bytes ") {
			t.Fatalf("%q accepted as %d", s, v)
		}
	})
}

// FuzzForeign: disk heads are arbitrary bytes.
func FuzzForeign(f *testing.F) {
	f.Add([]byte(gptDisk(64, 64)[:34*512]))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = Foreign(memDisk(append(b, make([]byte, 512)...)), 512)
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

// FuzzParseATAStatusSense: sense bytes come from the device.
func FuzzParseATAStatusSense(f *testing.F) {
	f.Add([]byte{0x72, 0, 0, 0, 0, 0, 0, 14, 0x09, 0x0c, 0, 0, 0, 0, 0, 0, 0, 0x4F, 0, 0xC2, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) { _ = parseATAStatusSense(b) })
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
