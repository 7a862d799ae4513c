package labos

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

//go:embed files/initramfs-init
var initramfsInit []byte

//go:embed files/root-init
var rootInit []byte

//go:embed files/udhcpc.script
var udhcpcScript []byte

// entry is one file of a tree: a regular file (Data or Src), a directory
// (Dir) or a symlink (Link).
type entry struct {
	Mode uint32 // permission bits
	Data []byte
	Src  string // copy this host file
	Dir  bool
	Link string
}

type tree map[string]entry // path without leading "/" → entry

func (t tree) dir(p string) {
	for p != "." && p != "" {
		if _, ok := t[p]; !ok {
			t[p] = entry{Dir: true, Mode: 0o755}
		}
		p = filepath.Dir(p)
	}
}

func (t tree) file(p string, mode uint32, data []byte) {
	t.dir(filepath.Dir(p))
	t[p] = entry{Mode: mode, Data: data}
}

func (t tree) copyFile(p string, mode uint32, src string) {
	t.dir(filepath.Dir(p))
	t[p] = entry{Mode: mode, Src: src}
}

func (t tree) link(p, target string) {
	t.dir(filepath.Dir(p))
	t[p] = entry{Link: target, Mode: 0o777}
}

func (e entry) bytes() ([]byte, error) {
	if e.Src != "" {
		return os.ReadFile(e.Src)
	}
	return e.Data, nil
}

// writeDir materialises t under dir with every time set to SourceDateEpoch.
func (t tree) writeDir(dir string) error {
	keys := sortedKeys(t)
	for _, k := range keys {
		e, p := t[k], filepath.Join(dir, k)
		switch {
		case e.Dir:
			if err := os.MkdirAll(p, os.FileMode(e.Mode)); err != nil {
				return err
			}
		case e.Link != "":
			if err := os.Symlink(e.Link, p); err != nil {
				return err
			}
		default:
			b, err := e.bytes()
			if err != nil {
				return err
			}
			if err := os.WriteFile(p, b, os.FileMode(e.Mode)); err != nil {
				return err
			}
			if err := os.Chmod(p, os.FileMode(e.Mode)); err != nil {
				return err
			}
		}
	}
	ts := time.Unix(SourceDateEpoch, 0)
	for i := len(keys) - 1; i >= 0; i-- { // children before parents
		if e := t[keys[i]]; e.Link == "" {
			if err := os.Chtimes(filepath.Join(dir, keys[i]), ts, ts); err != nil {
				return err
			}
		}
	}
	return os.Chtimes(dir, ts, ts)
}

// cpio returns t as a gzip'ed newc archive: sorted entries, uid/gid 0,
// mtime SourceDateEpoch, inodes numbered in order, gzip without name or time.
func (t tree) cpio() ([]byte, error) {
	var raw bytes.Buffer
	hdr := func(ino int, mode uint32, nlink int, size int, name string) {
		fmt.Fprintf(&raw, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, mode, 0, 0, nlink, SourceDateEpoch, size, 0, 0, 0, 0, len(name)+1, 0)
		raw.WriteString(name)
		raw.WriteByte(0)
		pad(&raw)
	}
	for i, k := range sortedKeys(t) {
		e := t[k]
		switch {
		case e.Dir:
			hdr(i+1, 0o040000|e.Mode, 2, 0, k)
		case e.Link != "":
			hdr(i+1, 0o120000|0o777, 1, len(e.Link), k)
			raw.WriteString(e.Link)
			pad(&raw)
		default:
			b, err := e.bytes()
			if err != nil {
				return nil, err
			}
			hdr(i+1, 0o100000|e.Mode, 1, len(b), k)
			raw.Write(b)
			pad(&raw)
		}
	}
	hdr(0, 0, 1, 0, "TRAILER!!!")
	var gz bytes.Buffer
	w, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(raw.Bytes()); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return gz.Bytes(), nil
}

func pad(b *bytes.Buffer) {
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
}

// kernel finds vmlinuz and the module directory in the kernel tree.
func (b *builder) kernel() (vmlinuz, moddir string, err error) {
	mods, err := os.ReadDir(filepath.Join(b.o.KernelTree, "lib/modules"))
	if err != nil || len(mods) == 0 {
		return "", "", fmt.Errorf("labos: kernel tree %s: no lib/modules: %v", b.o.KernelTree, err)
	}
	b.kver = mods[0].Name()
	return filepath.Join(b.o.KernelTree, "boot", "vmlinuz-"+b.kver), filepath.Join(b.o.KernelTree, "lib/modules", b.kver), nil
}

// modules adds Modules and their dependencies (modinfo -F depends) to t
// under lib/modules, with lib/modules/order listing them dependencies first.
// A module not found as a .ko is built in.
func (b *builder) modules(t tree, moddir string) error {
	index := map[string]string{}
	err := filepath.WalkDir(moddir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".ko") {
			index[strings.ReplaceAll(strings.TrimSuffix(d.Name(), ".ko"), "-", "_")] = p
		}
		return err
	})
	if err != nil {
		return err
	}
	var order []string
	seen := map[string]bool{}
	var resolve func(m string) error
	resolve = func(m string) error {
		m = strings.ReplaceAll(m, "-", "_")
		if seen[m] {
			return nil
		}
		seen[m] = true
		f, ok := index[m]
		if !ok {
			return nil // built in
		}
		out, err := run("", "/sbin/modinfo", "-F", "depends", f)
		if err != nil {
			return err
		}
		for _, d := range strings.Split(strings.TrimSpace(out), ",") {
			if d != "" {
				if err := resolve(d); err != nil {
					return err
				}
			}
		}
		order = append(order, m)
		t.copyFile("lib/modules/"+m+".ko", 0o644, f)
		return nil
	}
	for _, m := range Modules {
		if err := resolve(m); err != nil {
			return err
		}
	}
	t.file("lib/modules/order", 0o644, []byte(strings.Join(order, "\n")+"\n"))
	return nil
}

var lddLine = regexp.MustCompile(`(?m)^\s*(?:\S+ => )?(/\S+) \(0x`)

// elfWithLibs adds the dynamically linked program prog at dst and the shared
// libraries ldd lists, each at the path ldd names.
func elfWithLibs(t tree, prog, dst string) error {
	out, err := run("", "ldd", prog)
	if err != nil {
		return err
	}
	t.copyFile(dst, 0o755, prog)
	for _, m := range lddLine.FindAllStringSubmatch(out, -1) {
		real, err := filepath.EvalSymlinks(m[1])
		if err != nil {
			return err
		}
		t.copyFile(strings.TrimPrefix(m[1], "/"), 0o755, real)
	}
	return nil
}

// squashfs makes a squashfs image of t (all files root-owned, every time
// SourceDateEpoch, one compressor thread, xz) and returns its path.
func (b *builder) squashfs(t tree, name string) (string, error) {
	dir := filepath.Join(b.work, name+".d")
	if err := t.writeDir(dir); err != nil {
		return "", err
	}
	img := filepath.Join(b.work, name+".sqfs")
	_, err := run("", "mksquashfs", dir, img, "-noappend", "-quiet", "-no-progress", "-all-root", "-no-xattrs",
		"-processors", "1", "-comp", "xz") // SOURCE_DATE_EPOCH (run) sets the filesystem's and every file's time
	return img, err
}

// verity pads the filesystem image img to 4 KiB, appends a dm-verity hash
// tree (veritysetup format, sha256, fixed salt and UUID) and pads the result
// to pad bytes. It returns the root hash and the hash tree's offset.
func verity(img string, pad int64) (rootHash string, hashOffset int64, err error) {
	fi, err := os.Stat(img)
	if err != nil {
		return "", 0, err
	}
	hashOffset = (fi.Size() + 4095) / 4096 * 4096
	if err := os.Truncate(img, hashOffset); err != nil {
		return "", 0, err
	}
	out, err := run("", "veritysetup", "format", img, img, "--hash-offset="+strconv.FormatInt(hashOffset, 10),
		"--data-blocks="+strconv.FormatInt(hashOffset/4096, 10), "--salt="+VeritySalt, "--uuid="+VerityUUID, "--hash=sha256")
	if err != nil {
		return "", 0, err
	}
	m := regexp.MustCompile(`(?m)^Root hash:\s+([0-9a-f]{64})$`).FindStringSubmatch(out)
	if m == nil {
		return "", 0, fmt.Errorf("labos: veritysetup format printed no root hash: %s", out)
	}
	if fi, err = os.Stat(img); err != nil {
		return "", 0, err
	}
	if pad > 0 {
		if err := os.Truncate(img, (fi.Size()+pad-1)/pad*pad); err != nil {
			return "", 0, err
		}
	}
	return m[1], hashOffset, nil
}

// goBuild builds a static binary of pkg (CGO_ENABLED=0, -trimpath, no build
// ID) and returns its path.
func (b *builder) goBuild(pkg, name string) (string, error) {
	out := filepath.Join(b.work, name)
	cmd := []string{"build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", out, pkg}
	c := execCommand(b.o.RepoRoot, b.o.Go, cmd...)
	c.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := c.CombinedOutput(); err != nil {
		return "", fmt.Errorf("labos: go build %s: %v: %s", pkg, err, o)
	}
	return out, nil
}
