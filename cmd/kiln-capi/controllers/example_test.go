package controllers

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "kiln/cmd/kiln-capi/api/v1alpha1"
)

// The example manifest's Kiln objects (README.md points users at it) are
// accepted by the generated CRDs on the real API server, and a KilnMachine
// without an image is refused by their validation.
func TestExampleManifestValidates(t *testing.T) {
	needAPIServer(t)
	b, err := os.ReadFile(filepath.Join("..", "examples", "cluster.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	created := 0
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if u.GroupVersionKind().Group != infrav1.GroupVersion.Group {
			continue // Cluster API core and kubeadm kinds: not installed here
		}
		u.SetNamespace("default")
		if err := c.Create(context.Background(), u, client.DryRunAll); err != nil {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
		created++
	}
	if created != 3 {
		t.Fatalf("%d Kiln objects in the example, want 3", created)
	}
	bad := &infrav1.KilnMachine{}
	bad.SetNamespace("default")
	bad.SetName("no-image")
	if err := c.Create(context.Background(), bad, client.DryRunAll); err == nil {
		t.Fatal("a KilnMachine without spec.image was accepted")
	}
}
