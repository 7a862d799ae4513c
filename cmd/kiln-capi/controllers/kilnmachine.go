package controllers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"kiln/api"
	kclient "kiln/api/client"

	infrav1 "kiln/cmd/kiln-capi/api/v1alpha1"
)

// DefaultRole is the Kiln claim role of a KilnMachine without one.
const DefaultRole = "kubernetes"

// KilnMachineReconciler reconciles KilnMachines (the Cluster API
// InfraMachine contract v1beta2):
//
//  1. It waits for the owner Machine, the Cluster's infrastructure
//     (KilnCluster provisioned) and the Machine's bootstrap data Secret
//     (spec.bootstrap.dataSecretName, key "value", format cloud-config).
//  2. It claims one available Kiln machine (POST /v1/machines/claim) with
//     the KilnMachine's selector, image and the bootstrap data as the
//     claim's user-data, labelled with OwnerClaimLabel; the Kiln machine
//     ID goes to the MachineIDAnnotation at once. A claim is looked up by
//     that label before any new claim, so a restart between Kiln's answer
//     and the annotation write claims nothing twice.
//  3. It follows the build (state and last step report) into conditions,
//     and on Kiln's provisioned sets spec.providerID (kiln://ID),
//     status.addresses and status.initialization.provisioned (v1beta1:
//     status.ready).
//  4. Kiln's remediation and RMA of the machine show as KilnHealthy=False.
//  5. Deletion releases the machine to Kiln (POST …/release: Kiln erases
//     it); the finalizer stays until Kiln has dropped the claim.
//
// The cluster.x-k8s.io/paused annotation and Cluster.spec.paused stop all
// of it.
type KilnMachineReconciler struct {
	client.Client
	Kilns *Kilns
	// Poll is how often a machine still building is looked at again
	// (default 10 s); a provisioned one every 10 Poll.
	Poll time.Duration
}

// SetupWithManager registers the controller, watching KilnMachines and the
// Cluster API Machines that own them.
func (r *KilnMachineReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&infrav1.KilnMachine{}).
		Watches(newCAPI("Machine"), handler.EnqueueRequestsFromMapFunc(machineToKilnMachine)).
		Watches(newCAPI("Cluster"), handler.EnqueueRequestsFromMapFunc(r.clusterToKilnMachines)).
		Named("kilnmachine").
		Complete(r)
}

// machineToKilnMachine maps a Machine to its spec.infrastructureRef when
// that is a KilnMachine.
func machineToKilnMachine(_ context.Context, o client.Object) []reconcile.Request {
	u, ok := o.(interface{ UnstructuredContent() map[string]any })
	if !ok {
		return nil
	}
	ref, _ := u.UnstructuredContent()["spec"].(map[string]any)
	ref, _ = ref["infrastructureRef"].(map[string]any)
	if kind, _ := ref["kind"].(string); kind != "KilnMachine" {
		return nil
	}
	name, _ := ref["name"].(string)
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}

// clusterToKilnMachines maps a Cluster (paused, unpaused, its
// infrastructure ready) to every KilnMachine labelled with its name.
func (r *KilnMachineReconciler) clusterToKilnMachines(ctx context.Context, o client.Object) []reconcile.Request {
	var l infrav1.KilnMachineList
	if err := r.List(ctx, &l, client.InNamespace(o.GetNamespace()), client.MatchingLabels{ClusterNameLabel: o.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "list KilnMachines of cluster", "cluster", o.GetName())
		return nil
	}
	out := make([]reconcile.Request, 0, len(l.Items))
	for _, km := range l.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: km.Namespace, Name: km.Name}})
	}
	return out
}

func (r *KilnMachineReconciler) poll() time.Duration {
	if r.Poll > 0 {
		return r.Poll
	}
	return 10 * time.Second
}

// Reconcile brings one KilnMachine one step closer to its Kiln machine.
func (r *KilnMachineReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	logger := log.FromContext(ctx)
	km := &infrav1.KilnMachine{}
	if err := r.Get(ctx, req.NamespacedName, km); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	deleting := !km.DeletionTimestamp.IsZero()
	machineName := ownerOfKind(km, "Machine")
	if machineName == "" && !deleting {
		logger.Info("waiting for the Machine owner reference")
		return ctrl.Result{}, nil
	}
	var machine *unstructured.Unstructured
	if machineName != "" {
		var err error
		if machine, err = getCAPI(ctx, r.Client, "Machine", km.Namespace, machineName); err != nil {
			return ctrl.Result{}, err
		}
	}
	if machine == nil && !deleting {
		return ctrl.Result{}, nil // the Machine's creation requeues
	}
	clusterName := km.Labels[ClusterNameLabel]
	if clusterName == "" {
		clusterName = str(machine, "spec", "clusterName")
	}
	cluster, err := getCAPI(ctx, r.Client, "Cluster", km.Namespace, clusterName)
	if err != nil {
		return ctrl.Result{}, err
	}
	if paused(cluster, km) {
		logger.Info("paused")
		return ctrl.Result{}, nil
	}
	if cluster == nil && !deleting {
		return ctrl.Result{RequeueAfter: r.poll()}, nil
	}
	var kc *infrav1.KilnCluster
	if cluster != nil {
		kcName := str(cluster, "spec", "infrastructureRef", "name")
		if kcName == "" || str(cluster, "spec", "infrastructureRef", "kind") != "KilnCluster" {
			return ctrl.Result{}, fmt.Errorf("cluster %s: spec.infrastructureRef is not a KilnCluster", clusterName)
		}
		kc = &infrav1.KilnCluster{}
		if err := r.Get(ctx, types.NamespacedName{Namespace: km.Namespace, Name: kcName}, kc); err != nil {
			if !deleting || !apierrors.IsNotFound(err) {
				return ctrl.Result{}, err
			}
			kc = nil
		}
	}

	before := km.DeepCopy()
	defer func() {
		if err := r.patchStatus(ctx, before, km); err != nil && retErr == nil {
			retErr = err
		}
	}()

	var kiln *kclient.Client
	err = fmt.Errorf("the Cluster %s or its KilnCluster is gone", clusterName)
	if kc != nil {
		kiln, err = r.Kilns.For(ctx, r.Client, kc)
	}
	if err == nil {
		r.Kilns.remember(km.Namespace, clusterName, kiln)
	} else if deleting {
		// Deleted with its cluster (a namespace deletion takes the token
		// Secret at once): the last client that worked still releases.
		kiln = r.Kilns.last(km.Namespace, clusterName)
	}
	if kiln == nil {
		why := err.Error()
		if deleting {
			why = "cannot release the Kiln machine: " + why + "; restore the KilnCluster and its token Secret, or remove the finalizer by hand after releasing it in Kiln"
		}
		setCond(km, infrav1.KilnReachableCondition, false, infrav1.ReasonKilnError, why)
		return ctrl.Result{RequeueAfter: r.poll()}, nil
	}
	if deleting {
		return r.reconcileDelete(ctx, kiln, km)
	}
	if controllerutil.AddFinalizer(km, infrav1.MachineFinalizer) {
		if err := r.patchMeta(ctx, before, km); err != nil {
			return ctrl.Result{}, err
		}
	}
	return r.reconcileNormal(ctx, kiln, km, machine, kc, clusterName)
}

func (r *KilnMachineReconciler) reconcileNormal(ctx context.Context, kiln *kclient.Client, km *infrav1.KilnMachine,
	machine *unstructured.Unstructured, kc *infrav1.KilnCluster, clusterName string) (ctrl.Result, error) {
	key := ownerKey(km.Namespace, km.Name)
	id := km.Annotations[infrav1.MachineIDAnnotation]
	if id == "" {
		found, err := findClaimed(ctx, kiln, key)
		if err != nil {
			setCond(km, infrav1.KilnReachableCondition, false, infrav1.ReasonKilnError, err.Error())
			return ctrl.Result{RequeueAfter: r.poll()}, nil
		}
		if found != nil {
			id = found.ID
			if err := r.recordID(ctx, km, id); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	if id == "" {
		if !kc.Status.Ready {
			setCond(km, infrav1.ReadyCondition, false, infrav1.ReasonWaitingForCluster, "KilnCluster "+kc.Name+" is not provisioned yet")
			return ctrl.Result{RequeueAfter: r.poll()}, nil
		}
		secretName := str(machine, "spec", "bootstrap", "dataSecretName")
		if secretName == "" {
			setCond(km, infrav1.ReadyCondition, false, infrav1.ReasonWaitingForBootstrapData, "Machine "+machine.GetName()+" has no bootstrap data yet")
			return ctrl.Result{}, nil // the Machine's update requeues
		}
		userData, err := bootstrapData(ctx, r.Client, km.Namespace, secretName)
		if err != nil {
			setCond(km, infrav1.ReadyCondition, false, infrav1.ReasonWaitingForBootstrapData, err.Error())
			return ctrl.Result{RequeueAfter: r.poll()}, nil
		}
		role := km.Spec.Role
		if role == "" {
			role = DefaultRole
		}
		claim := api.Claim{Image: km.Spec.Image, Role: role, Hostname: machine.GetName(), UserData: userData, SSHKeys: km.Spec.SSHKeys,
			Labels: map[string]string{infrav1.OwnerClaimLabel: key, infrav1.ClusterClaimLabel: clusterName}}
		reason := fmt.Sprintf("cluster api: KilnMachine %s/%s of cluster %s", km.Namespace, km.Name, clusterName)
		fd := str(machine, "spec", "failureDomain")
		var ms []api.Machine
		if fd != "" || km.Spec.RackSpread == infrav1.RackSpreadSpread {
			var pick string
			if pick, err = pickMachine(ctx, kiln, km.Spec.Selector, fd, clusterName, km.Spec.RackSpread == infrav1.RackSpreadSpread); err == nil {
				var m api.Machine
				if m, err = kiln.Provision(ctx, pick, api.ProvisionRequest{Claim: claim, Reason: reason}); err == nil {
					ms = []api.Machine{m}
				} else if c := kilnCode(err); c == "conflict" || c == "illegal_transition" || c == "wrong_state" {
					// Taken since the list: pick again at once.
					return ctrl.Result{Requeue: true}, nil
				}
			}
		} else {
			ms, err = kiln.Claim(ctx, api.ClaimRequest{Role: role, Labels: km.Spec.Selector, Count: 1, Reason: reason, Claim: claim})
		}
		switch {
		case kilnCode(err) == "not_enough_machines":
			notClaimed(km, infrav1.ReasonNoMachineAvailable, errMessage(err))
			return ctrl.Result{RequeueAfter: 3 * r.poll()}, nil
		case err != nil && kilnStatus(err) >= 400 && kilnStatus(err) < 500:
			// The claim itself is refused (an image not uploaded yet, a
			// token without the operator role, a bad selector): say so and
			// try again later, as the cause may be fixed outside this spec.
			notClaimed(km, infrav1.ReasonKilnError, errMessage(err))
			return ctrl.Result{RequeueAfter: 6 * r.poll()}, nil
		case err != nil:
			setCond(km, infrav1.KilnReachableCondition, false, infrav1.ReasonKilnError, err.Error())
			return ctrl.Result{RequeueAfter: r.poll()}, nil
		case len(ms) != 1:
			return ctrl.Result{}, fmt.Errorf("kiln claim answered %d machines, want 1", len(ms))
		}
		id = ms[0].ID
		if err := r.recordID(ctx, km, id); err != nil {
			// The claim is in Kiln with our label: the next reconcile finds it.
			return ctrl.Result{}, err
		}
	}
	m, err := kiln.GetMachine(ctx, id)
	if err != nil {
		setCond(km, infrav1.KilnReachableCondition, false, infrav1.ReasonKilnError, err.Error())
		return ctrl.Result{RequeueAfter: r.poll()}, nil
	}
	setCond(km, infrav1.KilnReachableCondition, true, "Reachable", "")
	if !ownedBy(m, key) {
		return r.claimMoved(ctx, kiln, km, m, key)
	}
	setCond(km, infrav1.MachineClaimedCondition, true, infrav1.ReasonClaimed, "Kiln machine "+id)
	if m.State == "provisioned" && m.IPv4 == "" {
		m.IPv4 = provisioningIP(ctx, kiln, m, km.Status.Addresses)
	}
	r.follow(km, m)
	if isTrue(km.Status.Initialization.Provisioned) {
		return ctrl.Result{RequeueAfter: 10 * r.poll()}, nil
	}
	return ctrl.Result{RequeueAfter: r.poll()}, nil
}

// claimMoved handles a Kiln machine that no longer holds km's claim. When
// Kiln's remediation handed the claim to a spare (the spare's claim says
// Replaces), a KilnMachine not yet provisioned adopts the spare; a
// provisioned one keeps its providerID (Cluster API never changes it) and
// turns Ready False with reason Replaced, so a MachineHealthCheck on the
// Machine's InfrastructureReady replaces the Machine, and deleting the
// KilnMachine then releases the spare. A claim released outside Cluster
// API is ClaimLost.
func (r *KilnMachineReconciler) claimMoved(ctx context.Context, kiln *kclient.Client, km *infrav1.KilnMachine, m api.Machine, key string) (ctrl.Result, error) {
	km.Status.State = string(m.State)
	spare, err := findClaimed(ctx, kiln, key)
	if err != nil {
		setCond(km, infrav1.KilnReachableCondition, false, infrav1.ReasonKilnError, err.Error())
		return ctrl.Result{RequeueAfter: r.poll()}, nil
	}
	switch {
	case spare != nil && km.Spec.ProviderID == "":
		if err := r.recordID(ctx, km, spare.ID); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{Requeue: true}, nil
	case spare != nil:
		msg := fmt.Sprintf("Kiln replaced machine %s (%s) with spare %s (%s); this Machine must be replaced", m.ID, m.State, spare.ID, spare.State)
		notClaimed(km, infrav1.ReasonReplaced, msg)
		r.health(km, m)
	case m.Remediation != nil && m.Remediation.Claim != nil && m.Remediation.Claim.Labels[infrav1.OwnerClaimLabel] == key:
		// Declared failed with no spare free yet: Kiln keeps the claim for
		// the next spare that matches.
		msg := fmt.Sprintf("Kiln declared machine %s failed (%s); the claim waits for a spare", m.ID, m.State)
		notClaimed(km, infrav1.ReasonAwaitingSpare, msg)
		r.health(km, m)
	default:
		msg := fmt.Sprintf("Kiln machine %s no longer holds this KilnMachine's claim (state %s): released outside Cluster API", m.ID, m.State)
		notClaimed(km, infrav1.ReasonClaimLost, msg)
	}
	return ctrl.Result{RequeueAfter: 3 * r.poll()}, nil
}

// follow copies the Kiln machine's state into km's status and conditions.
func (r *KilnMachineReconciler) follow(km *infrav1.KilnMachine, m api.Machine) {
	km.Status.MachineID = m.ID
	km.Status.State = string(m.State)
	km.Status.Step = ""
	if m.Step != nil {
		km.Status.Step = m.Step.Step + " " + m.Step.State
		if m.Step.Progress > 0 && m.Step.Progress < 1 {
			km.Status.Step += fmt.Sprintf(" %.0f%%", 100*m.Step.Progress)
		}
	}
	msg := m.Message
	switch m.State {
	case "provisioned":
		km.Spec.ProviderID = ProviderID(m.ID)
		km.Status.Addresses = addresses(m)
		t := true
		km.Status.Initialization.Provisioned = &t
		km.Status.Ready = true
		setCond(km, infrav1.MachineProvisionedCondition, true, infrav1.ReasonProvisioned, msg)
		setCond(km, infrav1.ReadyCondition, true, infrav1.ReasonProvisioned, "")
	case "failed":
		setCond(km, infrav1.MachineProvisionedCondition, false, infrav1.ReasonBuildFailed, m.Reason+": "+msg)
		if !isTrue(km.Status.Initialization.Provisioned) {
			setCond(km, infrav1.ReadyCondition, false, infrav1.ReasonBuildFailed, m.Reason+": "+msg)
		}
	case "remediating", "rma":
		// Provisioned stays as it was (the contract does not take it back).
	default:
		if !isTrue(km.Status.Initialization.Provisioned) {
			setCond(km, infrav1.MachineProvisionedCondition, false, infrav1.ReasonProvisioning, km.Status.State+" "+km.Status.Step)
			setCond(km, infrav1.ReadyCondition, false, infrav1.ReasonProvisioning, km.Status.State+" "+km.Status.Step)
		}
	}
	r.health(km, m)
}

// health sets KilnHealthy from Kiln's day-2 view of m: RMA, a repair in
// progress, or a Critical health condition.
func (r *KilnMachineReconciler) health(km *infrav1.KilnMachine, m api.Machine) {
	msg := m.Message
	switch {
	case m.State == "rma":
		setCond(km, infrav1.KilnHealthyCondition, false, infrav1.ReasonRMA, "Kiln declared the machine failed (RMA): "+msg)
	case m.State == "remediating" || (m.Remediation != nil && m.Remediation.Outcome == ""):
		why := ""
		if m.Remediation != nil {
			why = m.Remediation.Step + ": " + m.Remediation.Why
		}
		setCond(km, infrav1.KilnHealthyCondition, false, infrav1.ReasonRemediating, "Kiln is repairing the machine ("+why+")")
	case critical(m) != "":
		setCond(km, infrav1.KilnHealthyCondition, false, infrav1.ReasonCritical, critical(m))
	default:
		setCond(km, infrav1.KilnHealthyCondition, true, infrav1.ReasonHealthy, "")
	}
}

func critical(m api.Machine) string {
	for _, h := range m.Health {
		if h.Status == "Critical" {
			return h.Type + " (" + h.Source + "): " + h.Message
		}
	}
	return ""
}

// provisioningIP is the address of m on the provisioning network when Kiln
// holds no reservation for it: the InternalIP already recorded, else the
// live DHCP lease (GET /v1/leases) of one of m's NICs ("" when none).
func provisioningIP(ctx context.Context, kiln *kclient.Client, m api.Machine, have []infrav1.MachineAddress) string {
	for _, a := range have {
		if a.Type == "InternalIP" {
			return a.Address
		}
	}
	macs := map[string]bool{}
	for _, n := range m.Intended.NICs {
		macs[strings.ToLower(n.MAC)] = true
	}
	if m.Discovered != nil {
		for _, n := range m.Discovered.NICs {
			macs[strings.ToLower(n.MAC)] = true
		}
	}
	l, err := kiln.Leases(ctx, false)
	if err != nil {
		log.FromContext(ctx).Info("no lease list from Kiln; addresses without InternalIP", "err", err)
		return ""
	}
	for _, ls := range l.Items {
		if macs[strings.ToLower(ls.MAC)] && ls.State == "bound" && ls.Expiry.After(l.Time) {
			return ls.IP
		}
	}
	return ""
}

// addresses are the contract addresses of a provisioned Kiln machine: its
// provisioning address (InternalIP: the reservation, or the lease) and the
// host name its build wrote.
func addresses(m api.Machine) []infrav1.MachineAddress {
	var out []infrav1.MachineAddress
	name := ""
	if m.Build != nil && m.Build.Hostname != "" {
		name = m.Build.Hostname
	} else if m.Claim != nil {
		name = m.Claim.Hostname
	}
	if name != "" {
		out = append(out, infrav1.MachineAddress{Type: "Hostname", Address: name}, infrav1.MachineAddress{Type: "InternalDNS", Address: name})
	}
	if m.IPv4 != "" {
		out = append(out, infrav1.MachineAddress{Type: "InternalIP", Address: m.IPv4})
	}
	return out
}

func (r *KilnMachineReconciler) reconcileDelete(ctx context.Context, kiln *kclient.Client, km *infrav1.KilnMachine) (ctrl.Result, error) {
	key := ownerKey(km.Namespace, km.Name)
	id := km.Annotations[infrav1.MachineIDAnnotation]
	if id == "" {
		found, err := findClaimed(ctx, kiln, key)
		if err != nil {
			setCond(km, infrav1.KilnReachableCondition, false, infrav1.ReasonKilnError, err.Error())
			return ctrl.Result{RequeueAfter: r.poll()}, nil
		}
		if found != nil {
			id = found.ID
		}
	}
	if id != "" {
		m, err := kiln.GetMachine(ctx, id)
		if err == nil && !ownedBy(m, key) {
			// The claim moved to a spare: release that one.
			found, ferr := findClaimed(ctx, kiln, key)
			if ferr != nil {
				setCond(km, infrav1.KilnReachableCondition, false, infrav1.ReasonKilnError, ferr.Error())
				return ctrl.Result{RequeueAfter: r.poll()}, nil
			}
			if found != nil {
				m, id = *found, found.ID
			}
		}
		switch {
		case kilnStatus(err) == http.StatusNotFound:
		case err != nil:
			setCond(km, infrav1.KilnReachableCondition, false, infrav1.ReasonKilnError, err.Error())
			return ctrl.Result{RequeueAfter: r.poll()}, nil
		case ownedBy(m, key):
			km.Status.State = string(m.State)
			_, err := kiln.Release(ctx, id, api.ActionRequest{Reason: "cluster api: KilnMachine " + km.Namespace + "/" + km.Name + " deleted"})
			if err != nil {
				// A build or a repair in progress cannot be released: Kiln
				// answers illegal_transition; try again once it ends.
				setCond(km, infrav1.ReadyCondition, false, infrav1.ReasonReleasing,
					fmt.Sprintf("releasing Kiln machine %s (%s): %s", id, m.State, errMessage(err)))
				return ctrl.Result{RequeueAfter: r.poll()}, nil
			}
			log.FromContext(ctx).Info("released Kiln machine", "machine", id)
		}
	}
	before := km.DeepCopy()
	controllerutil.RemoveFinalizer(km, infrav1.MachineFinalizer)
	return ctrl.Result{}, r.patchMeta(ctx, before, km)
}

// errNoMatch is pickMachine's "none available", answered as Kiln's claim
// answers it (not_enough_machines).
var errNoMatch = &kclient.Error{Status: http.StatusConflict, Detail: api.ErrorDetail{Code: "not_enough_machines"}}

// pickMachine chooses the available, unclaimed Kiln machine a placed claim
// goes to: in rack fd when set; with spread, from the rack that holds the
// fewest machines claimed for cluster (ties: rack ID, then machine ID).
// The claim itself is Kiln's compare-and-set (POST …/provision), so a
// machine taken meanwhile is refused, not claimed twice.
func pickMachine(ctx context.Context, kiln *kclient.Client, selector map[string]string, fd, cluster string, spread bool) (string, error) {
	avail, err := kiln.ListAllMachines(ctx, kclient.MachineQuery{State: "available", Rack: fd, Labels: selector, Consistent: true, Limit: 1000})
	if err != nil {
		return "", err
	}
	avail = slices.DeleteFunc(avail, func(m api.Machine) bool { return m.Claim != nil })
	if len(avail) == 0 {
		e := *errNoMatch
		e.Detail.Message = fmt.Sprintf("no available Kiln machine with labels %v in rack %q", selector, fd)
		return "", &e
	}
	used := map[string]int{}
	if spread {
		all, err := kiln.ListAllMachines(ctx, kclient.MachineQuery{Consistent: true, Limit: 1000})
		if err != nil {
			return "", err
		}
		for _, m := range all {
			if m.Claim != nil && m.Claim.Labels[infrav1.ClusterClaimLabel] == cluster {
				used[m.Rack]++
			}
		}
	}
	slices.SortFunc(avail, func(a, b api.Machine) int {
		if c := used[a.Rack] - used[b.Rack]; c != 0 {
			return c
		}
		if c := strings.Compare(a.Rack, b.Rack); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return avail[0].ID, nil
}

// ownedBy reports whether Kiln machine m holds the claim of owner key.
func ownedBy(m api.Machine, key string) bool {
	return m.Claim != nil && m.Claim.Labels[infrav1.OwnerClaimLabel] == key
}

// findClaimed returns the Kiln machine whose claim carries owner key (nil
// when none does). It reads the leader's committed state
// (consistent=true), so a claim Kiln acknowledged is always seen.
func findClaimed(ctx context.Context, kiln *kclient.Client, key string) (*api.Machine, error) {
	ms, err := kiln.ListAllMachines(ctx, kclient.MachineQuery{Consistent: true, Limit: 1000})
	if err != nil {
		return nil, err
	}
	var found *api.Machine
	for i := range ms {
		if ownedBy(ms[i], key) {
			if found != nil {
				return nil, fmt.Errorf("kiln machines %s and %s both hold claim %s=%s", found.ID, ms[i].ID, infrav1.OwnerClaimLabel, key)
			}
			found = &ms[i]
		}
	}
	return found, nil
}

// recordID writes the Kiln machine ID to km's annotation (a patch of the
// metadata, at once) and status.
func (r *KilnMachineReconciler) recordID(ctx context.Context, km *infrav1.KilnMachine, id string) error {
	before := km.DeepCopy()
	if km.Annotations == nil {
		km.Annotations = map[string]string{}
	}
	km.Annotations[infrav1.MachineIDAnnotation] = id
	km.Status.MachineID = id
	return r.patchMeta(ctx, before, km)
}

// patchMeta patches km's metadata and spec (not status) from before.
func (r *KilnMachineReconciler) patchMeta(ctx context.Context, before, km *infrav1.KilnMachine) error {
	status := km.Status
	if err := r.Patch(ctx, km, client.MergeFrom(before)); err != nil {
		return err
	}
	km.Status = status
	return nil
}

func (r *KilnMachineReconciler) patchStatus(ctx context.Context, before, km *infrav1.KilnMachine) error {
	if km.Spec.ProviderID != before.Spec.ProviderID {
		spec := km.DeepCopy()
		if err := r.Patch(ctx, km, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		km.Status = spec.Status
	}
	err := r.Status().Patch(ctx, km, client.MergeFrom(before))
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func bootstrapData(ctx context.Context, c client.Reader, ns, name string) (string, error) {
	var s corev1.Secret
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &s); err != nil {
		return "", fmt.Errorf("bootstrap data secret %s/%s: %w", ns, name, err)
	}
	if f := string(s.Data[bootstrapFormatKey]); f != "" && f != "cloud-config" {
		return "", fmt.Errorf("bootstrap data secret %s/%s: format %q: Kiln stages cloud-config only", ns, name, f)
	}
	v := s.Data[bootstrapValueKey]
	if len(v) == 0 {
		return "", fmt.Errorf("bootstrap data secret %s/%s has no %q", ns, name, bootstrapValueKey)
	}
	return string(v), nil
}

func setCond(km *infrav1.KilnMachine, typ string, ok bool, reason, msg string) {
	setCondition(&km.Status.Conditions, km.Generation, typ, ok, reason, msg)
}

// notClaimed says, in MachineClaimed and Ready alike, why km holds no
// claim it can use.
func notClaimed(km *infrav1.KilnMachine, reason, msg string) {
	setCond(km, infrav1.MachineClaimedCondition, false, reason, msg)
	setCond(km, infrav1.ReadyCondition, false, reason, msg)
}

// setCondition sets condition typ (True when ok) in conds, observed at
// generation gen, its message cut to 1000 bytes.
func setCondition(conds *[]metav1.Condition, gen int64, typ string, ok bool, reason, msg string) {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: trim(msg), ObservedGeneration: gen})
}

func trim(s string) string {
	if len(s) > 1000 {
		return s[:1000]
	}
	return s
}

func errMessage(err error) string {
	var e *kclient.Error
	if errors.As(err, &e) {
		return e.Code() + ": " + e.Message()
	}
	return err.Error()
}

func isTrue(b *bool) bool { return b != nil && *b }
