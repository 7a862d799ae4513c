package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"kiln/deploy/lab/testreq"

	infrav1 "kiln/cmd/kiln-capi/api/v1alpha1"
)

// The tests run on a real kube-apiserver and etcd (envtest), built by
// deploy/capi/kube/build.sh; KUBEBUILDER_ASSETS names their directory
// (make capi-test sets it).
var (
	restCfg *rest.Config
	scheme  = runtime.NewScheme()
	envErr  error
)

func TestMain(m *testing.M) {
	_ = clientgoscheme.AddToScheme(scheme)
	_ = infrav1.AddToScheme(scheme)
	logf.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(zapLevel())))
	var env *envtest.Environment
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		envErr = fmt.Errorf("KUBEBUILDER_ASSETS is not set: run `make capi-test` (it builds kube-apiserver once with deploy/capi/kube/build.sh and points there)")
	} else {
		env = &envtest.Environment{
			CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd"), filepath.Join("..", "testdata", "crds")},
			ErrorIfCRDPathMissing: true,
		}
		restCfg, envErr = env.Start()
	}
	code := m.Run()
	if env != nil && restCfg != nil {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "envtest stop:", err)
		}
	}
	os.Exit(code)
}

func zapLevel() zapcore.Level {
	if os.Getenv("KILN_CAPI_DEBUG") != "" {
		return -1
	}
	return 1 // warnings and errors only
}

// needAPIServer skips (or, under KILN_REQUIRE_ALL=1, fails) a test when
// envtest could not start.
func needAPIServer(t *testing.T) {
	t.Helper()
	if envErr != nil {
		testreq.Missing(t, "envtest: %v", envErr)
	}
}

// manager is one run of the provider's controllers (a process's life):
// stop ends it, as a killed or restarted controller.
type manager struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func startManager(t *testing.T, wrap func(client.Client) client.Client) *manager {
	t.Helper()
	return startManagerKilns(t, wrap, &Kilns{Timeout: 10 * time.Second})
}

// startManagerKilns is startManager with the given Kiln client cache.
func startManagerKilns(t *testing.T, wrap func(client.Client) client.Client, kilns *Kilns) *manager {
	t.Helper()
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0", Controller: config.Controller{SkipNameValidation: ptr(true)}})
	if err != nil {
		t.Fatal(err)
	}
	c := mgr.GetClient()
	if wrap != nil {
		c = wrap(c)
	}
	if err := (&KilnClusterReconciler{Client: c, Kilns: kilns, Resync: 2 * time.Second}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	if err := (&KilnMachineReconciler{Client: c, Kilns: kilns, Poll: 500 * time.Millisecond}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &manager{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	t.Cleanup(m.stop)
	return m
}

func (m *manager) stop() {
	m.cancel()
	select {
	case <-m.done:
	case <-time.After(30 * time.Second):
	}
}

func ptr[T any](v T) *T { return &v }

// testCluster is one namespace with what Cluster API core and the
// operator would have made: the Kiln token Secret, a KilnCluster, and the
// Cluster that owns it.
type testCluster struct {
	t    *testing.T
	c    client.Client
	ns   string
	name string
	kc   *infrav1.KilnCluster
}

var nsSeq int

func newTestCluster(t *testing.T, k *testKiln) *testCluster {
	t.Helper()
	return newTestClusterAt(t, k.api, k.token)
}

// newTestClusterAt is newTestCluster for the Kiln at server with token.
func newTestClusterAt(t *testing.T, server, token string) *testCluster {
	t.Helper()
	c, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	nsSeq++
	tc := &testCluster{t: t, c: c, ns: fmt.Sprintf("capi-%d-%d", os.Getpid(), nsSeq), name: "floor"}
	must(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tc.ns}}))
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tc.ns}})
	})
	must(t, c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tc.ns, Name: "kiln-token"},
		Data: map[string][]byte{"token": []byte(token)}}))
	cluster := newCAPI("Cluster")
	cluster.SetNamespace(tc.ns)
	cluster.SetName(tc.name)
	must(t, unstructured.SetNestedMap(cluster.Object, map[string]any{"apiGroup": infrav1.GroupVersion.Group, "kind": "KilnCluster", "name": tc.name},
		"spec", "infrastructureRef"))
	must(t, c.Create(ctx, cluster))
	tc.kc = &infrav1.KilnCluster{ObjectMeta: metav1.ObjectMeta{Namespace: tc.ns, Name: tc.name,
		Labels:          map[string]string{ClusterNameLabel: tc.name},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: CAPIGroup + "/" + CAPIVersion, Kind: "Cluster", Name: tc.name, UID: cluster.GetUID()}}},
		Spec: infrav1.KilnClusterSpec{Kiln: infrav1.KilnEndpoint{Server: server, TokenSecretRef: infrav1.SecretKeyRef{Name: "kiln-token"}},
			ControlPlaneEndpoint: infrav1.APIEndpoint{Host: "10.20.0.10"}}}
	must(t, c.Create(ctx, tc.kc))
	return tc
}

// addMachine creates what a MachineDeployment would: the bootstrap data
// Secret, a Machine naming it, and the KilnMachine the Machine owns.
func (tc *testCluster) addMachine(name, userData string, spec infrav1.KilnMachineSpec) *infrav1.KilnMachine {
	tc.t.Helper()
	return tc.addMachineIn(name, userData, spec, "")
}

// addMachineIn is addMachine with the Machine's spec.failureDomain set to
// fd (when not "").
func (tc *testCluster) addMachineIn(name, userData string, spec infrav1.KilnMachineSpec, fd string) *infrav1.KilnMachine {
	t := tc.t
	t.Helper()
	ctx := context.Background()
	must(t, tc.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tc.ns, Name: name + "-bootstrap"},
		Data: map[string][]byte{"value": []byte(userData), "format": []byte("cloud-config")}}))
	m := newCAPI("Machine")
	m.SetNamespace(tc.ns)
	m.SetName(name)
	m.SetLabels(map[string]string{ClusterNameLabel: tc.name})
	must(t, unstructured.SetNestedField(m.Object, tc.name, "spec", "clusterName"))
	must(t, unstructured.SetNestedField(m.Object, name+"-bootstrap", "spec", "bootstrap", "dataSecretName"))
	if fd != "" {
		must(t, unstructured.SetNestedField(m.Object, fd, "spec", "failureDomain"))
	}
	must(t, unstructured.SetNestedMap(m.Object, map[string]any{"apiGroup": infrav1.GroupVersion.Group, "kind": "KilnMachine", "name": name},
		"spec", "infrastructureRef"))
	must(t, tc.c.Create(ctx, m))
	km := &infrav1.KilnMachine{ObjectMeta: metav1.ObjectMeta{Namespace: tc.ns, Name: name,
		Labels:          map[string]string{ClusterNameLabel: tc.name},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: CAPIGroup + "/" + CAPIVersion, Kind: "Machine", Name: name, UID: m.GetUID()}}},
		Spec: spec}
	must(t, tc.c.Create(ctx, km))
	return km
}

func (tc *testCluster) get(name string) *infrav1.KilnMachine {
	km := &infrav1.KilnMachine{}
	if err := tc.c.Get(context.Background(), client.ObjectKey{Namespace: tc.ns, Name: name}, km); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return nil
		}
		tc.t.Fatal(err)
	}
	return km
}

// eventually polls cond every 100 ms until it holds or d passes; then it
// fails with what describe says.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool, describe func() string) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	defer func() { t.Logf("%s: %.1f s", what, time.Since(start).Seconds()) }()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, d, describe())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
