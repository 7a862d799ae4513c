package controllers

import (
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// RBAC of the manager (controller-gen rbac writes config/rbac/role.yaml):
//
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=kilnclusters;kilnmachines,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=kilnclusters/status;kilnmachines/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=kilnmachinetemplates,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters;machines,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete

// Setup registers both controllers with mgr, sharing one Kiln client
// cache; poll is KilnMachineReconciler.Poll.
func Setup(mgr ctrl.Manager, poll time.Duration) error {
	kilns := &Kilns{}
	if err := (&KilnClusterReconciler{Client: mgr.GetClient(), Kilns: kilns}).SetupWithManager(mgr); err != nil {
		return err
	}
	return (&KilnMachineReconciler{Client: mgr.GetClient(), Kilns: kilns, Poll: poll}).SetupWithManager(mgr)
}
