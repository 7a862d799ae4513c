package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln/api"
	"kiln/store"
)

// kiln images manifest and the cluster-block flags of machines provision,
// against the real API and domain: the layer pinned by the uploaded
// image's digest, the token read from its file and never printed.
func TestCLIReleaseAndClusterBlock(t *testing.T) {
	e := newCLIEnv(t)
	dir := t.TempDir()
	upload := func(name, data string) store.Image {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		var im store.Image
		if err := json.Unmarshal([]byte(e.admin("images", "upload", p, "--version", "1", "-q", "-o", "json")), &im); err != nil {
			t.Fatal(err)
		}
		return im
	}
	base, gpu := upload("base.img", "base disk"), upload("gpu.img", "gpu layer")
	mf := filepath.Join(dir, "manifest.json")
	if err := os.WriteFile(mf, []byte(`{"kubeadm_version":"v1.31.2","layers":[{"name":"base","when":"always"},
		{"name":"gpu","image":"`+gpu.ID+`","when":"pci:10de/03"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out := e.admin("images", "manifest", base.ID, mf)
	if !strings.Contains(out, "kiln-layer-gpu") || !strings.Contains(out, gpu.SHA256[:12]) {
		t.Fatalf("manifest table:\n%s", out)
	}
	const tok = "9f86d081884c7d659a2feaa0c55ad015"
	tf := filepath.Join(dir, "token")
	if err := os.WriteFile(tf, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := e.machine("r1", 60, store.StateAvailable)
	if _, _, err := e.run("--token", tAdmin, "machines", "provision", m.ID, "--image", base.ID, "--cluster-role", "worker"); err == nil ||
		!strings.Contains(err.Error(), "--cluster-token-file") {
		t.Fatalf("incomplete cluster block: %v", err)
	}
	out = e.admin("machines", "provision", m.ID, "--image", base.ID, "--cluster-role", "worker", "--control-plane-host", "cp.example",
		"--kubernetes-version", "v1.31.2", "--cluster-token-file", tf, "-o", "json")
	var got api.Machine
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Claim == nil || got.Claim.Cluster == nil ||
		got.Claim.Cluster.ControlPlaneHost != "cp.example:6443" || !got.Claim.Cluster.TokenSet || strings.Contains(out, tok) {
		t.Fatalf("provision with a cluster block: %v\n%s", err, out)
	}
	if out := e.admin("machines", "get", m.ID); !strings.Contains(out, "role=worker") || !strings.Contains(out, "token=set") ||
		!strings.Contains(out, "kubernetes=v1.31.2") || strings.Contains(out, tok) {
		t.Fatalf("machines get:\n%s", out)
	}
}
