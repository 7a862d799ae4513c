package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"kiln/deploy/lab/e2e"
	"kiln/deploy/lab/testreq"

	infrav1 "kiln/cmd/kiln-capi/api/v1alpha1"
)

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestE2ECAPI is the provider's end-to-end run: the lab of `make e2e`
// (deploy/lab/e2e: Kiln serving a network namespace, a qemu VM with
// SeaBIOS and the iPXE ROM behind an ipmi_sim BMC) with the claim placed
// by a KilnMachine instead of the flow: the provider, running here against
// the real kube-apiserver, claims the VM once it is available and hands
// Kiln the Machine's bootstrap data; Kiln builds it; the VM boots its
// disk; the KilnMachine ends provisioned with the VM's providerID, and
// the bootstrap data is on the disk's cidata partition (read from the
// host after the run).
func TestE2ECAPI(t *testing.T) {
	if os.Getenv("KILN_E2E") == "" {
		t.Skip("end-to-end VM test: run it with `make capi-e2e` (sets KILN_E2E=1; needs root, qemu, the built env)")
	}
	testreq.Root(t, "end-to-end VM test: network namespaces, tap devices")
	needAPIServer(t)
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Clean(filepath.Join(filepath.Dir(file), "../../.."))
	const userData = "#cloud-config\n# written by the Cluster API e2e of kiln-capi\nruncmd:\n  - [kubeadm, join, --config, /run/kubeadm/kubeadm-join-config.yaml]\n"
	var (
		tc          *testCluster
		created     time.Time
		provisioned atomic.Int64 // unix nanoseconds the KilnMachine was first seen provisioned
	)
	prefix := "kln"
	if p := os.Getenv("KILN_LAB_PREFIX"); p != "" {
		prefix = p
	}
	o := e2e.Options{Root: root, Work: filepath.Join(t.TempDir(), "lab"), Prefix: prefix, Firmware: "bios", BMC: "ipmi",
		DiskMiB: 64, ImageMiB: 24, Out: logWriter{t}, Timeout: 8 * time.Minute,
		ClaimWith: func(ctx context.Context, k e2e.LabKiln, machineID, imageID string) error {
			startManagerKilns(t, nil, &Kilns{Timeout: 15 * time.Second, Transport: k.HTTP.Transport})
			tc = newTestClusterAt(t, k.URL, k.Token)
			created = time.Now()
			tc.addMachine("capi-node-0", userData, infrav1.KilnMachineSpec{Image: imageID})
			go func() {
				for ctx.Err() == nil {
					if km := tc.get("capi-node-0"); km != nil && isTrue(km.Status.Initialization.Provisioned) {
						provisioned.Store(time.Now().UnixNano())
						return
					}
					time.Sleep(200 * time.Millisecond)
				}
			}()
			deadline := time.Now().Add(60 * time.Second)
			for {
				km := tc.get("capi-node-0")
				if c := meta.FindStatusCondition(km.Status.Conditions, infrav1.MachineClaimedCondition); c != nil && c.Status == "True" {
					if km.Status.MachineID != machineID {
						return fmt.Errorf("the KilnMachine claimed %s, the lab's VM is %s", km.Status.MachineID, machineID)
					}
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("KilnMachine not claimed within 60 s: %s", describe(tc, "capi-node-0")())
				}
				time.Sleep(200 * time.Millisecond)
			}
		}}
	r, err := e2e.Run(context.Background(), o)
	if err != nil {
		if b, rerr := os.ReadFile(filepath.Join(o.Work, "kiln.log")); rerr == nil {
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			t.Logf("---- kiln.log (tail)\n%s", b)
		}
		t.Fatal(err)
	}
	if r.FinalState != "provisioned" || !r.DiskImageOK || !r.DiskBooted {
		t.Fatalf("lab run: state %s (%s), disk as expected %v (%s), booted its disk %v", r.FinalState, r.Reason, r.DiskImageOK, r.DiskProblem, r.DiskBooted)
	}
	if got := r.Cidata["user-data"]; !strings.Contains(got, userData) {
		t.Fatalf("cidata user-data on the disk %q does not hold the Machine's bootstrap data %q", got, userData)
	}
	eventually(t, 30*time.Second, "KilnMachine provisioned", func() bool { return provisioned.Load() != 0 }, describe(tc, "capi-node-0"))
	km := tc.get("capi-node-0")
	if km.Spec.ProviderID != ProviderID(r.MachineID) || !km.Status.Ready {
		t.Fatalf("KilnMachine providerID %q (want %q) ready %v", km.Spec.ProviderID, ProviderID(r.MachineID), km.Status.Ready)
	}
	var ip string
	for _, a := range km.Status.Addresses {
		if a.Type == "InternalIP" {
			ip = a.Address
		}
	}
	if ip == "" {
		t.Fatalf("KilnMachine addresses %+v: no InternalIP (the VM's provisioning lease)", km.Status.Addresses)
	}
	secs := time.Unix(0, provisioned.Load()).Sub(created).Seconds()
	fmt.Printf("e2e: capi KilnMachine provisioned in %.1f s (KilnMachine created to provisioned; %s at %s, the VM booted its disk, the Machine's bootstrap data in its cidata)\n",
		secs, km.Spec.ProviderID, ip)
}
