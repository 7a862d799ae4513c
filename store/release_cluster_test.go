package store_test

import (
	"errors"
	"testing"
	"time"

	"kiln/store"
	"kiln/store/storetest"
)

// A release manifest (put_image_v2, 32) is refused while a voter predates
// it, and every replica keeps it once written; a plain image is still
// written meanwhile (as put_image, 7). Runtime ≈ 2 s (a 3-node cluster).
func TestPutImageV2Gate(t *testing.T) {
	c := storetest.NewCluster(t, 3)
	for _, nd := range c.Nodes {
		waitVersion(t, c, nd.ID, store.MaxCommand)
	}
	li := c.Leader()
	old := (li + 1) % 3
	c.Nodes[old].Store.ClaimMaxCommand(store.CmdAgentReportV2)
	waitVersion(t, c, c.Nodes[old].ID, store.CmdAgentReportV2)
	ctx := ctxT(t)
	st := c.Nodes[li].Store
	im, err := st.PutImage(ctx, store.Image{Name: "os", Version: "1", Format: "raw", SHA256: "ab", Size: 1}, store.W{Actor: "test"})
	if err != nil {
		t.Fatalf("plain image with a voter at 31: %v", err)
	}
	rel := im
	rel.Layers = []store.Layer{{Name: store.BaseLayer, Image: im.ID, SHA256: "ab", Size: 1, When: store.LayerAlways}}
	rel.KubeadmVersion = "v1.31.2"
	if _, err := st.PutImage(ctx, rel, store.W{Actor: "test"}); !errors.Is(err, store.ErrUnsupportedByCluster) {
		t.Fatalf("manifest with a voter at 31: %v, want ErrUnsupportedByCluster", err)
	}
	c.Nodes[old].Store.ClaimMaxCommand(0)
	waitVersion(t, c, c.Nodes[old].ID, store.MaxCommand)
	if _, err := st.PutImage(ctx, rel, store.W{Actor: "test"}); err != nil {
		t.Fatalf("manifest with every voter current: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, nd := range c.Nodes {
		for {
			got, err := nd.Store.GetImage(im.ID)
			if err == nil && got.IsRelease() && got.KubeadmVersion == "v1.31.2" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: image %+v (%v)", nd.ID, got, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
