// Part of the image catalog (catalog.go): a copy of a recorded image's file
// (from a peer, appliance/imagesync.go), checked as an upload is.

package lifecycle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"

	"kiln/store"
)

// PutImageFile writes r into the catalog as the file of the recorded image
// img (img.Name), as UploadImage stores an upload: format raw, the stored
// bytes must be img.Size bytes with SHA-256 img.SHA256 (the catalog's
// check); gzip or zstd, they must decode to img.Size bytes with SHA-256
// img.SHA256 (contentCheck). The catalog replaces the file atomically only
// when the whole body passed, so on any error the file there before is
// kept. It writes no record, and waits for no upload: while an upload of the
// same name runs it is store.ErrConflict (try again later). Errors:
// ErrNoCatalog, ErrInvalid (img has no digest or no size), store.ErrConflict,
// ErrDigest, ErrImageFormat, ErrImageSize, the catalog's (ErrDigestMismatch,
// ErrSizeMismatch of package httpboot; a read error of r).
func (c *Controller) PutImageFile(ctx context.Context, img store.Image, r io.Reader) (CatalogEntry, error) {
	if c.cfg.Catalog == nil {
		return CatalogEntry{}, ErrNoCatalog
	}
	if img.SHA256 == "" || img.Size == 0 {
		return CatalogEntry{}, fmt.Errorf("%w: image %s has no recorded sha256 or size", ErrInvalid, img.ID)
	}
	release, ok := c.claimUpload([]string{"name:" + img.Name, "id:" + img.ID})
	if !ok {
		return CatalogEntry{}, fmt.Errorf("lifecycle: image %q (id %q) is being uploaded: %w", img.Name, img.ID, store.ErrConflict)
	}
	defer release()
	want, size, body := strings.ToLower(img.SHA256), int64(img.Size), r
	if img.Format != "" && img.Format != "raw" {
		cc := newContentCheck(img.Format, r, img.Size, strings.ToLower(img.SHA256))
		defer cc.stop()
		want, size, body = "", -1, cc
	}
	ent, err := c.cfg.Catalog.Upload(ctx, img.Name, body, want, size)
	if err != nil {
		return CatalogEntry{}, fmt.Errorf("lifecycle: copy of image %s (%s): %w", img.ID, img.Name, err)
	}
	return ent, nil
}

// CheckImageContent reads r to its end and reports whether it is the file
// of the recorded image img: format raw, img.Size bytes with SHA-256
// img.SHA256; gzip or zstd, a stream that decodes to those. Errors:
// ErrDigest, ErrImageSize, ErrImageFormat, or r's read error.
func CheckImageContent(img store.Image, r io.Reader) error {
	if img.Format != "" && img.Format != "raw" {
		cc := newContentCheck(img.Format, r, img.Size, strings.ToLower(img.SHA256))
		defer cc.stop()
		_, err := io.Copy(io.Discard, cc)
		return err
	}
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return err
	}
	if uint64(n) != img.Size {
		return fmt.Errorf("%w: %d bytes, recorded %d", ErrImageSize, n, img.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); !strings.EqualFold(got, img.SHA256) {
		return fmt.Errorf("%w: sha256 %s, recorded %s", ErrDigest, got, img.SHA256)
	}
	return nil
}
