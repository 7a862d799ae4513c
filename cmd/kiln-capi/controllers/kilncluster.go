package controllers

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	infrav1 "kiln/cmd/kiln-capi/api/v1alpha1"
)

// KilnClusterReconciler reconciles KilnClusters (the InfraCluster contract
// v1beta2): it checks that the Kiln site answers with the cluster's
// credentials, lists the site's racks as failure domains, and marks the
// infrastructure provisioned once the control plane endpoint is set (the
// endpoint is the operator's VIP or load balancer, as with Metal3).
type KilnClusterReconciler struct {
	client.Client
	Kilns *Kilns
	// Resync is how often a provisioned KilnCluster is looked at again
	// (default 5 min).
	Resync time.Duration
}

// SetupWithManager registers the controller.
func (r *KilnClusterReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).For(&infrav1.KilnCluster{}).
		Watches(newCAPI("Cluster"), handler.EnqueueRequestsFromMapFunc(clusterToKilnCluster)).
		Named("kilncluster").Complete(r)
}

// clusterToKilnCluster maps a Cluster to its spec.infrastructureRef when
// that is a KilnCluster (a pause or unpause must reach it).
func clusterToKilnCluster(_ context.Context, o client.Object) []reconcile.Request {
	u, ok := o.(*unstructured.Unstructured)
	if !ok || str(u, "spec", "infrastructureRef", "kind") != "KilnCluster" || str(u, "spec", "infrastructureRef", "name") == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: str(u, "spec", "infrastructureRef", "name")}}}
}

// Reconcile brings one KilnCluster's status up to date.
func (r *KilnClusterReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	kc := &infrav1.KilnCluster{}
	if err := r.Get(ctx, req.NamespacedName, kc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var cluster = newCAPI("Cluster")
	if name := ownerOfKind(kc, "Cluster"); name != "" {
		c, err := getCAPI(ctx, r.Client, "Cluster", kc.Namespace, name)
		if err != nil {
			return ctrl.Result{}, err
		}
		cluster = c
	}
	if paused(cluster, kc) {
		return ctrl.Result{}, nil
	}
	before := kc.DeepCopy()
	if !kc.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, kc)
	}
	if controllerutil.AddFinalizer(kc, infrav1.ClusterFinalizer) {
		if err := r.Patch(ctx, kc, client.MergeFrom(before)); err != nil {
			return ctrl.Result{}, err
		}
		before = kc.DeepCopy()
	}
	resync := r.Resync
	if resync <= 0 {
		resync = 5 * time.Minute
	}
	res := ctrl.Result{RequeueAfter: resync}
	kiln, err := r.Kilns.For(ctx, r.Client, kc)
	if err == nil {
		var racks []string
		rs, lerr := kiln.ListRacks(ctx, "")
		err = lerr
		for _, rk := range rs {
			racks = append(racks, rk.ID)
		}
		if err == nil {
			kc.Status.FailureDomains = nil
			for i, id := range racks {
				t := true
				kc.Status.FailureDomains = append(kc.Status.FailureDomains, infrav1.FailureDomain{Name: id, ControlPlane: &t,
					Attributes: map[string]string{"rack": rs[i].Name}})
			}
		}
	}
	if err != nil {
		clusterCond(kc, infrav1.KilnReachableCondition, false, infrav1.ReasonKilnError, err.Error())
		res.RequeueAfter = 10 * time.Second
	} else {
		clusterCond(kc, infrav1.KilnReachableCondition, true, "Reachable", "")
	}
	switch {
	case kc.Spec.ControlPlaneEndpoint.IsZero():
		clusterCond(kc, infrav1.ReadyCondition, false, infrav1.ReasonEndpointMissing, "spec.controlPlaneEndpoint.host is not set")
	case err != nil:
		clusterCond(kc, infrav1.ReadyCondition, false, infrav1.ReasonKilnError, err.Error())
	default:
		t := true
		kc.Status.Initialization.Provisioned = &t
		kc.Status.Ready = true
		clusterCond(kc, infrav1.ReadyCondition, true, infrav1.ReasonEndpointSet, "")
	}
	if err := r.Status().Patch(ctx, kc, client.MergeFrom(before)); err != nil {
		return ctrl.Result{}, err
	}
	return res, nil
}

// reconcileDelete keeps the KilnCluster (and so the Kiln endpoint its
// KilnMachines release through) until no KilnMachine of its cluster is
// left: a namespace deletion or `kubectl delete -f` of a whole cluster
// removes them together.
func (r *KilnClusterReconciler) reconcileDelete(ctx context.Context, kc *infrav1.KilnCluster) (ctrl.Result, error) {
	name := kc.Labels[ClusterNameLabel]
	if name == "" {
		name = ownerOfKind(kc, "Cluster")
	}
	if name != "" {
		var l infrav1.KilnMachineList
		if err := r.List(ctx, &l, client.InNamespace(kc.Namespace), client.MatchingLabels{ClusterNameLabel: name}); err != nil {
			return ctrl.Result{}, err
		}
		if len(l.Items) > 0 {
			before := kc.DeepCopy()
			clusterCond(kc, infrav1.ReadyCondition, false, infrav1.ReasonReleasing,
				fmt.Sprintf("waiting for %d KilnMachines of cluster %s to release their Kiln machines", len(l.Items), name))
			if err := r.Status().Patch(ctx, kc, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
				return ctrl.Result{}, err
			}
			return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
		}
	}
	before := kc.DeepCopy()
	controllerutil.RemoveFinalizer(kc, infrav1.ClusterFinalizer)
	return ctrl.Result{}, client.IgnoreNotFound(r.Patch(ctx, kc, client.MergeFrom(before)))
}

func clusterCond(kc *infrav1.KilnCluster, typ string, ok bool, reason, msg string) {
	setCondition(&kc.Status.Conditions, kc.Generation, typ, ok, reason, msg)
}
