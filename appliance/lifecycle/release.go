// Releases (issue 15): SetManifest registers an image's release manifest
// (the base layer is the image's own file; every other layer a catalog
// image, pinned by SHA-256). The rules of the manifest's fields are
// rules.CheckManifest; what this file adds is what needs the store: each
// layer's image exists, is a raw file, is no release itself, and has the
// pinned digest.

package lifecycle

import (
	"context"
	"fmt"
	"reflect"

	"kiln/appliance/lifecycle/rules"
	"kiln/store"
)

// SetManifest makes image id a release: layers (base first) and the
// kubeadm version it carries. Each layer other than the base names a
// catalog image (upload it first, POST /v1/images) whose record must be a
// raw image with content (SHA-256 and size known) and no manifest of its
// own; its SHA-256 and size are pinned from that record (a SHA256 given in
// the request must equal it). The base layer is pinned to the image's own
// record. A manifest is immutable: setting the same manifest again returns
// the image as it is; a different one is store.ErrConflict (register a new
// image). Errors: ErrInvalid (wrapping the *rules.FieldError of
// rules.CheckManifest, or naming the layer whose image is unsuitable),
// store.ErrNotFound, store.ErrConflict, *store.UnsupportedByClusterError
// (a node of the cluster predates put_image_v2), store errors.
func (c *Controller) SetManifest(ctx context.Context, id string, layers []store.Layer, kubeadm string, w store.W) (store.Image, error) {
	img, err := c.st.GetImage(id)
	if err != nil {
		return store.Image{}, fmt.Errorf("lifecycle: release %s: %w", id, err)
	}
	want := img
	want.Layers, want.KubeadmVersion = append([]store.Layer(nil), layers...), kubeadm
	if err := rules.CheckManifest(&want); err != nil {
		return store.Image{}, invalidField(err)
	}
	for i := range want.Layers {
		l := &want.Layers[i]
		src := img
		if i > 0 {
			if src, err = c.st.GetImage(l.Image); err != nil {
				return store.Image{}, fmt.Errorf("%w: layers[%d].image %s: %v", ErrInvalid, i, l.Image, err)
			}
			if src.Format != "raw" || src.IsRelease() {
				return store.Image{}, fmt.Errorf("%w: layers[%d].image %s: a layer is a raw image without a manifest of its own (format %s)",
					ErrInvalid, i, l.Image, src.Format)
			}
		}
		if src.SHA256 == "" || src.Size == 0 {
			return store.Image{}, fmt.Errorf("%w: layers[%d]: image %s has no recorded content", ErrInvalid, i, src.ID)
		}
		if l.SHA256 != "" && l.SHA256 != src.SHA256 {
			return store.Image{}, fmt.Errorf("%w: layers[%d].sha256 %s: image %s holds %s", ErrDigest, i, l.SHA256, src.ID, src.SHA256)
		}
		l.SHA256, l.Size = src.SHA256, src.Size
	}
	if img.IsRelease() {
		if reflect.DeepEqual(img.Layers, want.Layers) && img.KubeadmVersion == want.KubeadmVersion {
			return img, nil
		}
		return store.Image{}, fmt.Errorf("lifecycle: image %s already is a release with another manifest; manifests are immutable, register a new image: %w",
			id, store.ErrConflict)
	}
	out, err := c.st.PutImage(ctx, want, withDefaults(w, "release_registered"))
	if err != nil {
		return store.Image{}, fmt.Errorf("lifecycle: record release %s: %w", id, err)
	}
	return out, nil
}

// releaseUsing returns the ID of a release whose manifest names image id
// as a layer ("" when none).
func releaseUsing(imgs []store.Image, id string) string {
	for _, im := range imgs {
		for _, l := range im.Layers {
			if l.Image == id && im.ID != id {
				return im.ID
			}
		}
	}
	return ""
}
