package api_test

import (
	"net/http"
	"testing"

	. "kiln/api"
	"kiln/store"
)

// PUT /v1/images/{id}/manifest over real HTTP: admin only, the layer
// pinned by the layer image's digest, shown by GET /v1/images/{id};
// field errors name the JSON path.
func TestManifestAPI(t *testing.T) {
	h := newHarness(t)
	base := h.image([]byte("base disk image"))
	gpu := h.image([]byte("gpu layer blob"))
	req := ManifestRequest{KubeadmVersion: "v1.31.2", Layers: []Layer{{Name: "base", When: store.LayerAlways},
		{Name: "gpu", Image: gpu.ID, When: store.LayerNvidiaGPU}}}
	h.want(h.do("PUT", "/v1/images/"+base.ID+"/manifest", viewerTok, req), http.StatusForbidden, "")
	h.want(h.do("PUT", "/v1/images/"+base.ID+"/manifest", operatorTok, req), http.StatusForbidden, "")
	r := h.do("PUT", "/v1/images/"+base.ID+"/manifest", adminTok, req)
	h.want(r, http.StatusOK, "")
	var im Image
	r.into(t, &im)
	if len(im.Layers) != 2 || im.Layers[1].SHA256 != gpu.SHA256 || im.Layers[1].PartName != "kiln-layer-gpu" || im.KubeadmVersion != "v1.31.2" {
		t.Fatalf("manifest answer %+v", im)
	}
	var got Image
	g := h.do("GET", "/v1/images/"+base.ID, viewerTok, nil)
	h.want(g, http.StatusOK, "")
	g.into(t, &got)
	if len(got.Layers) != 2 || got.Layers[0].SHA256 != base.SHA256 {
		t.Fatalf("GET image %+v", got)
	}
	bad := req
	bad.Layers = []Layer{{Name: "base", When: "sometimes"}}
	r = h.do("PUT", "/v1/images/"+gpu.ID+"/manifest", adminTok, bad)
	h.want(r, http.StatusBadRequest, CodeInvalid)
	if r.err().Field != "layers[0]" && r.err().Field != "layers[0].when" {
		t.Fatalf("field %q: %s", r.err().Field, r.body)
	}
	// Another manifest on a release: 409.
	h.want(h.do("PUT", "/v1/images/"+base.ID+"/manifest", adminTok, ManifestRequest{KubeadmVersion: "v1.31.3",
		Layers: []Layer{{Name: "base", When: "always"}}}), http.StatusConflict, "")
}
