// The image catalog (Config.Catalog): UploadImage and DeleteImage keep the
// catalog file and the store's image record together; uploadSet refuses a
// second upload of a name in progress on this node. The check of a
// compressed upload's content is in imagecheck.go. Owner of uploadSet:
// this file only.

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"sync"

	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// CatalogEntry is a stored image file: Name, Size in bytes, SHA256 hex of its bytes.
type CatalogEntry struct {
	Name   string
	Size   int64
	SHA256 string
}

// Catalog stores image files served under ImageBaseURL + "/images/" + name.
// Upload streams r to the file; when wantSHA256 is not empty a mismatch is
// an error and nothing is kept; size < 0 means unknown.
type Catalog interface {
	Upload(ctx context.Context, name string, r io.Reader, wantSHA256 string, size int64) (CatalogEntry, error)
}

// CatalogDeleter is optionally implemented by a Catalog: DeleteImage then
// removes the image file too (a missing file, fs.ErrNotExist, is not an error).
type CatalogDeleter interface {
	Delete(name string) error
}

// UploadImage streams r into the catalog under meta.Name and records the
// image. Images are immutable content pinned by digest:
//
//   - meta.ID "" lets the store choose the ID (POST /v1/images). A chosen ID
//     (PUT /v1/images/{id}) must not name another image: when an image with
//     that ID exists and has the same name, version, format and SHA-256 (and
//     size, when meta.Size is given), it is returned as it is and r is not
//     read (a repeated upload is idempotent); any other image there is
//     store.ErrConflict.
//   - A name already in the catalog is store.ErrConflict (upload a new name).
//   - meta.Size, when given, is 1..store.MaxImageSize bytes.
//   - Format raw (default): meta.SHA256 and meta.Size, when given, must be
//     the stored bytes' digest and length (the catalog checks them); both are
//     then taken from what was stored.
//   - Format gzip|zstd: meta.SHA256 and meta.Size are required and state the
//     raw (decompressed) content the agent writes. The body is decoded while
//     it is stored (contentCheck): a body that does not decode is
//     ErrImageFormat, decompressed content of another length ErrImageSize, of
//     another digest ErrDigest.
//
// On any error nothing is recorded and the catalog keeps nothing. Errors:
// ErrNoCatalog, ErrInvalid (wrapping the *rules.FieldError of
// rules.CheckImage, the metadata's one rule), ErrDigest, ErrImageFormat, ErrImageSize,
// store.ErrConflict, the catalog's error (a read error of r among them).
func (c *Controller) UploadImage(ctx context.Context, meta store.Image, r io.Reader, w store.W) (store.Image, error) {
	if c.cfg.Catalog == nil {
		return store.Image{}, ErrNoCatalog
	}
	if err := rules.CheckImage(&meta); err != nil {
		return store.Image{}, invalidField(err)
	}
	// One upload per name and per chosen ID at a time: the checks below and
	// the catalog's atomic replace would otherwise let two concurrent uploads
	// both pass, one file replace the other and both be recorded, one of
	// them with a digest the served file does not have.
	keys := []string{"name:" + meta.Name}
	if meta.ID != "" {
		keys = append(keys, "id:"+meta.ID)
	}
	release, ok := c.claimUpload(keys)
	if !ok {
		return store.Image{}, fmt.Errorf("lifecycle: image %q (id %q) is being uploaded: %w", meta.Name, meta.ID, store.ErrConflict)
	}
	defer release()
	if meta.ID != "" {
		cur, err := c.st.GetImage(meta.ID)
		switch {
		case err == nil:
			if sameImage(cur, meta) {
				return cur, nil
			}
			return store.Image{}, fmt.Errorf("lifecycle: image %s exists with other content (name %q, version %q, %s, sha256 %s); images are immutable, upload under a new ID: %w",
				cur.ID, cur.Name, cur.Version, cur.Format, cur.SHA256, store.ErrConflict)
		case !errors.Is(err, store.ErrNotFound):
			return store.Image{}, err
		}
	}
	imgs, err := c.st.ListImages()
	if err != nil {
		return store.Image{}, err
	}
	for _, im := range imgs {
		if im.Name == meta.Name {
			return store.Image{}, fmt.Errorf("lifecycle: image name %q is image %s: %w", meta.Name, im.ID, store.ErrConflict)
		}
	}
	want, size, body := "", int64(-1), r
	if meta.Format == "raw" {
		want = meta.SHA256
		if meta.Size > 0 {
			size = int64(meta.Size)
		}
	} else {
		cc := newContentCheck(meta.Format, r, meta.Size, meta.SHA256)
		defer cc.stop()
		body = cc
	}
	ent, err := c.cfg.Catalog.Upload(ctx, meta.Name, body, want, size)
	if err != nil {
		return store.Image{}, fmt.Errorf("lifecycle: upload image %s: %w", meta.Name, err)
	}
	if meta.Format == "raw" {
		if want != "" && !strings.EqualFold(ent.SHA256, want) {
			return store.Image{}, fmt.Errorf("%w: declared %s, stored %s", ErrDigest, want, ent.SHA256)
		}
		meta.SHA256, meta.Size = strings.ToLower(ent.SHA256), uint64(ent.Size)
	}
	if meta.Source == "" {
		meta.Source = "upload"
	}
	meta.ResourceVersion = 0
	out, err := c.st.PutImage(ctx, meta, withDefaults(w, "image_uploaded"))
	if err != nil {
		return store.Image{}, fmt.Errorf("lifecycle: record image %s: %w", meta.Name, err)
	}
	return out, nil
}

// sameImage reports whether upload meta describes image cur: same name,
// version, format and SHA-256, and the same size when meta gives one.
func sameImage(cur, meta store.Image) bool {
	return cur.Name == meta.Name && cur.Version == meta.Version && cur.Format == meta.Format &&
		cur.SHA256 == meta.SHA256 && (meta.Size == 0 || cur.Size == meta.Size)
}

// claimUpload marks keys as being uploaded; ok is false (and nothing is
// marked) when one of them already is. release unmarks them.
func (c *Controller) claimUpload(keys []string) (release func(), ok bool) {
	return c.uploads.claim(keys)
}

// uploadSet holds the image names (and chosen IDs) with an upload in
// progress on this node: a second upload of the same name is refused
// before it can replace the first one's file in the catalog. Its own lock.
type uploadSet struct {
	mu   sync.Mutex
	keys map[string]bool
}

func (u *uploadSet) claim(keys []string) (release func(), ok bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.keys == nil {
		u.keys = map[string]bool{}
	}
	for _, k := range keys {
		if u.keys[k] {
			return nil, false
		}
	}
	for _, k := range keys {
		u.keys[k] = true
	}
	return func() {
		u.mu.Lock()
		for _, k := range keys {
			delete(u.keys, k)
		}
		u.mu.Unlock()
	}, true
}

// DeleteImage deletes image id unless a machine's claim names it
// (store.ErrImageInUse, decided inside the store's raft apply, so a
// concurrent Provision or ClaimMachines of that image cannot both succeed
// with it); the catalog file is removed when the Catalog supports Delete.
// A layer of a release (issue 15) is refused with store.ErrImageInUse
// while the release names it. Errors: store.ErrImageInUse,
// store.ErrNotFound, store errors.
func (c *Controller) DeleteImage(ctx context.Context, id string, w store.W) error {
	img, err := c.st.GetImage(id)
	if err != nil {
		return fmt.Errorf("lifecycle: delete image %s: %w", id, err)
	}
	// Issue 15: a layer of a release stays while the release names it
	// (checked here, not in the raft apply: delete the release first).
	if imgs, err := c.st.ListImages(); err != nil {
		return err
	} else if rel := releaseUsing(imgs, id); rel != "" {
		return fmt.Errorf("lifecycle: image %s is a layer of release %s: %w", id, rel, store.ErrImageInUse)
	}
	if err := c.st.DeleteImage(ctx, id, withDefaults(w, "image_deleted")); err != nil {
		return fmt.Errorf("lifecycle: delete image %s: %w", id, err)
	}
	if d, ok := c.cfg.Catalog.(CatalogDeleter); ok {
		if err := d.Delete(img.Name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("lifecycle: image %s deleted, catalog file %s kept: %w", id, img.Name, err)
		}
	}
	return nil
}
