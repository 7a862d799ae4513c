package lifecycle

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/klauspost/compress/zstd"

	"kiln/store"
)

func hexSum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// stopAfter is a Catalog that reads n bytes of an upload and then fails,
// as a catalog does when its disk fills.
type stopAfter struct{ n int64 }

var errDiskFull = errors.New("disk full")

func (s stopAfter) Upload(_ context.Context, _ string, r io.Reader, _ string, _ int64) (CatalogEntry, error) {
	_, _ = io.CopyN(io.Discard, r, s.n)
	return CatalogEntry{}, errDiskFull
}

// TestCompressedUploadIsDecodedAndChecked: a gzip or zstd upload is decoded
// while it is stored, and refused (nothing recorded, no file) unless it
// decodes to exactly the declared size and sha256.
func TestCompressedUploadIsDecodedAndChecked(t *testing.T) {
	raw := bytes.Repeat([]byte("raw disk content "), 20000)
	var gzb, zsb bytes.Buffer
	zw := gzip.NewWriter(&gzb)
	zw.Write(raw)
	zw.Close()
	zs, _ := zstd.NewWriter(&zsb)
	zs.Write(raw)
	zs.Close()
	sum, size := hexSum(raw), uint64(len(raw))
	f := newStore(t)
	h := newHarness(t, f, nil)
	dir := h.c.cfg.Catalog.(dirCatalog).dir
	for _, c := range []struct {
		name, format string
		body         io.Reader
		size         uint64
		sha          string
		want         error // nil: accepted
	}{
		{"a.gz", "gzip", bytes.NewReader(gzb.Bytes()), size, sum, nil},
		{"a.zst", "zstd", bytes.NewReader(zsb.Bytes()), size, sum, nil},
		{"b.gz", "gzip", strings.NewReader("plain text, not gzip"), 20, hexSum([]byte("plain text, not gzip")), ErrImageFormat},
		{"b.zst", "zstd", bytes.NewReader(gzb.Bytes()), size, sum, ErrImageFormat}, // gzip declared as zstd
		{"c.gz", "gzip", bytes.NewReader(gzb.Bytes()[:gzb.Len()-4]), size, sum, ErrImageFormat},
		{"d.gz", "gzip", io.MultiReader(bytes.NewReader(gzb.Bytes()), strings.NewReader("junk")), size, sum, ErrImageFormat},
		{"e.gz", "gzip", bytes.NewReader(gzb.Bytes()), size - 1, sum, ErrImageSize},
		{"f.gz", "gzip", bytes.NewReader(gzb.Bytes()), size + 1, sum, ErrImageSize},
		{"g.zst", "zstd", bytes.NewReader(zsb.Bytes()), size, hexSum([]byte("x")), ErrDigest},
		{"h.gz", "gzip", bytes.NewReader(gzb.Bytes()), store.MaxImageSize + 1, sum, ErrInvalid},
		// A body that fails to arrive fails with its own error, not a verdict.
		{"i.gz", "gzip", io.MultiReader(bytes.NewReader(gzb.Bytes()[:100]), iotest.ErrReader(io.ErrUnexpectedEOF)), size, sum, io.ErrUnexpectedEOF},
	} {
		im, err := h.c.UploadImage(bg, store.Image{Name: c.name, Version: "1", Format: c.format, SHA256: c.sha, Size: c.size}, c.body, store.W{})
		switch {
		case c.want == nil && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want == nil:
			if im.Size != size || im.SHA256 != sum {
				t.Errorf("%s: recorded %+v", c.name, im)
			}
		case !errors.Is(err, c.want):
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		case c.want == io.ErrUnexpectedEOF && (errors.Is(err, ErrImageFormat) || errors.Is(err, ErrImageSize)):
			t.Errorf("%s: a failed read reported as a verdict: %v", c.name, err)
		default:
			if _, serr := os.Stat(dir + "/" + c.name); !errors.Is(serr, os.ErrNotExist) {
				t.Errorf("%s: refused upload left its file: %v", c.name, serr)
			}
		}
	}
	if imgs, _ := f.ListImages(); len(imgs) != 2 {
		t.Fatalf("%d images recorded, want the 2 good ones: %+v", len(imgs), imgs)
	}
}

// TestCompressedUploadStopsItsDecoder: when the catalog stops reading an
// upload early, the decoder goroutine ends too.
func TestCompressedUploadStopsItsDecoder(t *testing.T) {
	raw := bytes.Repeat([]byte("x"), 1<<20)
	var gzb bytes.Buffer
	zw := gzip.NewWriter(&gzb)
	zw.Write(raw)
	zw.Close()
	h := newHarness(t, newStore(t), func(c *Config) { c.Catalog = stopAfter{n: 100} })
	before := runtime.NumGoroutine()
	for i := 0; i < 20; i++ {
		_, err := h.c.UploadImage(bg, store.Image{Name: "x.gz", Version: "1", Format: "gzip", SHA256: hexSum(raw), Size: uint64(len(raw))},
			bytes.NewReader(gzb.Bytes()), store.W{})
		if !errors.Is(err, errDiskFull) {
			t.Fatalf("upload: %v", err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+2 {
		t.Fatalf("%d goroutines after 20 stopped uploads, %d before", n, before)
	}
}

// TestPutUnderChosenID: an upload with meta.ID creates the image under that
// ID; the same upload again returns the stored image without reading the
// body; other content under the ID is a conflict.
func TestPutUnderChosenID(t *testing.T) {
	f := newStore(t)
	h := newHarness(t, f, nil)
	data := []byte(strings.Repeat("image ", 1000))
	meta := store.Image{Meta: store.Meta{ID: "os-1"}, Name: "os-1.raw", Version: "1", SHA256: hexSum(data)}
	im, err := h.c.UploadImage(bg, meta, bytes.NewReader(data), store.W{})
	must(t, err)
	if im.ID != "os-1" {
		t.Fatalf("ID %q, want os-1", im.ID)
	}
	again, err := h.c.UploadImage(bg, meta, iotest.ErrReader(errors.New("the body must not be read")), store.W{})
	if err != nil || again.ID != "os-1" || again.ResourceVersion != im.ResourceVersion {
		t.Fatalf("same again: %+v %v", again, err)
	}
	other := meta
	other.SHA256 = hexSum([]byte("other"))
	if _, err := h.c.UploadImage(bg, other, strings.NewReader("other"), store.W{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("other content under the ID: %v", err)
	}
	if imgs, _ := f.ListImages(); len(imgs) != 1 || imgs[0].SHA256 != hexSum(data) {
		t.Fatalf("images %+v", imgs)
	}
}
