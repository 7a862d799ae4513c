// Package controllers holds the Cluster API infrastructure controllers for
// Kiln: KilnClusterReconciler and KilnMachineReconciler. They read the
// Cluster API core objects (Cluster, Machine of cluster.x-k8s.io) as
// unstructured objects, by the contract's field paths, so the provider
// does not pin a Cluster API release, and they talk to Kiln only through
// its REST API (kiln/api/client).
package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The Cluster API core group and the names of the contract (Cluster API
// book, "Provider contracts": InfraCluster, InfraMachine).
const (
	CAPIGroup          = "cluster.x-k8s.io"
	ClusterNameLabel   = "cluster.x-k8s.io/cluster-name"
	ControlPlaneLabel  = "cluster.x-k8s.io/control-plane"
	PausedAnnotation   = "cluster.x-k8s.io/paused"
	bootstrapValueKey  = "value"
	bootstrapFormatKey = "format"
)

// CAPIVersion is the Cluster API core version the controllers read
// (contract v1beta2; a v1beta1 Machine has the same fields used here).
var CAPIVersion = "v1beta2"

func capiGVK(kind string) schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: CAPIGroup, Version: CAPIVersion, Kind: kind}
}

func newCAPI(kind string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(capiGVK(kind))
	return u
}

// ownerOfKind returns the name of obj's owner reference of group CAPIGroup
// and the given kind ("" when there is none).
func ownerOfKind(obj metav1.Object, kind string) string {
	for _, r := range obj.GetOwnerReferences() {
		gv, err := schema.ParseGroupVersion(r.APIVersion)
		if err == nil && gv.Group == CAPIGroup && r.Kind == kind {
			return r.Name
		}
	}
	return ""
}

// getCAPI reads the Cluster API object kind/name in ns (nil, nil when absent).
func getCAPI(ctx context.Context, c client.Client, kind, ns, name string) (*unstructured.Unstructured, error) {
	u := newCAPI(kind)
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, u); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return nil, nil
		}
		return nil, err
	}
	return u, nil
}

func str(u *unstructured.Unstructured, path ...string) string {
	if u == nil {
		return ""
	}
	s, _, _ := unstructured.NestedString(u.Object, path...)
	return s
}

func boolean(u *unstructured.Unstructured, path ...string) bool {
	if u == nil {
		return false
	}
	b, _, _ := unstructured.NestedBool(u.Object, path...)
	return b
}

// paused reports the contract's pause: the Cluster's spec.paused or the
// cluster.x-k8s.io/paused annotation on the Cluster or on the object.
func paused(cluster *unstructured.Unstructured, obj metav1.Object) bool {
	if _, ok := obj.GetAnnotations()[PausedAnnotation]; ok {
		return true
	}
	if cluster == nil {
		return false
	}
	if _, ok := cluster.GetAnnotations()[PausedAnnotation]; ok {
		return true
	}
	return boolean(cluster, "spec", "paused")
}

// ownerKey is the value of the OwnerClaimLabel for a KilnMachine: the
// first 32 hex digits of SHA-256("namespace/name"). Namespace and name
// survive clusterctl move (the UID does not).
func ownerKey(ns, name string) string {
	s := sha256.Sum256([]byte(ns + "/" + name))
	return hex.EncodeToString(s[:16])
}

// ProviderIDPrefix starts every providerID Kiln's provider sets.
const ProviderIDPrefix = "kiln://"

// ProviderID is the providerID of Kiln machine id.
func ProviderID(id string) string { return ProviderIDPrefix + id }

// MachineIDFromProviderID is the Kiln machine ID of a providerID, or an
// error when it is not kiln://ID.
func MachineIDFromProviderID(p string) (string, error) {
	id, ok := strings.CutPrefix(p, ProviderIDPrefix)
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", fmt.Errorf("providerID %q: want %sMACHINE-ID", p, ProviderIDPrefix)
	}
	return id, nil
}
