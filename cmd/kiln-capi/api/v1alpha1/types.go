package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types and reasons (metav1.Condition) the controllers set. Ready
// is the summary Cluster API reads; MachineClaimed and MachineProvisioned
// follow the Kiln machine's claim and build; KilnHealthy mirrors Kiln's
// day-2 view (remediation, RMA, Critical health) so a MachineHealthCheck
// sees that Kiln is already repairing the machine.
const (
	ReadyCondition              = "Ready"
	MachineClaimedCondition     = "MachineClaimed"
	MachineProvisionedCondition = "MachineProvisioned"
	KilnHealthyCondition        = "KilnHealthy"
	KilnReachableCondition      = "KilnReachable"

	ReasonWaitingForBootstrapData = "WaitingForBootstrapData"
	ReasonWaitingForCluster       = "WaitingForClusterInfrastructure"
	ReasonNoMachineAvailable      = "NoMachineAvailable"
	ReasonClaimed                 = "Claimed"
	ReasonProvisioning            = "Provisioning"
	ReasonProvisioned             = "Provisioned"
	ReasonBuildFailed             = "BuildFailed"
	ReasonRemediating             = "Remediating"
	ReasonRMA                     = "RMA"
	ReasonHealthy                 = "Healthy"
	ReasonCritical                = "Critical"
	ReasonReleasing               = "Releasing"
	ReasonReplaced                = "Replaced"
	ReasonClaimLost               = "ClaimLost"
	ReasonAwaitingSpare           = "AwaitingSpare"
	ReasonKilnError               = "KilnError"
	ReasonPaused                  = "Paused"
	ReasonEndpointSet             = "ControlPlaneEndpointSet"
	ReasonEndpointMissing         = "ControlPlaneEndpointMissing"
)

// Finalizers: a KilnMachine keeps its finalizer until Kiln has taken the
// machine back (erasing or available without this claim).
const (
	MachineFinalizer = "kilnmachine.infrastructure.cluster.x-k8s.io"
	ClusterFinalizer = "kilncluster.infrastructure.cluster.x-k8s.io"
)

// Annotations and Kiln claim labels.
const (
	// MachineIDAnnotation on a KilnMachine holds the ID of the Kiln machine
	// it claimed (metadata, so clusterctl move carries it).
	MachineIDAnnotation = "infrastructure.cluster.x-k8s.io/kiln-machine-id"
	// OwnerClaimLabel is the Kiln claim label that names the KilnMachine
	// owning a claim: the hex SHA-256 (first 32 digits) of
	// "namespace/name". It makes a claim idempotent across controller
	// restarts: before claiming, the controller looks for a Kiln machine
	// whose claim carries it.
	OwnerClaimLabel = "capi.kiln.dev/owner"
	// ClusterClaimLabel is the Kiln claim label naming the Cluster API
	// cluster (its name) a machine was claimed for.
	ClusterClaimLabel = "capi.kiln.dev/cluster"
)

// APIEndpoint is a control plane endpoint (the Cluster API contract's
// host and port; port 0 means 6443).
type APIEndpoint struct {
	Host string `json:"host,omitempty"`
	// +kubebuilder:default=6443
	// +optional
	Port int32 `json:"port,omitempty"`
}

// IsZero reports whether no host is set.
func (e APIEndpoint) IsZero() bool { return e.Host == "" }

// SecretKeyRef names one key of a Secret in the object's namespace.
type SecretKeyRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Key in the Secret's data; default "token".
	// +optional
	Key string `json:"key,omitempty"`
}

// KilnEndpoint is the Kiln site a cluster's machines come from.
type KilnEndpoint struct {
	// Server is Kiln's REST API base URL (http://HOST:PORT or https://…),
	// any node of the site.
	// +kubebuilder:validation:Pattern=`^https?://`
	Server string `json:"server"`
	// TokenSecretRef is the Secret holding a Kiln API token with the
	// operator role (kiln token create --role operator).
	TokenSecretRef SecretKeyRef `json:"tokenSecretRef"`
	// CASecretRef, when set, is a Secret whose key (default "ca.crt")
	// holds the PEM CA bundle that signs Kiln's API certificate.
	// +optional
	CASecretRef *SecretKeyRef `json:"caSecretRef,omitempty"`
}

// KilnClusterSpec is the InfraCluster spec.
type KilnClusterSpec struct {
	// Kiln is the site serving this cluster's machines.
	Kiln KilnEndpoint `json:"kiln"`
	// ControlPlaneEndpoint is the cluster's API endpoint (a VIP or load
	// balancer the operator provides, as with Metal3).
	// +optional
	ControlPlaneEndpoint APIEndpoint `json:"controlPlaneEndpoint,omitempty"`
}

// Initialization is the contract v1beta2 status.initialization.
type Initialization struct {
	// Provisioned is true once the infrastructure is ready (contract v1beta2).
	// +optional
	Provisioned *bool `json:"provisioned,omitempty"`
}

// FailureDomain is a contract v1beta2 failure domain: a Kiln rack.
type FailureDomain struct {
	Name         string `json:"name"`
	ControlPlane *bool  `json:"controlPlane,omitempty"`
	// +optional
	Attributes map[string]string `json:"attributes,omitempty"`
}

// KilnClusterStatus is the InfraCluster status.
type KilnClusterStatus struct {
	// +optional
	Initialization Initialization `json:"initialization,omitempty"`
	// Ready is the contract v1beta1 field (same meaning as
	// initialization.provisioned).
	// +optional
	Ready bool `json:"ready"`
	// FailureDomains are the Kiln site's racks.
	// +optional
	// +listType=map
	// +listMapKey=name
	FailureDomains []FailureDomain `json:"failureDomains,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// KilnCluster is the Cluster API InfraCluster of a cluster whose machines
// Kiln provisions.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=cluster-api
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
// +kubebuilder:printcolumn:name="Endpoint",type="string",JSONPath=".spec.controlPlaneEndpoint.host"
// +kubebuilder:printcolumn:name="Provisioned",type="boolean",JSONPath=".status.initialization.provisioned"
// +kubebuilder:printcolumn:name="Kiln",type="string",JSONPath=".spec.kiln.server"
type KilnCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   KilnClusterSpec   `json:"spec,omitempty"`
	Status KilnClusterStatus `json:"status,omitempty"`
}

// KilnClusterList is a list of KilnCluster.
//
// +kubebuilder:object:root=true
type KilnClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KilnCluster `json:"items"`
}

// KilnMachineSpec is the InfraMachine spec: which Kiln machine to claim and
// what to build on it.
type KilnMachineSpec struct {
	// ProviderID is kiln://MACHINE-ID once the machine is provisioned
	// (contract: set by the provider).
	// +optional
	ProviderID string `json:"providerID,omitempty"`
	// Image is the Kiln image ID to provision (a plain image or a release;
	// kiln image list).
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`
	// Role is the Kiln claim role (default "kubernetes").
	// +optional
	Role string `json:"role,omitempty"`
	// Selector picks the Kiln machines this one may claim: every label
	// must match the Kiln machine's labels (its hardware class, for
	// example class=gpu-a). A spare Kiln takes to replace the machine
	// matches it too.
	// +optional
	Selector map[string]string `json:"selector,omitempty"`
	// SSHKeys are authorized keys staged with the bootstrap data.
	// +optional
	SSHKeys []string `json:"sshKeys,omitempty"`
	// RackSpread is the placement policy over Kiln racks. None (default):
	// Kiln picks among the matching machines. Spread: the machine comes
	// from the rack holding the fewest machines of this cluster (then
	// rack ID order), so a MachineDeployment's workers spread over racks
	// as KubeadmControlPlane spreads over failure domains. Either way a
	// Machine with spec.failureDomain (a rack ID of the KilnCluster's
	// failureDomains) gets a machine of that rack.
	// +kubebuilder:validation:Enum=None;Spread
	// +optional
	RackSpread string `json:"rackSpread,omitempty"`
}

// Rack spread policies (KilnMachineSpec.RackSpread).
const (
	RackSpreadNone   = "None"
	RackSpreadSpread = "Spread"
)

// MachineAddress is a contract address of a machine.
type MachineAddress struct {
	// Type is Hostname, InternalIP, ExternalIP, InternalDNS or ExternalDNS.
	Type    string `json:"type"`
	Address string `json:"address"`
}

// KilnMachineStatus is the InfraMachine status.
type KilnMachineStatus struct {
	// +optional
	Initialization Initialization `json:"initialization,omitempty"`
	// Ready is the contract v1beta1 field.
	// +optional
	Ready bool `json:"ready"`
	// Addresses of the provisioned machine.
	// +optional
	Addresses []MachineAddress `json:"addresses,omitempty"`
	// MachineID is the claimed Kiln machine's ID (also in the
	// kiln-machine-id annotation).
	// +optional
	MachineID string `json:"machineID,omitempty"`
	// State is the Kiln machine's lifecycle state (available,
	// provisioning, provisioned, failed, remediating, rma, erasing…).
	// +optional
	State string `json:"state,omitempty"`
	// Step is the build's last step report, "STEP STATE" (for example
	// "write running 40%").
	// +optional
	Step string `json:"step,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// KilnMachine is the Cluster API InfraMachine: one Kiln machine claimed and
// built for one Cluster API Machine.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=cluster-api
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
// +kubebuilder:printcolumn:name="Kiln machine",type="string",JSONPath=".status.machineID"
// +kubebuilder:printcolumn:name="State",type="string",JSONPath=".status.state"
// +kubebuilder:printcolumn:name="Step",type="string",JSONPath=".status.step"
// +kubebuilder:printcolumn:name="ProviderID",type="string",JSONPath=".spec.providerID"
type KilnMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   KilnMachineSpec   `json:"spec,omitempty"`
	Status KilnMachineStatus `json:"status,omitempty"`
}

// KilnMachineList is a list of KilnMachine.
//
// +kubebuilder:object:root=true
type KilnMachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KilnMachine `json:"items"`
}

// KilnMachineTemplateResource is the template's body.
type KilnMachineTemplateResource struct {
	// +optional
	ObjectMeta metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec       KilnMachineSpec   `json:"spec"`
}

// KilnMachineTemplateSpec is the InfraMachineTemplate spec.
type KilnMachineTemplateSpec struct {
	Template KilnMachineTemplateResource `json:"template"`
}

// KilnMachineTemplate is the Cluster API InfraMachineTemplate a
// MachineDeployment or KubeadmControlPlane stamps KilnMachines from.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:categories=cluster-api
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
type KilnMachineTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec KilnMachineTemplateSpec `json:"spec,omitempty"`
}

// KilnMachineTemplateList is a list of KilnMachineTemplate.
//
// +kubebuilder:object:root=true
type KilnMachineTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []KilnMachineTemplate `json:"items"`
}

func init() {
	SchemeBuilder.Register(&KilnCluster{}, &KilnClusterList{}, &KilnMachine{}, &KilnMachineList{},
		&KilnMachineTemplate{}, &KilnMachineTemplateList{})
}
