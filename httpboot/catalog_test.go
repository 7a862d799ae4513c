package httpboot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func hexSum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestCatalog(t *testing.T) {
	dir := t.TempDir()
	c, err := OpenCatalog(dir)
	must(t, err)
	ctx := context.Background()
	img := bytes.Repeat([]byte("image!"), 500000) // 3 MB
	e, err := c.Upload(ctx, "ubuntu-24.04.raw", bytes.NewReader(img), hexSum(img), int64(len(img)))
	must(t, err)
	if e.SHA256 != hexSum(img) || e.Size != int64(len(img)) {
		t.Fatalf("entry %+v", e)
	}
	// Failures leave nothing behind and keep the old image.
	for _, tc := range []struct {
		name, sum string
		size      int64
		body      []byte
		want      error
	}{
		{"ubuntu-24.04.raw", hexSum([]byte("x")), int64(len(img)), img, ErrDigestMismatch},
		{"ubuntu-24.04.raw", hexSum(img), int64(len(img)) - 1, img, ErrSizeMismatch},
		{"ubuntu-24.04.raw", hexSum(img), int64(len(img)) + 1, img, ErrSizeMismatch},
		{"../evil", hexSum(img), -1, img, ErrBadName},
		{".meta", hexSum(img), -1, img, ErrBadName},
		{"a/b", hexSum(img), -1, img, ErrBadName},
		{"ok", "zz", -1, img, ErrBadDigest},
	} {
		if _, err := c.Upload(ctx, tc.name, bytes.NewReader(tc.body), tc.sum, tc.size); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
	}
	tmps, _ := os.ReadDir(filepath.Join(dir, ".tmp"))
	if len(tmps) != 0 {
		t.Errorf("temp files left: %d", len(tmps))
	}
	f, e2, err := c.Open("ubuntu-24.04.raw")
	must(t, err)
	got, _ := io.ReadAll(f)
	f.Close()
	if !bytes.Equal(got, img) || e2.SHA256 != e.SHA256 {
		t.Fatal("stored image changed by failed uploads")
	}
	// No declared digest (a compressed image, declared by its decompressed
	// content's digest): stored, the Entry carries the computed digest.
	gz := []byte("\x1f\x8b compressed bytes")
	ez, err := c.Upload(ctx, "comp.img.gz", bytes.NewReader(gz), "", int64(len(gz)))
	must(t, err)
	if ez.SHA256 != hexSum(gz) || ez.Size != int64(len(gz)) {
		t.Fatalf("undeclared digest: entry %+v", ez)
	}
	must(t, c.Delete("comp.img.gz"))
	// Unknown size (-1) is fine when the digest matches.
	small := []byte("small image")
	_, err = c.Upload(ctx, "small.img", bytes.NewReader(small), hexSum(small), -1)
	must(t, err)
	// A file copied in by hand is hashed on first use.
	must(t, os.WriteFile(filepath.Join(dir, "manual.img"), []byte("by hand"), 0o644))
	list, err := c.List()
	must(t, err)
	if len(list) != 3 || list[0].Name != "manual.img" || list[0].SHA256 != hexSum([]byte("by hand")) || list[2].Name != "ubuntu-24.04.raw" {
		t.Fatalf("list %+v", list)
	}
	// Cancelled upload.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Upload(cctx, "c.img", bytes.NewReader(img), hexSum(img), -1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled upload: %v", err)
	}
	must(t, c.Delete("small.img"))
	if err := c.Delete("small.img"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("double delete: %v", err)
	}
	if _, _, err := c.Open("small.img"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("open deleted: %v", err)
	}
	// Reopening the catalog keeps digests (sidecars) and clears temp files.
	must(t, os.WriteFile(filepath.Join(dir, ".tmp", "stale"), []byte("x"), 0o644))
	c2, err := OpenCatalog(dir)
	must(t, err)
	list, err = c2.List()
	must(t, err)
	if len(list) != 2 || list[1].SHA256 != e.SHA256 {
		t.Fatalf("reopened list %+v", list)
	}
	if tmps, _ := os.ReadDir(filepath.Join(dir, ".tmp")); len(tmps) != 0 {
		t.Fatal("stale temp file kept")
	}
}

// zeroReader yields n zero bytes without allocating them.
type zeroReader struct{ n int64 }

func (z *zeroReader) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > z.n {
		p = p[:z.n]
	}
	clear(p)
	z.n -= int64(len(p))
	return len(p), nil
}

// The upload streams: 256 MiB through a fixed buffer, heap stays small.
func TestCatalogUploadStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	c, err := OpenCatalog(t.TempDir())
	must(t, err)
	const size = 256 << 20
	h := sha256.New()
	io.Copy(h, &zeroReader{size})
	sum := hex.EncodeToString(h.Sum(nil))
	var peak uint64
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err = c.Upload(context.Background(), "zeros.img", &zeroReader{size}, sum, size)
	}()
	peak = watchHeap(done)
	must(t, err)
	if peak > 64<<20 {
		t.Fatalf("heap peaked at %d MiB during a 256 MiB upload", peak>>20)
	}
}
