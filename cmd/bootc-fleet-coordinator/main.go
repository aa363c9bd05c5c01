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
	"runtime/debug"
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
	f := parseFlags()
	if f.showVersion {
		fmt.Println("bootc-fleet-coordinator", version)
		return
	}
	lvl, err := f.check()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bootc-fleet-coordinator:", err)
		os.Exit(2)
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
	if pct, ok := gcPercent(os.LookupEnv); ok {
		debug.SetGCPercent(pct)
		log.Info("Go GC percent", "GOGC", pct)
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		log.Error(err, "no API server configuration")
		os.Exit(1)
	}
	f.opts.Logger = log
	c, err := controller.New(cfg, f.opts)
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

// flags is the command line: the coordinator's options, and what main
// itself reads.
type flags struct {
	opts        controller.Options
	showVersion bool
	logLevel    string
}

func parseFlags() *flags {
	f := &flags{}
	o := &f.opts
	var insecure stringList
	flag.BoolVar(&f.showVersion, "version", false, "print the version and exit")
	flag.BoolVar(&o.LeaderElection, "leader-elect", false, "elect one active replica through a Lease")
	flag.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", lease.Namespace, "namespace of the leader-election Lease")
	flag.StringVar(&o.MetricsBindAddress, "metrics-bind-address", ":8443", "address of /metrics (0 disables)")
	flag.BoolVar(&o.MetricsSecure, "metrics-secure", true, "serve /metrics over HTTPS to callers the API server authenticates and authorizes (get on the non-resource URL /metrics); false serves plain HTTP to anyone")
	flag.StringVar(&o.MetricsCertDir, "metrics-cert-dir", "", "directory with tls.crt and tls.key for /metrics (reloaded on change); empty: a self-signed certificate")
	flag.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (0 disables)")
	flag.StringVar(&o.PprofBindAddress, "pprof-bind-address", "0", "address of Go's /debug/pprof/ profiles, plain HTTP and unauthenticated: bind it to localhost (0 disables)")
	flag.DurationVar(&o.ResolveInterval, "resolve-interval", controller.DefaultResolveInterval, "how often a tag is re-resolved to a digest")
	flag.DurationVar(&o.LeaseDuration, "lease-duration", controller.DefaultLeaseDuration, "leaseDurationSeconds written on grants; a stage grant whose holder was not seen reporting for this long expires")
	flag.DurationVar(&o.QuietAfter, "quiet-after", controller.DefaultQuietAfter, "a node with rollout work whose agent has not reported for this long is counted and named on its pool")
	flag.DurationVar(&o.RequeueInterval, "requeue-interval", controller.DefaultRequeueInterval, "longest time a pool goes without a reconcile")
	flag.IntVar(&o.Workers, "workers", controller.DefaultWorkers, "pools reconciled at once")
	flag.DurationVar(&o.ResolveTimeout, "resolve-timeout", 30*time.Second, "bound on one registry lookup")
	flag.DurationVar(&o.HealthQueryInterval, "health-query-interval", controller.DefaultHealthQueryInterval, "how long a pool's spec.health.metrics query result is used before the query runs again")
	flag.DurationVar(&o.HealthQueryTimeout, "health-query-timeout", controller.DefaultHealthQueryTimeout, "bound on one spec.health.metrics query, its Secrets' reads included")
	flag.StringVar(&f.logLevel, "log-level", "info", "debug, info or error")
	flag.StringVar(&o.RegistryCAFile, "registry-ca-file", "", "PEM bundle of CAs trusted for registries, in addition to the system's")
	flag.StringVar(&o.RegistryAuthFile, "registry-auth-file", "", "docker config.json with registry credentials for every pool (e.g. a mounted kubernetes.io/dockerconfigjson Secret); a pool's spec.imagePullSecret comes first")
	flag.Var(&insecure, "insecure-registry", "registry host[:port] reachable over plain HTTP (repeatable)")
	// --kubeconfig is registered by controller-runtime: the flag, then
	// $KUBECONFIG, then the in-cluster config, then ~/.kube/config.
	flag.Parse()
	o.InsecureRegistries = insecure
	return f
}

// check refuses flags the coordinator cannot run with, and returns the
// log level.
func (f *flags) check() (zapcore.Level, error) {
	lvl, err := parseLevel(f.logLevel)
	if err != nil {
		return 0, err
	}
	if f.opts.LeaseDuration < 4*time.Second {
		return 0, fmt.Errorf("--lease-duration must be at least 4s (agents report 4 times per lease), got %s", f.opts.LeaseDuration)
	}
	if f.opts.Workers < 1 {
		return 0, fmt.Errorf("--workers must be at least 1, got %d", f.opts.Workers)
	}
	if f.opts.RegistryAuthFile != "" {
		if err := controller.CheckRegistryAuthFile(f.opts.RegistryAuthFile); err != nil {
			return 0, err
		}
	}
	return lvl, nil
}

// defaultGCPercent is the coordinator's GOGC: the heap may grow by half
// what is live before a collection, not by all of it (Go's 100). Most of
// what it holds is its caches, live for as long as it runs, so the slack
// over them is what a lower GOGC saves, for a collection twice as often;
// with a memory limit (GOMEMLIMIT, above) the collector also runs when the
// limit nears, whatever GOGC says.
const defaultGCPercent = 50

// gcPercent is the GOGC the coordinator sets (ok), defaultGCPercent unless
// the GOGC environment variable is set (not empty): then the runtime has
// read it, and it wins.
func gcPercent(lookup func(string) (string, bool)) (pct int, ok bool) {
	if v, set := lookup("GOGC"); set && v != "" {
		return 0, false
	}
	return defaultGCPercent, true
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
