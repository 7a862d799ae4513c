package labos

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

const mib = 1 << 20

func execCommand(dir, name string, args ...string) *exec.Cmd {
	c := exec.Command(name, args...)
	c.Dir = dir
	return c
}

// base builds base.img: GPT with p1 kiln-esp (FAT; syslinux for BIOS, legacy
// BIOS bootable; systemd-boot as EFI/BOOT/BOOTX64.EFI for UEFI; both boot
// /vmlinuz with /initrd.img) and p2 kiln-root (squashfs + verity tree), and
// gptmbr.bin in the protective MBR's boot code.
func (b *builder) base() (Layer, BaseInfo, error) {
	var info BaseInfo
	vmlinuz, moddir, err := b.kernel()
	if err != nil {
		return Layer{}, info, err
	}
	firstboot, err := b.goBuild("./cmd/kiln-firstboot", "kiln-firstboot")
	if err != nil {
		return Layer{}, info, err
	}

	// The root: busybox, the reporter, /sbin/init.
	root := tree{}
	for _, d := range []string{"dev", "proc", "sys", "tmp", "run", "mnt", "root"} {
		root.dir(d)
	}
	root.copyFile("bin/busybox", 0o755, b.o.Busybox)
	root.link("bin/sh", "busybox")
	root.copyFile("bin/kiln-firstboot", 0o755, firstboot)
	root.file("bin/udhcpc.script", 0o755, udhcpcScript)
	root.file("sbin/init", 0o755, rootInit)
	root.file("etc/os-release", 0o644, []byte("NAME=\"Kiln lab OS\"\nID=kiln-lab\nVERSION_ID=1\n"))
	root.file("etc/kiln-release", 0o644, []byte("kiln lab OS, kernel "+b.kver+"\n"))
	root.file("etc/hostname", 0o644, []byte("kiln-lab\n"))
	rootImg, err := b.squashfs(root, "root")
	if err != nil {
		return Layer{}, info, err
	}
	rootHash, hashOff, err := verity(rootImg, mib)
	if err != nil {
		return Layer{}, info, err
	}
	fi, err := os.Stat(rootImg)
	if err != nil {
		return Layer{}, info, err
	}
	info.RootSize = fi.Size()

	// The initramfs: busybox, veritysetup with its libraries, the modules, /init.
	initrd := tree{}
	for _, d := range []string{"dev", "proc", "sys", "newroot", "run"} {
		initrd.dir(d)
	}
	initrd.copyFile("bin/busybox", 0o755, b.o.Busybox)
	initrd.link("bin/sh", "busybox")
	initrd.file("init", 0o755, initramfsInit)
	if err := elfWithLibs(initrd, "/usr/sbin/veritysetup", "sbin/veritysetup"); err != nil {
		return Layer{}, info, err
	}
	if err := b.modules(initrd, moddir); err != nil {
		return Layer{}, info, err
	}
	initrdBytes, err := initrd.cpio()
	if err != nil {
		return Layer{}, info, err
	}

	// The ESP.
	info.Cmdline = fmt.Sprintf("console=ttyS0,115200 loglevel=4 kiln.roothash=%s kiln.hashoffset=%d", rootHash, hashOff)
	if b.o.Cmdline != "" {
		info.Cmdline += " " + b.o.Cmdline
	}
	esp := tree{}
	esp.copyFile("vmlinuz", 0o644, vmlinuz)
	esp.file("initrd.img", 0o644, initrdBytes)
	esp.copyFile("EFI/BOOT/BOOTX64.EFI", 0o644, "/usr/lib/systemd/boot/efi/systemd-bootx64.efi")
	esp.file("loader/loader.conf", 0o644, []byte("timeout 0\ndefault kiln.conf\neditor no\nrandom-seed-mode off\n"))
	esp.file("loader/entries/kiln.conf", 0o644, []byte("title Kiln lab OS\nlinux /vmlinuz\ninitrd /initrd.img\noptions "+info.Cmdline+"\n"))
	esp.file("syslinux/syslinux.cfg", 0o644, []byte("SERIAL 0 115200\nPROMPT 0\nTIMEOUT 0\nDEFAULT kiln\nLABEL kiln\n  LINUX /vmlinuz\n  INITRD /initrd.img\n  APPEND "+info.Cmdline+"\n"))
	var espBytes int64
	for _, e := range esp {
		if bs, err := e.bytes(); err == nil {
			espBytes += int64(len(bs))
		}
	}
	info.ESPStart = mib
	info.ESPSize = (espBytes*11/10/mib + 4) * mib // 10% and 4 MiB of slack (FAT, syslinux)
	espImg := filepath.Join(b.work, "esp.img")
	if err := b.fat(esp, espImg, info.ESPSize, info.ESPStart/512); err != nil {
		return Layer{}, info, err
	}

	// The disk: 1 MiB (MBR, GPT) | ESP | kiln-root | 1 MiB (backup GPT).
	info.RootStart = info.ESPStart + info.ESPSize
	total := info.RootStart + info.RootSize + mib
	img := filepath.Join(b.o.Dir, "base.img")
	_ = os.Remove(img)
	f, err := os.Create(img)
	if err != nil {
		return Layer{}, info, err
	}
	err = f.Truncate(total)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Layer{}, info, err
	}
	s := func(off int64) string { return strconv.FormatInt(off/512, 10) }
	if _, err := run("", "sgdisk", "-U", DiskGUID,
		"-n", "1:"+s(info.ESPStart)+":"+s(info.ESPStart+info.ESPSize-512), "-t", "1:ef00", "-c", "1:"+ESPPartName, "-u", "1:"+ESPGUID, "-A", "1:set:2",
		"-n", "2:"+s(info.RootStart)+":"+s(info.RootStart+info.RootSize-512), "-t", "2:8304", "-c", "2:"+RootPartName, "-u", "2:"+RootGUID,
		img); err != nil {
		return Layer{}, info, err
	}
	if err := copyAt(img, "/usr/lib/syslinux/mbr/gptmbr.bin", 0, 440); err != nil {
		return Layer{}, info, err
	}
	if err := copyAt(img, espImg, info.ESPStart, -1); err != nil {
		return Layer{}, info, err
	}
	if err := copyAt(img, rootImg, info.RootStart, -1); err != nil {
		return Layer{}, info, err
	}
	sum, size, err := hashFile(img)
	if err != nil {
		return Layer{}, info, err
	}
	return Layer{Name: "base", URL: "base.img", SHA256: sum, Size: size, When: WhenAlways,
		VerityRootHash: rootHash, VerityHashOffset: hashOff, VerityPartName: RootPartName}, info, nil
}

// fat makes a FAT image of size bytes holding t (mkfs.fat --invariant, fixed
// volume ID, hidden sectors = the partition's start so the syslinux boot
// sector finds itself), then installs syslinux into /syslinux (syslinux
// --install, through mtools: no mount).
func (b *builder) fat(t tree, img string, size, startSector int64) error {
	dir := filepath.Join(b.work, "esp.d")
	if err := t.writeDir(dir); err != nil {
		return err
	}
	_ = os.Remove(img)
	if _, err := run("", "mkfs.vfat", "-C", "--invariant", "-i", ESPVolumeID, "-n", "KILN-ESP", "-h", strconv.FormatInt(startSector, 10),
		img, strconv.FormatInt(size/1024, 10)); err != nil {
		return err
	}
	for _, k := range sortedKeys(t) {
		e := t[k]
		if e.Dir {
			if _, err := run("", "mmd", "-i", img, "::/"+k); err != nil {
				return err
			}
			continue
		}
		if _, err := run("", "mcopy", "-i", img, "-m", filepath.Join(dir, k), "::/"+k); err != nil {
			return err
		}
	}
	_, err := run("", "syslinux", "--install", "--directory", "/syslinux", img)
	return err
}

// copyAt writes n bytes (all when n < 0) of src into dst at off.
func copyAt(dst, src string, off, n int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	var r io.Reader = in
	if n >= 0 {
		r = io.LimitReader(in, n)
	}
	if _, err := out.Seek(off, io.SeekStart); err != nil {
		out.Close()
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// extraLayer builds layer-NAME.img: a squashfs holding /kiln-layer (the
// marker: the layer's name) and /etc/kiln/layers/NAME, with its verity tree
// appended, padded to 1 MiB.
func (b *builder) extraLayer(name, when string) (Layer, error) {
	t := tree{}
	t.file("kiln-layer", 0o644, []byte(name+"\n"))
	t.file("etc/kiln/layers/"+name, 0o644, []byte("layer "+name+" selected by "+when+"\n"))
	img, err := b.squashfs(t, "layer-"+name)
	if err != nil {
		return Layer{}, err
	}
	rh, off, err := verity(img, mib)
	if err != nil {
		return Layer{}, err
	}
	out := filepath.Join(b.o.Dir, "layer-"+name+".img")
	_ = os.Remove(out)
	if err := os.Rename(img, out); err != nil {
		return Layer{}, err
	}
	ts := time.Unix(SourceDateEpoch, 0)
	_ = os.Chtimes(out, ts, ts)
	sum, size, err := hashFile(out)
	if err != nil {
		return Layer{}, err
	}
	return Layer{Name: name, URL: "layer-" + name + ".img", SHA256: sum, Size: size, When: when,
		PartName: "kiln-layer-" + name, VerityRootHash: rh, VerityHashOffset: off}, nil
}

// copyRange copies n bytes of src from off into a new file dst (a partition
// of an image, for checks).
func copyRange(src, dst string, off, n int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, io.NewSectionReader(in, off, n)); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
