package controllers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"kiln/api"
	kclient "kiln/api/client"

	infrav1 "kiln/cmd/kiln-capi/api/v1alpha1"
)

func describe(tc *testCluster, name string) func() string {
	return func() string {
		km := tc.get(name)
		if km == nil {
			return "KilnMachine gone"
		}
		return fmt.Sprintf("annotations %v spec %+v status %+v", km.Annotations, km.Spec, km.Status)
	}
}

// claimsOf lists the Kiln machines whose claim names KilnMachine ns/name.
func claimsOf(t *testing.T, k *testKiln, ns, name string) []api.Machine {
	t.Helper()
	ms, err := k.cl.ListAllMachines(context.Background(), kclient.MachineQuery{Consistent: true})
	if err != nil {
		t.Fatal(err)
	}
	var out []api.Machine
	for _, m := range ms {
		if ownedBy(m, ownerKey(ns, name)) {
			out = append(out, m)
		}
	}
	return out
}

func runMachines(t *testing.T, k *testKiln, n int, labels map[string]string) map[string]*simMachine {
	t.Helper()
	return runMachinesIn(t, k, make([]string, n), labels)
}

// runMachinesIn is runMachines with machine i in rack racks[i] ("" none).
func runMachinesIn(t *testing.T, k *testKiln, racks []string, labels map[string]string) map[string]*simMachine {
	t.Helper()
	n := len(racks)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	out := map[string]*simMachine{}
	for i := 0; i < n; i++ {
		m := k.addMachine(t, ctx, i, labels, racks[i])
		out[m.id] = m
	}
	eventually(t, 60*time.Second, "machines inspected and available", func() bool {
		l, err := k.cl.ListAllMachines(context.Background(), kclient.MachineQuery{State: "available"})
		return err == nil && len(l) == n
	}, func() string {
		l, _ := k.cl.ListAllMachines(context.Background(), kclient.MachineQuery{})
		s := ""
		for _, m := range l {
			s += fmt.Sprintf(" %s=%s(%s %s)", m.ID, m.State, m.Reason, m.Message)
		}
		return s
	})
	return out
}

// A KilnMachine claims one available Kiln machine, Kiln builds it with the
// Machine's bootstrap data staged, and the KilnMachine is provisioned with
// providerID and addresses; deleting it releases the machine, which Kiln
// erases and makes available again.
func TestKilnMachineClaimProvisionRelease(t *testing.T) {
	needAPIServer(t)
	k := startKiln(t)
	sims := runMachines(t, k, 3, map[string]string{"class": "general"})
	tc := newTestCluster(t, k)
	startManager(t, nil)

	eventually(t, 30*time.Second, "KilnCluster provisioned", func() bool {
		kc := &infrav1.KilnCluster{}
		return tc.c.Get(context.Background(), client.ObjectKeyFromObject(tc.kc), kc) == nil && isTrue(kc.Status.Initialization.Provisioned) && kc.Status.Ready
	}, func() string { return "" })

	const userData = "#cloud-config\nruncmd: [kubeadm join --token abcdef.0123456789abcdef]\n"
	tc.addMachine("worker-0", userData, infrav1.KilnMachineSpec{Image: k.image.ID, Selector: map[string]string{"class": "general"}})
	eventually(t, 90*time.Second, "KilnMachine provisioned", func() bool {
		km := tc.get("worker-0")
		return km != nil && isTrue(km.Status.Initialization.Provisioned) && km.Status.Ready
	}, describe(tc, "worker-0"))

	km := tc.get("worker-0")
	id := km.Annotations[infrav1.MachineIDAnnotation]
	if id == "" || km.Spec.ProviderID != "kiln://"+id || km.Status.MachineID != id {
		t.Fatalf("annotation %q providerID %q status.machineID %q", id, km.Spec.ProviderID, km.Status.MachineID)
	}
	if got, err := MachineIDFromProviderID(km.Spec.ProviderID); err != nil || got != id {
		t.Fatalf("MachineIDFromProviderID(%q) = %q, %v", km.Spec.ProviderID, got, err)
	}
	if c := meta.FindStatusCondition(km.Status.Conditions, infrav1.ReadyCondition); c == nil || c.Status != "True" {
		t.Fatalf("Ready condition %+v", c)
	}
	if c := meta.FindStatusCondition(km.Status.Conditions, infrav1.KilnHealthyCondition); c == nil || c.Status != "True" {
		t.Fatalf("KilnHealthy condition %+v", c)
	}
	hasHost := false
	for _, a := range km.Status.Addresses {
		hasHost = hasHost || (a.Type == "Hostname" && a.Address == "worker-0")
	}
	if !hasHost {
		t.Fatalf("addresses %+v: no Hostname worker-0", km.Status.Addresses)
	}
	m, err := k.cl.GetMachine(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if m.State != "provisioned" || m.Claim == nil || m.Claim.UserData != userData || m.Claim.Hostname != "worker-0" ||
		m.Claim.Labels[infrav1.ClusterClaimLabel] != tc.name {
		t.Fatalf("kiln machine %s: state %s claim %+v", id, m.State, m.Claim)
	}
	if got := sims[id].staged(); got != userData {
		t.Fatalf("the build staged user-data %q, want the Machine's bootstrap data %q", got, userData)
	}
	if n := len(claimsOf(t, k, tc.ns, "worker-0")); n != 1 {
		t.Fatalf("%d Kiln machines hold worker-0's claim, want 1", n)
	}
	t.Logf("worker-0 is Kiln machine %s, %s; addresses %+v", id, km.Spec.ProviderID, km.Status.Addresses)

	// Delete: released to Kiln, erased, available; the finalizer goes.
	must(t, tc.c.Delete(context.Background(), km))
	eventually(t, 60*time.Second, "KilnMachine deleted", func() bool { return tc.get("worker-0") == nil }, describe(tc, "worker-0"))
	eventually(t, 60*time.Second, "released machine erased and available", func() bool {
		m, err := k.cl.GetMachine(context.Background(), id)
		return err == nil && m.State == "available" && m.Claim == nil
	}, func() string {
		m, _ := k.cl.GetMachine(context.Background(), id)
		return fmt.Sprintf("%s %s %s", m.State, m.Reason, m.Message)
	})
	sims[id].mu.Lock()
	erased := sims[id].erased
	sims[id].mu.Unlock()
	if erased == 0 {
		t.Fatalf("machine %s available again without an erase", id)
	}
}

// crashAfterClaim is the provider's API client in a process that dies
// right after Kiln answered the claim: the patch recording the Kiln
// machine ID fails, and the manager is stopped before anything else.
type crashAfterClaim struct {
	client.Client
	crashed atomic.Bool
	stop    func()
}

func (c *crashAfterClaim) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if km, ok := obj.(*infrav1.KilnMachine); ok && km.Annotations[infrav1.MachineIDAnnotation] != "" {
		if c.crashed.CompareAndSwap(false, true) {
			go c.stop()
		}
		return errors.New("test: the controller died before recording its claim")
	}
	return c.Client.Patch(ctx, obj, patch, opts...)
}

// A controller restarted between Kiln's claim answer and the annotation
// write finds its claim by the owner label and claims nothing twice.
func TestRestartMidClaimClaimsOnce(t *testing.T) {
	needAPIServer(t)
	k := startKiln(t)
	runMachines(t, k, 3, nil)
	tc := newTestCluster(t, k)

	var crash *crashAfterClaim
	var first *manager
	first = startManager(t, func(c client.Client) client.Client {
		crash = &crashAfterClaim{Client: c, stop: func() { first.stop() }}
		return crash
	})
	tc.addMachine("cp-0", "#cloud-config\n{}\n", infrav1.KilnMachineSpec{Image: k.image.ID})
	eventually(t, 60*time.Second, "first controller claims and dies", func() bool { return crash.crashed.Load() }, describe(tc, "cp-0"))
	first.stop()
	if km := tc.get("cp-0"); km.Annotations[infrav1.MachineIDAnnotation] != "" {
		t.Fatalf("the crashed controller recorded %q", km.Annotations[infrav1.MachineIDAnnotation])
	}
	claims := claimsOf(t, k, tc.ns, "cp-0")
	if len(claims) != 1 {
		t.Fatalf("after the crash %d Kiln machines hold cp-0's claim, want 1", len(claims))
	}

	startManager(t, nil) // the restart
	eventually(t, 90*time.Second, "cp-0 provisioned after the restart", func() bool {
		km := tc.get("cp-0")
		return km != nil && isTrue(km.Status.Initialization.Provisioned)
	}, describe(tc, "cp-0"))
	after := claimsOf(t, k, tc.ns, "cp-0")
	km := tc.get("cp-0")
	if len(after) != 1 || after[0].ID != claims[0].ID || km.Annotations[infrav1.MachineIDAnnotation] != claims[0].ID {
		t.Fatalf("claims after the restart %d (first %s), annotation %q", len(after), claims[0].ID, km.Annotations[infrav1.MachineIDAnnotation])
	}
	avail, err := k.cl.ListAllMachines(context.Background(), kclient.MachineQuery{State: "available"})
	if err != nil || len(avail) != 2 {
		t.Fatalf("available after: %d (%v), want the 2 unclaimed", len(avail), err)
	}
	t.Logf("claimed %s once across the restart", claims[0].ID)
}

// A paused cluster claims nothing; unpaused, the claim goes ahead. A
// selector no machine matches says so in a condition.
func TestPausedAndNoMatch(t *testing.T) {
	needAPIServer(t)
	k := startKiln(t)
	runMachines(t, k, 1, map[string]string{"class": "general"})
	tc := newTestCluster(t, k)
	startManager(t, nil)

	cluster := newCAPI("Cluster")
	must(t, tc.c.Get(context.Background(), client.ObjectKey{Namespace: tc.ns, Name: tc.name}, cluster))
	cluster.SetAnnotations(map[string]string{PausedAnnotation: ""})
	must(t, tc.c.Update(context.Background(), cluster))

	tc.addMachine("gpu-0", "#cloud-config\n{}\n", infrav1.KilnMachineSpec{Image: k.image.ID, Selector: map[string]string{"class": "gpu"}})
	tc.addMachine("w-0", "#cloud-config\n{}\n", infrav1.KilnMachineSpec{Image: k.image.ID, Selector: map[string]string{"class": "general"}})
	time.Sleep(3 * time.Second)
	for _, n := range []string{"gpu-0", "w-0"} {
		if km := tc.get(n); len(km.Status.Conditions) != 0 || len(km.Finalizers) != 0 || len(claimsOf(t, k, tc.ns, n)) != 0 {
			t.Fatalf("paused: %s was reconciled: finalizers %v conditions %+v", n, km.Finalizers, km.Status.Conditions)
		}
	}
	must(t, tc.c.Get(context.Background(), client.ObjectKey{Namespace: tc.ns, Name: tc.name}, cluster))
	cluster.SetAnnotations(nil)
	must(t, tc.c.Update(context.Background(), cluster))

	eventually(t, 30*time.Second, "gpu-0 says no machine matches", func() bool {
		c := meta.FindStatusCondition(tc.get("gpu-0").Status.Conditions, infrav1.MachineClaimedCondition)
		return c != nil && c.Status == "False" && c.Reason == infrav1.ReasonNoMachineAvailable
	}, describe(tc, "gpu-0"))
	eventually(t, 90*time.Second, "w-0 provisioned once unpaused", func() bool {
		return isTrue(tc.get("w-0").Status.Initialization.Provisioned)
	}, describe(tc, "w-0"))
	if n := len(claimsOf(t, k, tc.ns, "gpu-0")); n != 0 {
		t.Fatalf("gpu-0 holds %d claims", n)
	}
}

// Kiln's day 2 shows on the KilnMachine: an RMA of its provisioned machine
// hands the claim to a spare; the KilnMachine keeps its providerID, says
// KilnHealthy=False (RMA) and Ready=False (Replaced) so the Machine is
// replaced, and its deletion releases the spare.
func TestRMAShowsAndDeleteReleasesSpare(t *testing.T) {
	needAPIServer(t)
	k := startKiln(t)
	runMachines(t, k, 2, nil)
	tc := newTestCluster(t, k)
	startManager(t, nil)
	tc.addMachine("cp-0", "#cloud-config\n{}\n", infrav1.KilnMachineSpec{Image: k.image.ID})
	eventually(t, 90*time.Second, "cp-0 provisioned", func() bool { return isTrue(tc.get("cp-0").Status.Initialization.Provisioned) }, describe(tc, "cp-0"))
	km := tc.get("cp-0")
	failed := km.Annotations[infrav1.MachineIDAnnotation]
	providerID := km.Spec.ProviderID

	if _, err := k.cl.RMA(context.Background(), failed, api.RMARequest{Message: "test: dead DIMM"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "cp-0 shows the RMA and its replacement", func() bool {
		km := tc.get("cp-0")
		ready := meta.FindStatusCondition(km.Status.Conditions, infrav1.ReadyCondition)
		healthy := meta.FindStatusCondition(km.Status.Conditions, infrav1.KilnHealthyCondition)
		return ready != nil && ready.Reason == infrav1.ReasonReplaced && ready.Status == "False" &&
			healthy != nil && healthy.Status == "False" && healthy.Reason == infrav1.ReasonRMA
	}, describe(tc, "cp-0"))
	km = tc.get("cp-0")
	if km.Spec.ProviderID != providerID || km.Annotations[infrav1.MachineIDAnnotation] != failed {
		t.Fatalf("after the RMA: providerID %q (was %q), machine %q (was %q)", km.Spec.ProviderID, providerID,
			km.Annotations[infrav1.MachineIDAnnotation], failed)
	}
	spares := claimsOf(t, k, tc.ns, "cp-0")
	if len(spares) != 1 || spares[0].ID == failed || spares[0].Claim.Replaces != failed {
		t.Fatalf("claims after the RMA: %+v", spares)
	}
	spare := spares[0].ID
	t.Logf("RMA of %s: the spare %s holds the claim; %s", failed, spare,
		meta.FindStatusCondition(km.Status.Conditions, infrav1.ReadyCondition).Message)

	must(t, tc.c.Delete(context.Background(), km))
	eventually(t, 90*time.Second, "the spare released and the KilnMachine gone", func() bool {
		m, err := k.cl.GetMachine(context.Background(), spare)
		return err == nil && m.Claim == nil && tc.get("cp-0") == nil
	}, func() string {
		m, _ := k.cl.GetMachine(context.Background(), spare)
		return fmt.Sprintf("spare %s %s claim %v; %s", m.State, m.Reason, m.Claim != nil, describe(tc, "cp-0")())
	})
}

// Placement over racks: with rackSpread Spread a cluster's machines come
// from the racks holding the fewest of them; a Machine's failureDomain (a
// rack of the KilnCluster's failureDomains) gets a machine of that rack.
func TestRackSpreadAndFailureDomain(t *testing.T) {
	needAPIServer(t)
	k := startKiln(t)
	ctx := context.Background()
	site, err := k.cl.CreateSite(ctx, api.SiteSpec{Name: "hall-a"})
	must(t, err)
	var racks []string
	for _, name := range []string{"r01", "r02"} {
		r, err := k.cl.CreateRack(ctx, api.RackSpec{Site: site.ID, Name: name, Units: 42})
		must(t, err)
		racks = append(racks, r.ID)
	}
	// Rack r01 holds machines 0-2, r02 machine 3: Kiln's own pick and ID
	// order would take r01 twice.
	runMachinesIn(t, k, []string{racks[0], racks[0], racks[0], racks[1]}, nil)
	tc := newTestCluster(t, k)
	startManager(t, nil)
	eventually(t, 30*time.Second, "KilnCluster lists both racks as failure domains", func() bool {
		kc := &infrav1.KilnCluster{}
		return tc.c.Get(ctx, client.ObjectKeyFromObject(tc.kc), kc) == nil && len(kc.Status.FailureDomains) == 2 && kc.Status.Ready
	}, func() string { return "" })

	rackOf := func(name string) string {
		t.Helper()
		var km *infrav1.KilnMachine
		eventually(t, 60*time.Second, name+" claimed", func() bool {
			km = tc.get(name)
			return km != nil && km.Status.MachineID != ""
		}, describe(tc, name))
		m, err := k.cl.GetMachine(ctx, km.Status.MachineID)
		must(t, err)
		return m.Rack
	}
	spread := infrav1.KilnMachineSpec{Image: k.image.ID, RackSpread: infrav1.RackSpreadSpread}
	tc.addMachine("w-0", "#cloud-config\n{}\n", spread)
	first := rackOf("w-0")
	tc.addMachine("w-1", "#cloud-config\n{}\n", spread)
	second := rackOf("w-1")
	if first == second {
		t.Fatalf("rackSpread Spread put w-0 and w-1 in one rack %s", first)
	}
	// The failure domain: r01 has machines left, r02 none; ask for r01.
	tc.addMachineIn("cp-0", "#cloud-config\n{}\n", infrav1.KilnMachineSpec{Image: k.image.ID}, racks[0])
	if got := rackOf("cp-0"); got != racks[0] {
		t.Fatalf("cp-0 with failureDomain %s got a machine in rack %s", racks[0], got)
	}
	// A failure domain with no machine left says so.
	tc.addMachineIn("cp-1", "#cloud-config\n{}\n", infrav1.KilnMachineSpec{Image: k.image.ID}, racks[1])
	eventually(t, 30*time.Second, "cp-1 says its rack has no machine", func() bool {
		c := meta.FindStatusCondition(tc.get("cp-1").Status.Conditions, infrav1.MachineClaimedCondition)
		return c != nil && c.Reason == infrav1.ReasonNoMachineAvailable
	}, describe(tc, "cp-1"))
	t.Logf("spread: w-0 in %s, w-1 in %s; cp-0 (failure domain %s) placed there", first, second, racks[0])
}

// A cluster deleted whole (KilnCluster with its machines, as a namespace
// deletion or kubectl delete -f does) still releases every Kiln machine:
// the KilnCluster waits for its KilnMachines.
func TestClusterDeletedWholeReleases(t *testing.T) {
	needAPIServer(t)
	k := startKiln(t)
	runMachines(t, k, 1, nil)
	tc := newTestCluster(t, k)
	startManager(t, nil)
	tc.addMachine("w-0", "#cloud-config\n{}\n", infrav1.KilnMachineSpec{Image: k.image.ID})
	eventually(t, 60*time.Second, "w-0 claimed", func() bool { return tc.get("w-0").Annotations[infrav1.MachineIDAnnotation] != "" }, describe(tc, "w-0"))
	id := tc.get("w-0").Annotations[infrav1.MachineIDAnnotation]
	must(t, tc.c.Delete(context.Background(), tc.kc))
	must(t, tc.c.Delete(context.Background(), tc.get("w-0")))
	eventually(t, 60*time.Second, "w-0 released and gone, then the KilnCluster", func() bool {
		kc := &infrav1.KilnCluster{}
		gone := client.IgnoreNotFound(tc.c.Get(context.Background(), client.ObjectKeyFromObject(tc.kc), kc)) == nil && kc.Name == ""
		return tc.get("w-0") == nil && gone
	}, describe(tc, "w-0"))
	if n := len(claimsOf(t, k, tc.ns, "w-0")); n != 0 {
		t.Fatalf("%d Kiln machines still hold w-0's claim", n)
	}
	m, err := k.cl.GetMachine(context.Background(), id)
	must(t, err)
	t.Logf("w-0's machine %s after the cluster's deletion: %s (claim %v)", id, m.State, m.Claim != nil)
}

// A claim Kiln refuses (the image is not uploaded yet) is tried again: once
// the image exists, the KilnMachine claims without its spec changing.
func TestRefusedClaimRetried(t *testing.T) {
	needAPIServer(t)
	k := startKiln(t)
	runMachines(t, k, 1, nil)
	tc := newTestCluster(t, k)
	startManager(t, nil)
	tc.addMachine("w-1", "#cloud-config\n{}\n", infrav1.KilnMachineSpec{Image: "img-later"})
	eventually(t, 30*time.Second, "w-1 refused", func() bool {
		c := meta.FindStatusCondition(tc.get("w-1").Status.Conditions, infrav1.MachineClaimedCondition)
		return c != nil && c.Reason == infrav1.ReasonKilnError
	}, describe(tc, "w-1"))
	sum := sha256.Sum256(k.imageBody)
	if _, _, err := k.cl.PutImage(context.Background(), "img-later", kclient.ImageMeta{Name: "later", Version: "1",
		SHA256: hex.EncodeToString(sum[:])}, bytes.NewReader(k.imageBody), int64(len(k.imageBody))); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "w-1 claims once the image exists", func() bool {
		return tc.get("w-1").Annotations[infrav1.MachineIDAnnotation] != ""
	}, describe(tc, "w-1"))
}
