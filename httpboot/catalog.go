package httpboot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Catalog is the on-disk image store: one file per image in its directory,
// plus ".meta/NAME.json" (SHA-256, size, mtime) and ".tmp/" for uploads in
// progress. Image names never start with ".", so they cannot collide with
// those. Safe for concurrent use; the file system is the only state.
type Catalog struct {
	dir     string
	digests *digestCache
}

// Entry describes one stored image. SHA256 is lower-case hex of the bytes
// as stored; Size in bytes.
type Entry struct {
	Name    string    `json:"name"`
	Size    int64     `json:"size_bytes"`
	SHA256  string    `json:"sha256"`
	ModTime time.Time `json:"mod_time"`
}

type sidecar struct {
	SHA256  string `json:"sha256"`
	Size    int64  `json:"size_bytes"`
	MtimeNS int64  `json:"mtime_ns"`
}

// MaxImageNameLen bounds image names in bytes.
const MaxImageNameLen = 128

// ValidImageName reports whether name may be an image name: 1–128 bytes of
// [A-Za-z0-9._-], starting with a letter or digit.
func ValidImageName(name string) bool {
	return allIn(name, MaxImageNameLen, "._-") && isAlnum(name[0])
}

// OpenCatalog opens (creating if needed, mode 0755) the catalog in dir and
// removes leftovers of interrupted uploads.
func OpenCatalog(dir string) (*Catalog, error) {
	return openCatalog(dir, newDigestCache(nil))
}

func openCatalog(dir string, dc *digestCache) (*Catalog, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: image_dir is empty", ErrConfig)
	}
	for _, d := range []string{dir, filepath.Join(dir, ".meta"), filepath.Join(dir, ".tmp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("httpboot: catalog: %w", err)
		}
	}
	tmps, _ := os.ReadDir(filepath.Join(dir, ".tmp"))
	for _, t := range tmps {
		os.Remove(filepath.Join(dir, ".tmp", t.Name()))
	}
	return &Catalog{dir: dir, digests: dc}, nil
}

// Dir returns the catalog directory.
func (c *Catalog) Dir() string { return c.dir }

func (c *Catalog) path(name string) string { return filepath.Join(c.dir, name) }
func (c *Catalog) meta(name string) string { return filepath.Join(c.dir, ".meta", name+".json") }

// ctxReader fails reads once ctx is done, so a cancelled upload stops.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

// Upload streams r into the catalog as name: the bytes go to a temporary
// file while being hashed (never held whole in memory), then the length is
// checked against size (size < 0: not checked) and the SHA-256 against
// wantSHA256 (64 hex digits; "" = not checked, for a compressed image whose
// declared digest is that of its decompressed content, which the agent
// verifies after writing; the Entry carries the computed digest either way),
// the file is fsynced and renamed into
// place atomically, and the directory fsynced. An existing image of the same
// name is replaced atomically. On any error nothing changes in the catalog.
// Errors: ErrBadName, ErrBadDigest, ErrSizeMismatch, ErrDigestMismatch,
// ctx.Err(), or an I/O error.
func (c *Catalog) Upload(ctx context.Context, name string, r io.Reader, wantSHA256 string, size int64) (Entry, error) {
	if !ValidImageName(name) {
		return Entry{}, fmt.Errorf("%w: %q", ErrBadName, name)
	}
	want := strings.ToLower(wantSHA256)
	if b, err := hex.DecodeString(want); want != "" && (err != nil || len(b) != sha256.Size) {
		return Entry{}, ErrBadDigest
	}
	tmp, err := os.CreateTemp(filepath.Join(c.dir, ".tmp"), name+".*")
	if err != nil {
		return Entry{}, fmt.Errorf("httpboot: upload %s: %w", name, err)
	}
	keep := false
	defer func() {
		if !keep {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	src := io.Reader(ctxReader{ctx, r})
	if size >= 0 {
		src = io.LimitReader(src, size+1) // one extra byte detects an over-long body
	}
	n, err := copyHashing(tmp, h, src)
	if err != nil {
		return Entry{}, fmt.Errorf("httpboot: upload %s: %w", name, err)
	}
	if size >= 0 && n != size {
		return Entry{}, fmt.Errorf("%w: got %d bytes, declared %d", ErrSizeMismatch, n, size)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if want != "" && got != want {
		return Entry{}, fmt.Errorf("%w: got %s, declared %s", ErrDigestMismatch, got, want)
	}
	if err := tmp.Sync(); err != nil {
		return Entry{}, fmt.Errorf("httpboot: upload %s: fsync: %w", name, err)
	}
	st, err := tmp.Stat()
	if err != nil {
		return Entry{}, err
	}
	if err := tmp.Close(); err != nil {
		return Entry{}, err
	}
	// Sidecar first: if we crash before the rename it describes no file
	// (size/mtime mismatch) and is recomputed on next Open.
	if err := c.writeSidecar(name, sidecar{SHA256: got, Size: n, MtimeNS: st.ModTime().UnixNano()}); err != nil {
		return Entry{}, err
	}
	if err := os.Rename(tmp.Name(), c.path(name)); err != nil {
		return Entry{}, fmt.Errorf("httpboot: upload %s: rename: %w", name, err)
	}
	keep = true
	if err := syncDir(c.dir); err != nil {
		return Entry{}, err
	}
	c.digests.put(c.path(name), n, st.ModTime(), got)
	return Entry{Name: name, Size: n, SHA256: got, ModTime: st.ModTime()}, nil
}

// copyHashing copies src to f and h with a fixed 1 MiB buffer.
func copyHashing(f *os.File, h hash.Hash, src io.Reader) (int64, error) {
	buf := make([]byte, 1<<20)
	var n int64
	for {
		k, rerr := src.Read(buf)
		if k > 0 {
			h.Write(buf[:k])
			if _, err := f.Write(buf[:k]); err != nil {
				return n, err
			}
			n += int64(k)
		}
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

func (c *Catalog) writeSidecar(name string, s sidecar) error {
	b, _ := json.Marshal(s)
	tmp, err := os.CreateTemp(filepath.Join(c.dir, ".tmp"), name+".meta.*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	tmp.Close()
	if err := os.Rename(tmp.Name(), c.meta(name)); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return syncDir(filepath.Join(c.dir, ".meta"))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("httpboot: fsync %s: %w", dir, err)
	}
	return nil
}

// entry returns the Entry for an open image file, taking the digest from the
// sidecar when it matches the file's size and mtime, else computing it (and
// rewriting the sidecar). Images copied into the directory by hand are thus
// picked up, hashed once.
func (c *Catalog) entry(name string, st fs.FileInfo) (Entry, error) {
	e := Entry{Name: name, Size: st.Size(), ModTime: st.ModTime()}
	if b, err := os.ReadFile(c.meta(name)); err == nil {
		var s sidecar
		if json.Unmarshal(b, &s) == nil && s.Size == st.Size() && s.MtimeNS == st.ModTime().UnixNano() && len(s.SHA256) == 64 {
			e.SHA256 = s.SHA256
			c.digests.put(c.path(name), e.Size, e.ModTime, e.SHA256)
			return e, nil
		}
	}
	sum, err := c.digests.get(c.path(name), st.Size(), st.ModTime())
	if err != nil {
		return Entry{}, err
	}
	e.SHA256 = sum
	_ = c.writeSidecar(name, sidecar{SHA256: sum, Size: e.Size, MtimeNS: e.ModTime.UnixNano()}) // a cache; failure only costs a rehash
	return e, nil
}

// Open opens image name for reading. The caller closes the file. Errors:
// ErrBadName, ErrNotFound, or an I/O error while hashing.
func (c *Catalog) Open(name string) (*os.File, Entry, error) {
	if !ValidImageName(name) {
		return nil, Entry{}, fmt.Errorf("%w: %q", ErrBadName, name)
	}
	f, err := os.Open(c.path(name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, Entry{}, fmt.Errorf("%w: image %s", ErrNotFound, name)
		}
		return nil, Entry{}, err
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, Entry{}, fmt.Errorf("%w: image %s", ErrNotFound, name)
	}
	e, err := c.entry(name, st)
	if err != nil {
		f.Close()
		return nil, Entry{}, err
	}
	return f, e, nil
}

// List returns every image sorted by name (hashing any not yet hashed).
func (c *Catalog) List() ([]Entry, error) {
	des, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, de := range des {
		if !ValidImageName(de.Name()) || !de.Type().IsRegular() {
			continue
		}
		st, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		e, err := c.entry(de.Name(), st)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Delete removes image name. Transfers already reading it finish (the open
// file stays valid). Errors: ErrBadName, ErrNotFound.
func (c *Catalog) Delete(name string) error {
	if !ValidImageName(name) {
		return fmt.Errorf("%w: %q", ErrBadName, name)
	}
	if err := os.Remove(c.path(name)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: image %s", ErrNotFound, name)
		}
		return err
	}
	os.Remove(c.meta(name))
	c.digests.forget(c.path(name))
	return syncDir(c.dir)
}
