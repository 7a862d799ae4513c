// Package v1alpha1 holds Kiln's Cluster API infrastructure types (group
// infrastructure.cluster.x-k8s.io, version v1alpha1): KilnCluster,
// KilnMachine and KilnMachineTemplate. They follow the Cluster API
// contract v1beta2 (InfraCluster, InfraMachine, InfraMachineTemplate:
// status.initialization.provisioned, spec.providerID, status.addresses,
// metav1.Condition conditions) and keep the v1beta1 status.ready field
// beside it. The CRDs in config/crd are generated from these types by
// controller-gen (make capi-gen).
//
// +kubebuilder:object:generate=true
// +groupName=infrastructure.cluster.x-k8s.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is infrastructure.cluster.x-k8s.io/v1alpha1.
	GroupVersion = schema.GroupVersion{Group: "infrastructure.cluster.x-k8s.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this group-version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
