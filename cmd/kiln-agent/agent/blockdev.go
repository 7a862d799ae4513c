package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Device is an open target: a block device (or, in tests, an image file).
type Device struct {
	f          *os.File
	Path       string
	Size       int64 // bytes
	SectorSize int   // logical block size in bytes (BLKSSZGET; 512 for files)
	IsBlock    bool
}

// OpenDevice opens path read-write and learns its size (seek to end) and logical block size.
func OpenDevice(path string) (*Device, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	d := &Device{f: f, Path: path, SectorSize: 512}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	d.IsBlock = st.Mode()&os.ModeDevice != 0
	if d.IsBlock {
		if n, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET); err == nil && n > 0 {
			d.SectorSize = n
		}
	}
	if d.Size, err = f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return nil, err
	}
	return d, nil
}

// Close closes the device.
func (d *Device) Close() error { return d.f.Close() }

// ReadAt reads from the device.
func (d *Device) ReadAt(p []byte, off int64) (int, error) { return d.f.ReadAt(p, off) }

// WriteAt writes to the device.
func (d *Device) WriteAt(p []byte, off int64) (int, error) { return d.f.WriteAt(p, off) }

// Sync flushes the device (fsync, then BLKFLSBUF on block devices to drop cached pages so
// later reads come from the medium).
func (d *Device) Sync() error {
	if err := d.f.Sync(); err != nil {
		return err
	}
	if d.IsBlock {
		_, _, _ = unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), unix.BLKFLSBUF, 0)
	}
	_ = unix.Fadvise(int(d.f.Fd()), 0, 0, unix.FADV_DONTNEED)
	return nil
}

// RereadPartitions asks the kernel to re-read the partition table (BLKRRPART); best effort.
func (d *Device) RereadPartitions() error {
	if !d.IsBlock {
		return nil
	}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), unix.BLKRRPART, 0)
	if e != 0 {
		return e
	}
	return nil
}

// Discard issues BLKDISCARD over [off, off+n). It returns an error when the device does not
// support discard (the caller then overwrites).
func (d *Device) Discard(off, n int64) error {
	if !d.IsBlock {
		return unix.Fallocate(int(d.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	}
	r := [2]uint64{uint64(off), uint64(n)}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), unix.BLKDISCARD, uintptr(unsafe.Pointer(&r[0])))
	if e != 0 {
		return e
	}
	return nil
}

// alignedBuf returns a len-n slice aligned to 4096 bytes (for O_DIRECT).
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	a := int(uintptr(unsafe.Pointer(&b[0])) & 4095)
	off := 0
	if a != 0 {
		off = 4096 - a
	}
	return b[off : off+n]
}

// openDirect opens path for reading with O_DIRECT (bypassing the page cache), falling back
// to a normal open where O_DIRECT is refused (tmpfs files).
func openDirect(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	if err == nil {
		return f, nil
	}
	return os.Open(path)
}

// ReadTest reads n bytes sequentially from the start of path with O_DIRECT and returns MB/s
// (10^6 bytes per second).
func ReadTest(path string, n int64) (float64, error) {
	f, err := openDirect(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := alignedBuf(1 << 20)
	start := time.Now()
	var done int64
	for done < n {
		k, err := f.Read(buf)
		done += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	el := time.Since(start).Seconds()
	if el <= 0 {
		el = 1e-9
	}
	return float64(done) / 1e6 / el, nil
}

// Foreign returns a description of the partition table or file system signature found at
// the start of the device, or "" when the first 128 KiB look blank/unknown. Signatures
// (offsets from libblkid's probes): MBR 0x55AA with entries, GPT "EFI PART" at LBA 1, ext*
// 0xEF53 at 1080, XFS "XFSB" at 0, LVM2 "LABELONE" in sectors 0-3, swap "SWAPSPACE2"/
// "SWAP-SPACE" at 4086, ISO9660 "CD001" at 32769, btrfs "_BHRfS_M" at 65600, FAT boot sector.
func Foreign(r io.ReaderAt, sectorSize int) (string, error) {
	b := make([]byte, 128<<10)
	n, err := r.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	b = b[:n]
	has := func(off int, sig string) bool {
		return len(b) >= off+len(sig) && string(b[off:off+len(sig)]) == sig
	}
	switch {
	case has(sectorSize, "EFI PART") || has(512, "EFI PART"):
		return "GPT partition table", nil
	case len(b) >= 512 && b[510] == 0x55 && b[511] == 0xAA && mbrHasPartitions(b[:512]):
		return "MBR partition table", nil
	case len(b) >= 1082 && binary.LittleEndian.Uint16(b[1080:]) == 0xEF53:
		return "ext2/3/4 file system", nil
	case has(0, "XFSB"):
		return "XFS file system", nil
	case has(512, "LABELONE") || has(0, "LABELONE") || has(1024, "LABELONE") || has(1536, "LABELONE"):
		return "LVM2 physical volume", nil
	case has(4086, "SWAPSPACE2") || has(4086, "SWAP-SPACE"):
		return "swap signature", nil
	case has(32769, "CD001"):
		return "ISO9660 file system", nil
	case has(65600, "_BHRfS_M"):
		return "btrfs file system", nil
	case len(b) >= 512 && b[510] == 0x55 && b[511] == 0xAA && (has(54, "FAT") || has(82, "FAT32")):
		return "FAT file system", nil
	}
	return "", nil
}

// zeroRange overwrites [off, off+n) with zeros.
func zeroRange(w io.WriterAt, off, n int64) error {
	buf := make([]byte, 1<<20)
	for n > 0 {
		k := int64(len(buf))
		if k > n {
			k = n
		}
		if _, err := w.WriteAt(buf[:k], off); err != nil {
			return err
		}
		off += k
		n -= k
	}
	return nil
}

// isZero reports whether [off, off+n) of path reads back as zeros (read with O_DIRECT).
func isZero(path string, off, n int64) (bool, error) {
	f, err := openDirect(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := alignedBuf(1 << 20)
	zero := make([]byte, len(buf))
	for n > 0 {
		k := int64(len(buf))
		if k > n {
			k = n
		}
		if _, err := f.ReadAt(buf[:k], off); err != nil {
			return false, fmt.Errorf("read at %d: %w", off, err)
		}
		if !bytes.Equal(buf[:k], zero[:k]) {
			return false, nil
		}
		off += k
		n -= k
	}
	return true, nil
}

// mknodFromSysfs makes the block device node path from a sysfs dev file ("259:3").
func mknodFromSysfs(path, devFile string) error {
	b, err := os.ReadFile(devFile)
	if err != nil {
		return err
	}
	maj, mnr, ok := strings.Cut(strings.TrimSpace(string(b)), ":")
	if !ok {
		return fmt.Errorf("%s: %q is not MAJOR:MINOR", devFile, b)
	}
	ma, err1 := strconv.ParseUint(maj, 10, 32)
	mi, err2 := strconv.ParseUint(mnr, 10, 32)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("%s: %q is not MAJOR:MINOR", devFile, b)
	}
	return unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(uint32(ma), uint32(mi))))
}

// blkpg adds (BLKPG_ADD_PARTITION) or deletes (BLKPG_DEL_PARTITION) partition pno of the
// block device in the kernel's view only (the table on the medium is not touched);
// start and length in bytes.
func (d *Device) blkpg(op int32, pno int, start, length int64) error {
	part := unix.BlkpgPartition{Start: start, Length: length, Pno: int32(pno)}
	arg := unix.BlkpgIoctlArg{Op: op, Datalen: int32(unsafe.Sizeof(part)), Data: (*byte)(unsafe.Pointer(&part))}
	const blkpgIoctl = 0x1269 // _IO(0x12, 105), include/uapi/linux/fs.h BLKPG
	_, _, e := unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), blkpgIoctl, uintptr(unsafe.Pointer(&arg)))
	if e != 0 {
		return e
	}
	return nil
}
