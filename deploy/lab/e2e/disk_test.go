package e2e

import (
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln/cmd/kiln-agent/agent"
	"kiln/deploy/lab/labimage"
	"kiln/deploy/lab/testreq"
)

// stagedDisk builds the lab image, writes it to a 64 MiB disk file and runs
// the agent's own stage step code on it (AppendPartition, MakeFAT16), as the
// VM does, without a VM. It returns the disk file, the image, the disk's
// bytes and the cidata partition's start (bytes).
func stagedDisk(t *testing.T) (string, labimage.Image, []byte, int64) {
	t.Helper()
	testreq.Commands(t, "mkfs.ext4", "debugfs", "sfdisk")
	work := t.TempDir()
	img, err := buildImage(Options{Work: work, ImageMiB: 24})
	if err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(work, "disk.img")
	src, err := os.Open(img.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	f, err := os.Create(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(f, src); err != nil {
		t.Fatal(err)
	}
	const diskSize = 64 << 20
	if err := f.Truncate(diskSize); err != nil {
		t.Fatal(err)
	}
	info, err := agent.AppendPartition(f, diskSize, 512, img.Size, agent.DefaultStageSize, "cidata")
	if err != nil {
		t.Fatal(err)
	}
	files := []agent.FATFile{{Name: "meta-data", Data: []byte("instance-id: m-1\n")}, {Name: "user-data", Data: []byte("#cloud-config\n")}}
	if err := agent.MakeFAT16(f, info.Start, info.Size, "CIDATA", 1, uint32(info.Start/512), files); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	return disk, img, good, info.Start
}

// TestCheckDisk: the e2e disk check accepts the disk the agent's stage code
// makes, and names each corruption of it, in particular of the partition
// table (which the former check copied from the image before comparing, so
// a wrong cidata entry, a cleared boot flag on entry 1 or a missing 0x55AA
// passed).
func TestCheckDisk(t *testing.T) {
	disk, img, good, start := stagedDisk(t)
	if p, err := checkDisk(disk, img); err != nil || p != "" {
		t.Fatalf("the disk as staged by the agent's code: %q, %v", p, err)
	}
	e2 := 446 + 16
	for _, tc := range []struct {
		name string
		off  int64
		val  byte
		want string
	}{
		{"entry 1 boot flag cleared", 446, 0x00, "partition entry 1 byte 0"},
		{"entry 1 type changed", 446 + 4, 0x07, "partition entry 1 byte 4"},
		{"cidata entry type", int64(e2 + 4), 0x83, "partition entry 2 byte 4"},
		{"cidata entry start LBA", int64(e2 + 8), good[e2+8] + 1, "partition entry 2 byte 8"},
		{"cidata entry size", int64(e2 + 13), good[e2+13] + 1, "partition entry 2 byte 13"},
		{"cidata entry bootable", int64(e2), 0x80, "partition entry 2 byte 0"},
		{"entry 3 not empty", 446 + 32 + 4, 0x83, "partition entry 3 byte 4"},
		{"signature", 511, 0x00, "signature"},
		{"boot code", 3, 0x90, "boot code"},
		{"ext4 byte", 5 << 20, good[5<<20] ^ 0xFF, "image byte"},
		{"cidata label", start + 43, 'X', "volume label"},
		{"byte after cidata", start + agent.DefaultStageSize + 4096, 1, "after the cidata partition"},
		{"last byte of the disk", int64(len(good)) - 1, 1, "after the cidata partition"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if good[tc.off] == tc.val {
				t.Fatalf("mutation of byte %d is a no-op", tc.off)
			}
			bad := append([]byte(nil), good...)
			bad[tc.off] = tc.val
			if err := os.WriteFile(disk, bad, 0o644); err != nil {
				t.Fatal(err)
			}
			p, err := checkDisk(disk, img)
			if err != nil {
				t.Fatal(err)
			}
			if p == "" || !strings.Contains(p, tc.want) {
				t.Fatalf("byte %d set to %#02x: check says %q, want a difference naming %q", tc.off, tc.val, p, tc.want)
			}
			t.Logf("found: %s", p)
		})
	}
	// The expectation is the specified entry, not whatever the disk holds:
	// decode it and compare with the numbers of the spec.
	e := good[e2 : e2+16]
	if e[4] != 0x0C || binary.LittleEndian.Uint32(e[8:]) != uint32(start/512) || binary.LittleEndian.Uint32(e[12:]) != agent.DefaultStageSize/512 {
		t.Fatalf("agent's cidata entry % x", e)
	}
}
