// Command bootc-fleet-coordinator is the cluster-side coordinator of
// bootc-fleet: it resolves each BootcNodePool's image, grants stage and
// reboot slots within the pool's budget, drains nodes before their reboot
// and verifies they came back (docs/coordinator.md).
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
)

// version is set at build time with -ldflags "-X main.version=...", as the
// agent's is: both print the same release version.
var version = "dev"

type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error {
	if v == "" || strings.ContainsAny(v, "/ \t") {
		return fmt.Errorf("want a registry host or host:port, got %q", v)
	}
	*s = append(*s, v)
	return nil
}

func main() {
	showVersion := flag.Bool("version", false, "print the version and exit")
	var (
		leaderElect     = flag.Bool("leader-elect", false, "elect one active replica through a Lease")
		leaderNamespace = flag.String("leader-election-namespace", lease.Namespace, "namespace of the leader-election Lease")
		metricsAddr     = flag.String("metrics-bind-address", ":8443", "address of /metrics (0 disables)")
		metricsSecure   = flag.Bool("metrics-secure", true, "serve /metrics over HTTPS to callers the API server authenticates and authorizes (get on the non-resource URL /metrics); false serves plain HTTP to anyone")
		metricsCertDir  = flag.String("metrics-cert-dir", "", "directory with tls.crt and tls.key for /metrics (reloaded on change); empty: a self-signed certificate")
		probeAddr       = flag.String("health-probe-bind-address", ":8081", "address of /healthz and /readyz (0 disables)")
		pprofAddr       = flag.String("pprof-bind-address", "0", "address of Go's /debug/pprof/ profiles, plain HTTP and unauthenticated: bind it to localhost (0 disables)")
		resolveInterval = flag.Duration("resolve-interval", controller.DefaultResolveInterval, "how often a tag is re-resolved to a digest")
		leaseDuration   = flag.Duration("lease-duration", controller.DefaultLeaseDuration, "leaseDurationSeconds written on grants; a stage grant whose holder was not seen reporting for this long expires")
		quietAfter      = flag.Duration("quiet-after", controller.DefaultQuietAfter, "a node with rollout work whose agent has not reported for this long is counted and named on its pool")
		requeue         = flag.Duration("requeue-interval", controller.DefaultRequeueInterval, "longest time a pool goes without a reconcile")
		workers         = flag.Int("workers", controller.DefaultWorkers, "pools reconciled at once")
		resolveTimeout  = flag.Duration("resolve-timeout", 30*time.Second, "bound on one registry lookup")
		logLevel        = flag.String("log-level", "info", "debug, info or error")
		registryCA      = flag.String("registry-ca-file", "", "PEM bundle of CAs trusted for registries, in addition to the system's")
		registryAuth    = flag.String("registry-auth-file", "", "docker config.json with registry credentials for every pool (e.g. a mounted kubernetes.io/dockerconfigjson Secret); a pool's spec.imagePullSecret comes first")
		insecure        stringList
	)
	flag.Var(&insecure, "insecure-registry", "registry host[:port] reachable over plain HTTP (repeatable)")
	// --kubeconfig is registered by controller-runtime: the flag, then
	// $KUBECONFIG, then the in-cluster config, then ~/.kube/config.
	flag.Parse()
	if *showVersion {
		fmt.Println("bootc-fleet-coordinator", version)
		return
	}

	lvl, err := parseLevel(*logLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bootc-fleet-coordinator:", err)
		os.Exit(2)
	}
	if *leaseDuration < 4*time.Second {
		fmt.Fprintf(os.Stderr, "bootc-fleet-coordinator: --lease-duration must be at least 4s (agents report 4 times per lease), got %s\n", *leaseDuration)
		os.Exit(2)
	}
	if *workers < 1 {
		fmt.Fprintf(os.Stderr, "bootc-fleet-coordinator: --workers must be at least 1, got %d\n", *workers)
		os.Exit(2)
	}
	if *registryAuth != "" {
		if err := controller.CheckRegistryAuthFile(*registryAuth); err != nil {
			fmt.Fprintln(os.Stderr, "bootc-fleet-coordinator:", err)
			os.Exit(2)
		}
	}
	// Times to the microsecond: a rollout's steps are milliseconds apart.
	ctrl.SetLogger(zap.New(zap.Level(lvl), func(o *zap.Options) { o.TimeEncoder = zapcore.RFC3339NanoTimeEncoder }))
	log := ctrl.Log.WithName("bootc-fleet-coordinator")
	// The Go heap may grow to twice what is live before a collection; in a
	// container with a memory limit that slack is an OOM kill. GOMEMLIMIT
	// at 90% of the cgroup's limit makes the collector work harder instead
	// (an explicit GOMEMLIMIT, or AUTOMEMLIMIT=off, wins).
	if limit, err := memlimit.Set(); err != nil {
		log.Info("no memory limit for the Go runtime", "why", err.Error())
	} else if limit > 0 && limit < math.MaxInt64 {
		log.Info("Go memory limit", "bytes", limit)
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		log.Error(err, "no API server configuration")
		os.Exit(1)
	}
	c, err := controller.New(cfg, controller.Options{
		LeaderElection:          *leaderElect,
		LeaderElectionNamespace: *leaderNamespace,
		MetricsBindAddress:      *metricsAddr,
		MetricsSecure:           *metricsSecure,
		MetricsCertDir:          *metricsCertDir,
		HealthProbeBindAddress:  *probeAddr,
		PprofBindAddress:        *pprofAddr,
		ResolveInterval:         *resolveInterval,
		LeaseDuration:           *leaseDuration,
		QuietAfter:              *quietAfter,
		RequeueInterval:         *requeue,
		Workers:                 *workers,
		ResolveTimeout:          *resolveTimeout,
		InsecureRegistries:      insecure,
		RegistryCAFile:          *registryCA,
		RegistryAuthFile:        *registryAuth,
		Logger:                  log,
	})
	if err != nil {
		log.Error(err, "cannot start")
		os.Exit(1)
	}
	// SIGTERM/SIGINT cancel the context: the manager stops reconciling,
	// cancels drains, releases leadership and returns.
	if err := c.Run(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "stopped with an error")
		os.Exit(1)
	}
	log.Info("stopped")
}

func parseLevel(s string) (zapcore.Level, error) {
	switch s {
	case "debug":
		return zapcore.DebugLevel, nil
	case "info":
		return zapcore.InfoLevel, nil
	case "error":
		return zapcore.ErrorLevel, nil
	}
	return 0, fmt.Errorf("--log-level %q: want debug, info or error", s)
}
