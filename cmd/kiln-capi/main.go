// Command kiln-capi is Kiln's Cluster API infrastructure provider: a
// controller manager reconciling KilnCluster and KilnMachine objects
// (kiln/cmd/kiln-capi/api/v1alpha1) against Kiln sites through Kiln's REST
// API. Install the CRDs of config/crd and run it with a kubeconfig (or in
// the cluster); README.md says how.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	infrav1 "kiln/cmd/kiln-capi/api/v1alpha1"
	"kiln/cmd/kiln-capi/controllers"
)

var version = "dev"

func main() {
	var (
		metricsAddr = flag.String("metrics-bind-address", ":8080", "address of the Prometheus /metrics endpoint (0 disables it)")
		probeAddr   = flag.String("health-probe-bind-address", ":8081", "address of /healthz and /readyz")
		leaderElect = flag.Bool("leader-elect", true, "elect one active manager through a Lease (run two replicas for failover)")
		poll        = flag.Duration("poll", 10*time.Second, "how often a building machine's Kiln state is read")
		namespace   = flag.String("namespace", "", "watch only this namespace (default: all)")
		showVersion = flag.Bool("version", false, "print the version and exit")
	)
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println("kiln-capi", version)
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	if err := run(*metricsAddr, *probeAddr, *leaderElect, *poll, *namespace); err != nil {
		fmt.Fprintln(os.Stderr, "kiln-capi:", err)
		os.Exit(1)
	}
}

// Scheme is the provider's scheme: client-go's types and Kiln's
// infrastructure types (the Cluster API core objects are read unstructured).
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := infrav1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

func run(metricsAddr, probeAddr string, leaderElect bool, poll time.Duration, namespace string) error {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w (set KUBECONFIG or --kubeconfig)", err)
	}
	o := ctrl.Options{Scheme: Scheme(), Metrics: metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: probeAddr, LeaderElection: leaderElect, LeaderElectionID: "kiln-capi.infrastructure.cluster.x-k8s.io"}
	if namespace != "" {
		o.Cache.DefaultNamespaces = map[string]cache.Config{namespace: {}}
	}
	mgr, err := ctrl.NewManager(cfg, o)
	if err != nil {
		return err
	}
	if err := controllers.Setup(mgr, poll); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	ctrl.Log.Info("starting", "version", version)
	return mgr.Start(ctrl.SetupSignalHandler())
}
