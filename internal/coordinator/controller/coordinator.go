// Package controller runs the coordinator: a controller-runtime manager whose
// BootcNodePool reconciler reads a pool's world, asks internal/coordinator/plan what
// to change, and makes those changes (docs/coordinator.md).
package controller

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/authn"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/drain"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/metrics"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/metricsauth"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/resolve"
)

// Resolver resolves an image reference to a digest and, for a multi-arch
// index, its per-platform images (internal/coordinator/resolve).
type Resolver interface {
	Resolve(ctx context.Context, ref string, auth authn.Keychain) (resolve.Target, error)
}

// Defaults of Options.
const (
	DefaultResolveInterval  = 5 * time.Minute
	DefaultLeaseDuration    = 2 * time.Minute
	DefaultRequeueInterval  = time.Minute
	DefaultWorkers          = 4
	DefaultQuietAfter       = 3 * time.Minute
	DefaultLeaderElectionID = "bootc-fleet-coordinator"
)

// Options configures a Coordinator. Zero values take the defaults above, so
// tests set only the intervals they want short.
type Options struct {
	// LeaderElection makes replicas elect one leader through a Lease in
	// LeaderElectionNamespace; only the leader reconciles and drains.
	LeaderElection          bool
	LeaderElectionNamespace string // default bootc-fleet-system
	LeaderElectionID        string // default bootc-fleet-coordinator
	// Leader-election timings (nil: controller-runtime's 15s/10s/2s).
	LeaderElectionLeaseDuration, LeaderElectionRenewDeadline, LeaderElectionRetryPeriod *time.Duration

	// MetricsBindAddress serves /metrics; "" or "0" disables it.
	MetricsBindAddress string
	// MetricsSecure serves /metrics over HTTPS to callers the API server
	// authenticates (TokenReview) and authorizes (SubjectAccessReview for
	// get on the non-resource URL /metrics), as kubebuilder scaffolds do.
	MetricsSecure bool
	// MetricsCertDir holds tls.crt and tls.key for the metrics server
	// (reloaded when they change); "" or missing files: a self-signed
	// certificate made at start.
	MetricsCertDir string
	// HealthProbeBindAddress serves /healthz and /readyz; "" or "0" disables it.
	HealthProbeBindAddress string
	// PprofBindAddress serves Go's /debug/pprof/ profiles; "" or "0"
	// disables it. It has no authentication: for localhost only.
	PprofBindAddress string

	// ResolveInterval is how often a tag is re-resolved to a digest.
	ResolveInterval time.Duration
	// ResolveRetryInterval is how soon a failed resolution is retried
	// (default: RequeueInterval).
	ResolveRetryInterval time.Duration
	// LeaseDuration is written on every grant; a stage grant whose holder
	// the coordinator has seen no report from for this long expires.
	LeaseDuration time.Duration
	// QuietAfter is how long a node with rollout work may go without a new
	// report before the pool counts and names it (default 3m: agents
	// report at least every minute while they have work).
	QuietAfter time.Duration
	// RequeueInterval bounds how long a pool goes without a reconcile.
	RequeueInterval time.Duration
	// Workers is how many pools are reconciled at once (default 4). One
	// pool is never reconciled by two workers at a time; pools share no
	// slots, so they need no ordering between them.
	Workers int

	// InsecureRegistries may be reached over plain HTTP (host or host:port).
	InsecureRegistries []string
	// ResolveTimeout bounds one registry lookup (0: the resolver's default).
	ResolveTimeout time.Duration
	// RegistryCAFile is a PEM bundle of CAs trusted for registries, on top of
	// the system's ("": the system's only).
	RegistryCAFile string
	// RegistryAuthFile is a docker config.json with registry credentials
	// used for every pool, after the pool's own spec.imagePullSecret.
	RegistryAuthFile string

	// HealthQueryInterval is how long a pool's metrics health query result
	// is used before it is run again (default 15s): one query per pool per
	// interval however often the pool is reconciled.
	HealthQueryInterval time.Duration
	// HealthQueryTimeout bounds one metrics health query, its Secrets'
	// reads included (default 10s); the pass waits at most that long.
	HealthQueryTimeout time.Duration

	// Resolver and Drainer replace the real ones (nil: internal/coordinator/resolve
	// and internal/coordinator/drain).
	Resolver Resolver
	Drainer  NodeDrainer

	// Clock is the coordinator's clock (nil: time.Now). Its readings go into
	// grants and pace the rollout; no agent compares them with its own.
	Clock func() time.Time

	// Name tells coordinators apart in logs and Events (default
	// bootc-fleet-coordinator). Several may run in one process.
	Name   string
	Logger logr.Logger
}

func (o *Options) defaults() {
	if o.LeaderElectionNamespace == "" {
		o.LeaderElectionNamespace = lease.Namespace
	}
	if o.LeaderElectionID == "" {
		o.LeaderElectionID = DefaultLeaderElectionID
	}
	if o.ResolveInterval <= 0 {
		o.ResolveInterval = DefaultResolveInterval
	}
	if o.LeaseDuration < time.Second {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RequeueInterval <= 0 {
		o.RequeueInterval = DefaultRequeueInterval
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.QuietAfter <= 0 {
		o.QuietAfter = DefaultQuietAfter
	}
	if o.ResolveRetryInterval <= 0 {
		o.ResolveRetryInterval = o.RequeueInterval
	}
	if o.MetricsBindAddress == "" {
		o.MetricsBindAddress = "0"
	}
	if o.HealthProbeBindAddress == "" {
		o.HealthProbeBindAddress = "0"
	}
	if o.HealthQueryInterval <= 0 {
		o.HealthQueryInterval = DefaultHealthQueryInterval
	}
	if o.HealthQueryTimeout <= 0 {
		o.HealthQueryTimeout = DefaultHealthQueryTimeout
	}
	if o.Name == "" {
		o.Name = DefaultLeaderElectionID
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
}

// Coordinator is a configured manager, ready to Run.
type Coordinator struct {
	mgr manager.Manager
}

// New builds a coordinator for the cluster cfg points at.
func New(cfg *rest.Config, opts Options) (*Coordinator, error) {
	opts.defaults()
	log := opts.Logger
	if log.GetSink() == nil {
		log = ctrl.Log.WithName(opts.Name)
	}
	undecodable := newUndecodables(log.WithName("read"))
	mopts, err := managerOptions(cfg, opts, log, undecodable)
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, mopts)
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	if err := opts.realParts(cfg, log); err != nil {
		return nil, err
	}
	r, err := newPoolReconciler(mgr, opts, log, undecodable)
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(undecodable); err != nil {
		return nil, err
	}
	if err := r.setup(mgr); err != nil {
		return nil, fmt.Errorf("setting up the BootcNodePool controller: %w", err)
	}
	if err := addProbes(mgr); err != nil {
		return nil, err
	}
	if err := addLeaderGauge(mgr); err != nil {
		return nil, err
	}
	return &Coordinator{mgr: mgr}, nil
}

// managerOptions configures the manager: its caches (slot Leases only,
// slim Nodes, BootcNodes and pools read leniently), metrics, probes and
// leader election.
func managerOptions(cfg *rest.Config, opts Options, log logr.Logger, undecodable *undecodables) (manager.Options, error) {
	// Only the pools' slot Leases are cached, not every Lease of the cluster.
	hasPool, err := labels.NewRequirement(lease.LabelPool, selection.Exists, nil)
	if err != nil {
		return manager.Options{}, err
	}
	scheme := Scheme()
	// BootcNodes and pools are read leniently: one object the typed scheme
	// cannot decode is set aside and named, not a failed list (undecodable.go).
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return manager.Options{}, fmt.Errorf("creating dynamic client: %w", err)
	}
	return manager.Options{
		Scheme:                        scheme,
		Logger:                        log,
		Metrics:                       metricsOptions(opts),
		HealthProbeBindAddress:        opts.HealthProbeBindAddress,
		PprofBindAddress:              opts.PprofBindAddress,
		LeaderElection:                opts.LeaderElection,
		LeaderElectionID:              opts.LeaderElectionID,
		LeaderElectionNamespace:       opts.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 opts.LeaderElectionLeaseDuration,
		RenewDeadline:                 opts.LeaderElectionRenewDeadline,
		RetryPeriod:                   opts.LeaderElectionRetryPeriod,
		GracefulShutdownTimeout:       ptr.To(30 * time.Second),
		Cache: cache.Options{
			NewInformer: undecodable.newInformer(dyn, scheme),
			// Nothing the coordinator decides reads managedFields; at 5,000
			// nodes they are much of what Nodes and BootcNodes hold. What
			// objects share is kept once (intern.go).
			DefaultTransform: sharedStrings(cache.TransformStripManagedFields()),
			ByObject: map[client.Object]cache.ByObject{
				&coordinationv1.Lease{}: {
					Namespaces: map[string]cache.Config{lease.Namespace: {}},
					Label:      labels.NewSelector().Add(*hasPool),
				},
				&corev1.Node{}: {Transform: slimNode()},
			}},
	}, nil
}

// realParts sets the real Resolver and Drainer where the options name none.
func (o *Options) realParts(cfg *rest.Config, log logr.Logger) error {
	if o.Resolver == nil {
		ro := resolve.Options{Insecure: o.InsecureRegistries, Timeout: o.ResolveTimeout}
		if o.RegistryCAFile != "" {
			tr, err := resolve.TransportWithCAFile(o.RegistryCAFile)
			if err != nil {
				return err
			}
			ro.Transport = tr
		}
		o.Resolver = resolve.New(ro)
	}
	if o.Drainer == nil {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("creating clientset: %w", err)
		}
		o.Drainer = drain.New(cs, log.WithName("drain"))
	}
	return nil
}

// newPoolReconciler builds the reconciler and adds to mgr the runnables it
// needs: the drain tracker, the image lookups and the BootcNode writer.
func newPoolReconciler(mgr manager.Manager, opts Options, log logr.Logger, undecodable *undecodables) (*poolReconciler, error) {
	auth := &registryAuth{reader: mgr.GetAPIReader(), namespace: secretNamespace, file: opts.RegistryAuthFile}
	drains := newDrainTracker(opts.Drainer, log.WithName("drain"))
	if err := mgr.Add(drains); err != nil {
		return nil, err
	}
	// Image lookups run in the background, on the leader only (amendment 33).
	targets := newTargetCache(opts.Resolver, auth, opts.ResolveInterval, opts.ResolveRetryInterval, log.WithName("resolve"))
	if err := mgr.Add(targets); err != nil {
		return nil, err
	}
	writes := newOwnWrites()
	bootcNodes := newBootcNodeWriter(mgr.GetClient(), writes, log.WithName("bootcnodes"))
	if err := mgr.Add(bootcNodes); err != nil {
		return nil, err
	}
	return &poolReconciler{
		client:        mgr.GetClient(),
		cache:         mgr.GetCache(),
		apiReader:     mgr.GetAPIReader(),
		undecodable:   undecodable,
		writes:        writes,
		bootcNodes:    bootcNodes,
		recorder:      mgr.GetEventRecorder(opts.Name),
		drains:        drains,
		targets:       targets,
		opts:          opts,
		log:           log,
		waiting:       map[string]time.Time{},
		progress:      newPoolProgress(),
		statusWritten: map[string]time.Time{},
		statusDue:     map[string]time.Duration{},
		seen:          newHeartbeats(),
		slotClock:     newSlotClock(),
		stages:        newStageTimers(),
		gate:          newHealthGate(mgr.GetAPIReader(), opts, log.WithName("health")),
	}, nil
}

// addProbes serves /healthz, and /readyz once the caches synced: a replica
// that cannot read the API server is not ready.
func addProbes(mgr manager.Manager) error {
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("readyz", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return fmt.Errorf("caches not synced")
		}
		return nil
	})
}

// addLeaderGauge sets metrics.Leader to 1 while this replica leads: the
// manager starts a RunnableFunc only once elected (at once without leader
// election) and stops it when it stops leading.
func addLeaderGauge(mgr manager.Manager) error {
	metrics.Leader.Set(0)
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		metrics.Leader.Set(1)
		<-ctx.Done()
		metrics.Leader.Set(0)
		return nil
	}))
}

// Run runs the coordinator until ctx ends; it returns nil on a clean shutdown.
func (c *Coordinator) Run(ctx context.Context) error {
	return c.mgr.Start(ctx)
}

// Elected is closed once this replica leads (at once without leader election).
func (c *Coordinator) Elected() <-chan struct{} { return c.mgr.Elected() }

// Scheme has the built-in kinds and fleet.bootc.dev/v1alpha1.
func Scheme() *k8sruntime.Scheme {
	s := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := fleetv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// metricsOptions serves /metrics plainly, or, with MetricsSecure, over TLS
// (HTTP/1.1 only: HTTP/2 stream floods, CVE-2023-44487, are not worth
// serving a scrape endpoint over) behind a TokenReview and a
// SubjectAccessReview per caller, as controller-runtime's authentication and
// authorization filter does (internal/coordinator/metricsauth says why not that filter).
func metricsOptions(opts Options) metricsserver.Options {
	mo := metricsserver.Options{BindAddress: opts.MetricsBindAddress}
	if !opts.MetricsSecure {
		return mo
	}
	mo.SecureServing = true
	mo.FilterProvider = metricsauth.Provider
	mo.CertDir = opts.MetricsCertDir
	mo.TLSOpts = []func(*tls.Config){func(c *tls.Config) {
		c.NextProtos = []string{"http/1.1"}
		c.MinVersion = tls.VersionTLS12
	}}
	return mo
}
