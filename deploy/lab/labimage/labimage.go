// Package labimage builds the small real OS image the lab provisions: a raw
// disk image holding an MBR partition table and one ext4 partition (from
// 1 MiB) with a marker file. It uses e2fsprogs' mkfs.ext4 -d and util-linux's
// sfdisk, so the result is what real tools make, not a hand-written stand-in.
package labimage

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Image describes a built image. Size is in bytes; SHA256 is hex of the raw bytes.
type Image struct {
	Path   string
	Size   int64
	SHA256 string
	Marker string // content of /kiln-marker inside the ext4 partition
}

// Build writes a raw image of fsMiB MiB of ext4 plus 1 MiB for the partition
// table at dir/name.img. marker is stored as /kiln-marker.
func Build(dir, name string, fsMiB int, marker string) (Image, error) {
	for _, tool := range []string{"mkfs.ext4", "debugfs", "sfdisk"} {
		if _, err := exec.LookPath(tool); err != nil {
			return Image{}, fmt.Errorf("labimage: %s missing (apt-get install e2fsprogs fdisk): %w", tool, err)
		}
	}
	root := filepath.Join(dir, name+"-root")
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		return Image{}, err
	}
	if err := os.WriteFile(filepath.Join(root, "kiln-marker"), []byte(marker+"\n"), 0o644); err != nil {
		return Image{}, err
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "os-release"), []byte("NAME=\"Kiln lab image\"\nID=kiln-lab\n"), 0o644); err != nil {
		return Image{}, err
	}
	fixed := time.Unix(1700000000, 0)
	for _, p := range []string{filepath.Join(root, "etc", "os-release"), filepath.Join(root, "kiln-marker"), filepath.Join(root, "etc"), root} {
		if err := os.Chtimes(p, fixed, fixed); err != nil {
			return Image{}, err
		}
	}
	fsPath := filepath.Join(dir, name+".ext4")
	_ = os.Remove(fsPath)
	cmd := exec.Command("mkfs.ext4", "-q", "-F", "-L", "kiln-root", "-U", "5e1f0000-0000-4000-8000-00000000c0de",
		"-E", "root_owner=0:0,hash_seed=5e1f0000-0000-4000-8000-00000000beef", "-d", root, fsPath, fmt.Sprintf("%dM", fsMiB))
	cmd.Env = append(os.Environ(), "E2FSPROGS_FAKE_TIME=1700000000")
	if out, err := cmd.CombinedOutput(); err != nil {
		return Image{}, fmt.Errorf("labimage: mkfs.ext4: %v: %s", err, out)
	}
	// mkfs -d copies each file's ctime, which no syscall can set: pin the
	// inode times with debugfs so the same inputs give the same bytes.
	var cmds strings.Builder
	for _, p := range []string{"/", "/etc", "/etc/os-release", "/kiln-marker", "/lost+found"} {
		for _, f := range []string{"ctime", "atime", "mtime", "crtime"} {
			fmt.Fprintf(&cmds, "sif %s %s 0x6553f100\n", p, f)
		}
	}
	dbg := exec.Command("debugfs", "-w", "-f", "-", fsPath)
	dbg.Stdin = strings.NewReader(cmds.String())
	dbg.Env = append(os.Environ(), "E2FSPROGS_FAKE_TIME=1700000000")
	if out, err := dbg.CombinedOutput(); err != nil {
		return Image{}, fmt.Errorf("labimage: debugfs: %v: %s", err, out)
	}
	img := filepath.Join(dir, name+".img")
	f, err := os.Create(img)
	if err != nil {
		return Image{}, err
	}
	if err := f.Truncate(1 << 20); err != nil {
		f.Close()
		return Image{}, err
	}
	if _, err := f.Seek(1<<20, io.SeekStart); err != nil {
		f.Close()
		return Image{}, err
	}
	src, err := os.Open(fsPath)
	if err != nil {
		f.Close()
		return Image{}, err
	}
	_, err = io.Copy(f, src)
	src.Close()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Image{}, err
	}
	_ = os.Remove(fsPath)
	// One Linux partition from sector 2048 to the end; a fixed disk identifier.
	sf := exec.Command("sfdisk", "--no-reread", "--no-tell-kernel", "-q", img)
	sf.Stdin = strings.NewReader("label: dos\nlabel-id: 0x4b494c4e\nstart=2048, type=83, bootable\n")
	if out, err := sf.CombinedOutput(); err != nil {
		return Image{}, fmt.Errorf("labimage: sfdisk: %v: %s", err, bytes.TrimSpace(out))
	}
	sum, size, err := HashFile(img, -1)
	if err != nil {
		return Image{}, err
	}
	return Image{Path: img, Size: size, SHA256: sum, Marker: marker}, nil
}

// HashFile returns the SHA-256 (hex) and length of the first n bytes of path
// (all of it when n < 0).
func HashFile(path string, n int64) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	var r io.Reader = f
	if n >= 0 {
		r = io.LimitReader(f, n)
	}
	h := sha256.New()
	got, err := io.Copy(h, r)
	if err != nil {
		return "", got, err
	}
	if n >= 0 && got != n {
		return "", got, fmt.Errorf("labimage: %s holds %d bytes, want %d", path, got, n)
	}
	return hex.EncodeToString(h.Sum(nil)), got, nil
}
