package store

import (
	"encoding/json"
	"strings"
	"testing"

	"go.etcd.io/bbolt"
)

func imageAt(t *testing.T, db *bbolt.DB, id string) Image {
	t.Helper()
	var im Image
	if err := db.View(func(tx *bbolt.Tx) error {
		return json.Unmarshal(tx.Bucket(bImages).Get([]byte(id)), &im)
	}); err != nil {
		t.Fatal(err)
	}
	return im
}

// put_image_v2 (32) writes the release manifest; put_image (7) keeps the
// stored one, as a node that predates command 32 does, so replicas never
// diverge while a cluster is upgraded.
func TestPutImageV2Manifest(t *testing.T) {
	db := testDB(t)
	w := W{Actor: "test", Reason: "r"}
	layers := []Layer{{Name: BaseLayer, Image: "img-1", SHA256: "aa", Size: 10, When: LayerAlways},
		{Name: "gpu", Image: "img-2", SHA256: "bb", Size: 5, When: LayerNvidiaGPU, PartName: LayerPartPrefix + "gpu"}}
	if _, err := run(t, db, 1, &command{Type: CmdPutImage, W: w, Image: &Image{Meta: Meta{ID: "img-1"}, Name: "os",
		Layers: layers, KubeadmVersion: "v1.31.2"}}); err != nil {
		t.Fatal(err)
	}
	if im := imageAt(t, db, "img-1"); im.IsRelease() || im.KubeadmVersion != "" {
		t.Fatalf("put_image created a manifest: %+v", im)
	}
	if _, err := run(t, db, 2, &command{Type: CmdPutImageV2, W: w, Image: &Image{Meta: Meta{ID: "img-1", ResourceVersion: 1}, Name: "os",
		Layers: layers, KubeadmVersion: "v1.31.2"}}); err != nil {
		t.Fatal(err)
	}
	im := imageAt(t, db, "img-1")
	if len(im.Layers) != 2 || im.Layers[1].PartName != "kiln-layer-gpu" || im.KubeadmVersion != "v1.31.2" {
		t.Fatalf("put_image_v2 did not write the manifest: %+v", im)
	}
	// An older command's update keeps the manifest.
	if _, err := run(t, db, 3, &command{Type: CmdPutImage, W: w, Image: &Image{Meta: Meta{ID: "img-1", ResourceVersion: 2}, Name: "os", Version: "2"}}); err != nil {
		t.Fatal(err)
	}
	if im = imageAt(t, db, "img-1"); im.Version != "2" || len(im.Layers) != 2 || im.KubeadmVersion != "v1.31.2" {
		t.Fatalf("put_image dropped the manifest: %+v", im)
	}
	// put_image_v2 writes what it carries (here: no manifest).
	if _, err := run(t, db, 4, &command{Type: CmdPutImageV2, W: w, Image: &Image{Meta: Meta{ID: "img-1", ResourceVersion: 3}, Name: "os"}}); err != nil {
		t.Fatal(err)
	}
	if im = imageAt(t, db, "img-1"); im.IsRelease() {
		t.Fatalf("put_image_v2 kept a manifest it did not carry: %+v", im)
	}
	if CmdPutImageV2.String() != "put_image_v2" || MaxCommand < CmdPutImageV2 {
		t.Fatalf("command 32: name %q, MaxCommand %d", CmdPutImageV2, MaxCommand)
	}
}

// upgradeCommand writes put_image as put_image_v2 once every node understands it.
func TestUpgradePutImage(t *testing.T) {
	c := &command{Type: CmdPutImage}
	upgradeCommand(c, func(t CommandType) error {
		if t > CmdAgentReportV2 {
			return ErrUnsupportedByCluster
		}
		return nil
	})
	if c.Type != CmdPutImage {
		t.Fatalf("upgraded to %s with a node at 31", c.Type)
	}
	upgradeCommand(c, func(CommandType) error { return nil })
	if c.Type != CmdPutImageV2 {
		t.Fatalf("not upgraded with every node current: %s", c.Type)
	}
}

// The claim's cluster block and the inspection fields (issue 15) are kept
// by the machine commands before 30 and written by 30.
func TestV4KeepsClusterAndInspection(t *testing.T) {
	db := testDB(t)
	w := W{Actor: "test"}
	if _, err := run(t, db, 1, &command{Type: CmdPutImage, W: w, Image: &Image{Meta: Meta{ID: "img-1"}, Name: "os"}}); err != nil {
		t.Fatal(err)
	}
	hw := &Hardware{CPUs: 2, PCI: []PCIDevice{{Address: "0000:01:00.0", VendorID: 0x10de, DeviceID: 0x2204, Class: 0x030000}},
		CPUFlags: []string{"vmx"}, TPM: &TPMInfo{Version: "2.0"}}
	m := Machine{Meta: Meta{ID: "m-1"}, Intended: nic("aa:bb:cc:00:00:09"), Discovered: hw,
		Claim: &Claim{Image: "img-1", Cluster: &ClusterSpec{Role: "worker", KubernetesVersion: "v1.31.2", TokenRef: "cluster/m-1", Token: "never-encoded-token"}}}
	if !m.UsesV4() {
		t.Fatal("a cluster block and inspection fields must use put_machines_v4")
	}
	if _, err := run(t, db, 2, &command{Type: CmdPutMachinesV4, W: w, Machines: []Machine{m}}); err != nil {
		t.Fatal(err)
	}
	got, _ := machineAt(t, db, "m-1")
	if got.Claim.Cluster == nil || got.Claim.Cluster.TokenRef != "cluster/m-1" || got.Claim.Cluster.Token != "" || len(got.Discovered.PCI) != 1 || got.Discovered.TPM == nil {
		t.Fatalf("v4 write: %+v %+v", got.Claim, got.Discovered)
	}
	raw, _ := json.Marshal(got)
	if strings.Contains(string(raw), "never-encoded-token") {
		t.Fatal("the in-memory token reached the record's JSON")
	}
	for i, typ := range []CommandType{CmdPutMachinesV2, CmdPutMachinesV3} {
		up := Machine{Meta: Meta{ID: "m-1", ResourceVersion: got.ResourceVersion}, Intended: m.Intended,
			Discovered: &Hardware{CPUs: 4}, Claim: &Claim{Image: "img-1"}}
		if _, err := run(t, db, uint64(3+i), &command{Type: typ, W: w, Machines: []Machine{up}}); err != nil {
			t.Fatal(err)
		}
		got, _ = machineAt(t, db, "m-1")
		if got.Discovered.CPUs != 4 || len(got.Discovered.PCI) != 1 || len(got.Discovered.CPUFlags) != 1 || got.Claim.Cluster == nil {
			t.Fatalf("%s dropped an issue-15 field: %+v %+v", typ, got.Claim, got.Discovered)
		}
	}
}
