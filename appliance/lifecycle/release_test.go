package lifecycle

import (
	"context"
	"errors"
	"strings"
	"testing"

	"kiln/store"
)

// release registers a release over the real store: a base image and one
// layer image per name in extra (When from whens).
func (h *harness) release(name string, extra map[string]string) store.Image {
	h.t.Helper()
	base := h.image(name)
	layers := []store.Layer{{Name: store.BaseLayer, When: store.LayerAlways, VerityRootHash: strings.Repeat("ab", 32)}}
	for _, ln := range []string{"control-plane", "gpu", "secure-runtime"} {
		when, ok := extra[ln]
		if !ok {
			continue
		}
		li := h.image(name + "-" + ln)
		layers = append(layers, store.Layer{Name: ln, Image: li.ID, When: when})
	}
	rel, err := h.c.SetManifest(context.Background(), base.ID, layers, "v1.31.2", store.W{Actor: "test"})
	if err != nil {
		h.t.Fatal(err)
	}
	return rel
}

func TestSetManifest(t *testing.T) {
	h := newHarness(t, newStore(t), nil)
	ctx := context.Background()
	rel := h.release("os", map[string]string{"gpu": store.LayerNvidiaGPU})
	if len(rel.Layers) != 2 || rel.KubeadmVersion != "v1.31.2" {
		t.Fatalf("release %+v", rel)
	}
	b, g := rel.Layers[0], rel.Layers[1]
	if b.Image != rel.ID || b.SHA256 != rel.SHA256 || b.Size != rel.Size || b.PartName != "" {
		t.Fatalf("base layer not pinned to the release's own file: %+v", b)
	}
	gi, err := h.st.GetImage(g.Image)
	if err != nil || g.SHA256 != gi.SHA256 || g.Size != gi.Size || g.PartName != "kiln-layer-gpu" {
		t.Fatalf("gpu layer %+v (image %+v, %v)", g, gi, err)
	}
	stored, _ := h.st.GetImage(rel.ID)
	if len(stored.Layers) != 2 {
		t.Fatalf("manifest not stored: %+v", stored)
	}
	// The same manifest again: unchanged. Another: conflict (immutable).
	again, err := h.c.SetManifest(ctx, rel.ID, []store.Layer{{Name: "base", When: "always", VerityRootHash: strings.Repeat("ab", 32)},
		{Name: "gpu", Image: g.Image, When: store.LayerNvidiaGPU}}, "v1.31.2", store.W{})
	if err != nil || again.ResourceVersion != stored.ResourceVersion {
		t.Fatalf("same manifest again: %v %+v", err, again)
	}
	if _, err := h.c.SetManifest(ctx, rel.ID, []store.Layer{{Name: "base", When: "always"}}, "v1.31.3", store.W{}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("other manifest: %v, want ErrConflict", err)
	}
	// A layer image in use by a release is not deleted.
	if err := h.c.DeleteImage(ctx, g.Image, store.W{}); !errors.Is(err, store.ErrImageInUse) {
		t.Fatalf("delete layer image: %v, want ErrImageInUse", err)
	}

	other := h.image("os2")
	for name, tc := range map[string]struct {
		layers []store.Layer
		kube   string
		want   error
		field  string
	}{
		"no kubeadm":       {[]store.Layer{{Name: "base", When: "always"}}, "", ErrInvalid, "kubeadm_version"},
		"no layers":        {nil, "v1.31.2", ErrInvalid, "layers"},
		"base not first":   {[]store.Layer{{Name: "gpu", Image: g.Image, When: "always"}}, "v1.31.2", ErrInvalid, "layers[0]"},
		"bad when":         {[]store.Layer{{Name: "base", When: "always"}, {Name: "x", Image: g.Image, When: "pci:8086"}}, "v1.31.2", ErrInvalid, "layers[1].when"},
		"duplicate":        {[]store.Layer{{Name: "base", When: "always"}, {Name: "x", Image: g.Image, When: "always"}, {Name: "x", Image: g.Image, When: "always"}}, "v1.31.2", ErrInvalid, "layers[2].name"},
		"missing image":    {[]store.Layer{{Name: "base", When: "always"}, {Name: "x", Image: "img-nope", When: "always"}}, "v1.31.2", ErrInvalid, "layers[1].image"},
		"layer no image":   {[]store.Layer{{Name: "base", When: "always"}, {Name: "x", When: "always"}}, "v1.31.2", ErrInvalid, "layers[1].image"},
		"release as layer": {[]store.Layer{{Name: "base", When: "always"}, {Name: "x", Image: rel.ID, When: "always"}}, "v1.31.2", ErrInvalid, "layers[1].image"},
		"wrong pin":        {[]store.Layer{{Name: "base", When: "always"}, {Name: "x", Image: g.Image, When: "always", SHA256: strings.Repeat("1", 64)}}, "v1.31.2", ErrDigest, "layers[1].sha256"},
		"bad verity":       {[]store.Layer{{Name: "base", When: "always", VerityRootHash: "xyz"}}, "v1.31.2", ErrInvalid, "verity_root_hash"},
	} {
		_, err := h.c.SetManifest(ctx, other.ID, tc.layers, tc.kube, store.W{})
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v, want %v naming %s", name, err, tc.want, tc.field)
		}
	}
	if im, _ := h.st.GetImage(other.ID); im.IsRelease() {
		t.Fatalf("a refused manifest was stored: %+v", im)
	}
}
