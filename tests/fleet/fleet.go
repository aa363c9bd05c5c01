// Package fleet runs whole-system scenarios: a real kube-apiserver, the real
// coordinator, simulated kubelets and one real agent per node, with every
// grant, cordon, stage, reboot and boot recorded for the invariant checker.
// The process fleet (real binaries) lives in internal/sim, which the demo
// shares.
package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/testbootc"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// Fleet is a running whole system: API server, registry, coordinator, nodes.
type Fleet struct {
	Env      *envtest.Env
	Kube     kubernetes.Interface
	Log      *sim.Log
	Registry string // host:port of the in-process OCI registry
	// API is the path every agent and the coordinator take to the API
	// server; API.Cut plays an outage. The harness itself connects directly.
	API *Outage

	mu      sync.Mutex
	pools   map[string]*Pool
	bad     map[string]func(node string) bool // digests pushed with PushBad(On)
	restart sync.Mutex                        // one coordinator restart at a time

	ctx          context.Context
	cancel       context.CancelFunc
	tb           testing.TB
	directAPI    bool   // Options.DirectAPI
	coordLog     string // the coordinator process's log, when it runs as one
	coordLogFrom int64  // where the running process's part of coordLog starts
	dir          string
	coordCfg     *rest.Config
	coordOpts    controller.Options
	agentOpts    func(*agent.Config)
	coordCancel  context.CancelFunc
	coordDone    chan struct{}
	coordBin     string
	coordProc    *sim.Process
	light        bool
	logger       *slog.Logger
	verbose      bool
}

// Pool is one pool of the fleet and its nodes.
type Pool struct {
	Name  string
	Repo  string // registry/repository its images are pushed to
	Nodes []*SimNode
	f     *Fleet
}

// Options configure a fleet.
type Options struct {
	// Verbose sends agent and coordinator logs to the test log.
	Verbose bool
	// Env is an API server to share; nil starts one for this fleet.
	Env *envtest.Env
	// Coordinator adjusts the coordinator's options.
	Coordinator func(*controller.Options)
	// Agent adjusts every agent's configuration.
	Agent func(*agent.Config)
	// CoordinatorBinary, when set, runs that bootc-fleet-coordinator
	// executable as a child process at its production defaults (Coordinator
	// does not apply) instead of in-process, so its CPU time and memory can
	// be measured apart from the harness (CoordinatorPID).
	CoordinatorBinary string
	// LightAgents runs a LightAgent on every node instead of the real agent.
	LightAgents bool
	// DirectAPI connects agents to the API server itself, not through the
	// Outage proxy (API): no API outages can be injected, and a node costs
	// one socket instead of three sockets and two splice pipes, which is
	// what lets 5,000 nodes fit under an open-file limit of 20,000.
	DirectAPI bool
}

// PoolOptions configure one pool.
type PoolOptions struct {
	Nodes          int
	MaxUnavailable int
	MaxStaging     int
	HaltAfter      int
	RebootTimeout  time.Duration
	DrainTimeout   time.Duration
	// RebootPolicy of the pool (default Reboot).
	RebootPolicy fleetv1.RebootPolicy
	Behaviour    func(i int) NodeBehaviour
	// Arch is node i's architecture (linux); nil: amd64.
	Arch func(i int) string
	// Mutate adjusts the pool Create writes (pacing, windows, ...).
	Mutate func(*fleetv1.BootcNodePool)
	// Labels are extra labels on node i's Node (zone, canary); nil: none.
	Labels func(i int) map[string]string
}

// Start builds the shared part of a fleet: registry, RBAC and admission
// policies, the event recorder and the coordinator (with its own identity).
// Pools and their nodes come with AddPool.
func Start(tb testing.TB, opts Options) *Fleet {
	tb.Helper()
	env := opts.Env
	if env == nil {
		env = envtest.Start(tb)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &Fleet{Env: env, Log: &sim.Log{}, ctx: ctx, cancel: cancel, tb: tb, dir: tb.TempDir(), pools: map[string]*Pool{}, verbose: opts.Verbose}
	tb.Cleanup(f.Stop)
	var err error
	if f.Kube, err = kubernetes.NewForConfig(env.Config); err != nil {
		tb.Fatal(err)
	}
	f.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if path := os.Getenv("BOOTC_FLEET_SIM_LOG"); path != "" {
		// Every agent's and the coordinator's log, for a post-mortem.
		lf, err := os.Create(path)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { lf.Close() })
		f.logger = slog.New(slog.NewTextHandler(lf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if opts.Verbose {
		f.logger = slog.New(slog.NewTextHandler(testWriter{tb}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	// controller-runtime's global logger (used by its client-go plumbing).
	setGlobalLogger.Do(func() { ctrllog.SetLogger(logr.FromSlogHandler(f.logger.Handler())) })

	// Registry over real HTTP on loopback.
	srv := httptest.NewServer(registry.New(registry.Logger(sim.NopLogger())))
	tb.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	f.Registry = u.Host

	u2, err := url.Parse(env.Config.Host)
	if err != nil {
		tb.Fatal(err)
	}
	if f.API, err = NewOutage(u2.Host); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(f.API.Close)

	root := envtest.RepoRoot()
	for _, p := range []string{"packaging/rbac/agent.yaml", "packaging/rbac/coordinator.yaml", "packaging/policy/agent-policy.yaml", "packaging/policy/coordinator-policy.yaml"} {
		if err := envtest.Apply(ctx, env.Client, filepath.Join(root, p)); err != nil {
			tb.Fatal(err)
		}
	}
	if f.coordCfg, err = env.AddUser("system:serviceaccount:bootc-fleet-system:bootc-fleet-coordinator",
		"system:serviceaccounts", "system:serviceaccounts:bootc-fleet-system"); err != nil {
		tb.Fatal(err)
	}
	f.coordCfg.Host = "https://" + f.API.Addr()
	f.coordOpts = controller.Options{
		ResolveInterval:    time.Second,
		LeaseDuration:      15 * time.Second,
		RequeueInterval:    time.Second,
		InsecureRegistries: []string{f.Registry},
		Logger:             logr.FromSlogHandler(f.logger.Handler()),
	}
	if opts.Coordinator != nil {
		opts.Coordinator(&f.coordOpts)
	}
	f.agentOpts = opts.Agent
	f.coordBin, f.light, f.directAPI = opts.CoordinatorBinary, opts.LightAgents, opts.DirectAPI
	go sim.FinishPodDeletions(ctx, f.Kube)
	if err := sim.Record(ctx, f.Kube, f.Log, poolOfNode); err != nil {
		tb.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		tb.Fatal(err)
	}
	if err := sim.RecordPools(ctx, dyn, f.Log); err != nil {
		tb.Fatal(err)
	}
	f.StartCoordinator()
	return f
}

// poolOfNode: nodes are named <pool>-node-<i>.
func poolOfNode(node string) string {
	if at := strings.LastIndex(node, "-node-"); at > 0 {
		return node[:at]
	}
	return ""
}

// AddPool creates nodes <name>-node-<i> booted on a fresh image pushed as
// <repo>:v1, starts their agents, and creates the pool rolling out tag.
// The pool's image is pushed by the caller (Push) before or after.
func (f *Fleet) AddPool(name string, opts PoolOptions) *Pool {
	f.tb.Helper()
	p := &Pool{Name: name, Repo: f.Registry + "/" + name, f: f}
	v1 := p.Push("v1")
	for i := 0; i < opts.Nodes; i++ {
		n, err := f.addNode(p, fmt.Sprintf("%s-node-%02d", name, i), v1, opts, i)
		if err != nil {
			f.tb.Fatal(err)
		}
		p.Nodes = append(p.Nodes, n)
	}
	f.mu.Lock()
	f.pools[name] = p
	f.mu.Unlock()
	return p
}

func (f *Fleet) addNode(p *Pool, nodeName, image string, opts PoolOptions, i int) (*SimNode, error) {
	m, err := testbootc.NewBooted(image)
	if err != nil {
		return nil, err
	}
	cfg, err := f.Env.AddUser("system:node:"+nodeName, "system:nodes")
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 50, 100
	if !f.directAPI {
		cfg.Host = "https://" + f.API.Addr()
	}
	stateDir := filepath.Join(f.dir, nodeName)
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, err
	}
	b := NodeBehaviour{BootTime: 300 * time.Millisecond, StageTime: 100 * time.Millisecond}
	if opts.Behaviour != nil {
		b = opts.Behaviour(i)
	}
	m.Configure(func(k *testbootc.Knobs) {
		k.Generation = b.Generation
		k.SoftRebootCapable = b.SoftRebootCapable
	})
	arch := "amd64"
	if opts.Arch != nil {
		arch = opts.Arch(i)
	}
	labels := map[string]string{sim.PoolLabel: p.Name}
	if opts.Labels != nil {
		for k, v := range opts.Labels(i) {
			labels[k] = v
		}
	}
	n := &SimNode{
		Name: nodeName, Pool: p.Name, Machine: m, bootc: testbootc.NewMem(m),
		Kubelet:   &sim.Kubelet{Client: f.Kube, Node: nodeName, Labels: labels, OS: "linux", Arch: arch},
		behaviour: b, log: f.Log, rest: cfg, stateDir: stateDir, fleet: f,
		logger: f.logger.With("node", nodeName),
	}
	n.agentCfg = func() agent.Config {
		c := agent.Config{
			NodeName: nodeName, RESTConfig: cfg, StateDir: stateDir,
			PollInterval: 2 * time.Second, SettleTimeout: 90 * time.Second, RebootTimeout: time.Minute,
			RereadInterval: 200 * time.Millisecond, ReportInterval: 10 * time.Second, StageRetry: 500 * time.Millisecond,
			CommandTimeout: 30 * time.Second, Version: "fleet-sim",
		}
		if f.agentOpts != nil {
			f.agentOpts(&c)
		}
		return c
	}
	n.light = f.light
	if err := n.Kubelet.Register(f.ctx, m.BootID()); err != nil {
		return nil, err
	}
	n.StartAgent(f.ctx)
	return n, nil
}

// Push uploads a new random image as the pool's repo:tag and returns its repo@sha256.
func (p *Pool) Push(tag string) string {
	f := p.f
	f.tb.Helper()
	img, err := random.Image(512, 1)
	if err != nil {
		f.tb.Fatal(err)
	}
	ref, err := name.ParseReference(p.Repo+":"+tag, name.Insecure)
	if err != nil {
		f.tb.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		f.tb.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		f.tb.Fatal(err)
	}
	return p.Repo + "@" + d.String()
}

// Create creates the BootcNodePool over the pool's nodes, rolling out tag.
func (p *Pool) Create(tag string, opts PoolOptions) {
	f := p.f
	f.tb.Helper()
	mu, ms := intstr.FromInt32(int32(max(opts.MaxUnavailable, 1))), intstr.FromInt32(int32(max(opts.MaxStaging, 1)))
	halt := int32(max(opts.HaltAfter, 1))
	drain := opts.DrainTimeout
	if drain <= 0 {
		drain = 20 * time.Second
	}
	bnp := &fleetv1.BootcNodePool{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name},
		Spec: fleetv1.BootcNodePoolSpec{
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{sim.PoolLabel: p.Name}},
			Image:        p.Repo + ":" + tag,
			Rollout: fleetv1.RolloutSpec{MaxUnavailable: &mu, MaxStaging: &ms, HaltAfterFailures: &halt,
				DrainTimeout: &metav1.Duration{Duration: drain}},
		},
	}
	if opts.RebootTimeout > 0 {
		bnp.Spec.Rollout.RebootTimeout = &metav1.Duration{Duration: opts.RebootTimeout}
	}
	if opts.RebootPolicy != "" {
		bnp.Spec.RebootPolicy = opts.RebootPolicy
	}
	if opts.Mutate != nil {
		opts.Mutate(bnp)
	}
	if err := f.Env.Client.Create(f.ctx, bnp); err != nil {
		f.tb.Fatal(err)
	}
}

// SetImage points the pool at repo:tag (a mid-rollout image change) with a
// merge patch of spec.image, as `kubectl patch` would: the coordinator's
// status writes meanwhile cannot make it conflict (five quick conflict
// retries of an update could all lose on a busy machine).
func (p *Pool) SetImage(tag string) error {
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"image": p.Repo + ":" + tag}})
	if err != nil {
		return err
	}
	return p.f.Env.Client.Patch(p.f.ctx, &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: p.Name}}, client.RawPatch(types.MergePatchType, patch))
}

// StartCoordinator runs the coordinator in-process with its own identity.
func (f *Fleet) StartCoordinator() {
	f.tb.Helper()
	if f.coordBin != "" {
		f.startCoordinatorProc()
		return
	}
	c, err := controller.New(f.coordCfg, f.coordOpts)
	if err != nil {
		f.tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx); err != nil && ctx.Err() == nil {
			f.tb.Errorf("coordinator: %v", err)
		}
	}()
	f.mu.Lock()
	f.coordCancel, f.coordDone = cancel, done
	f.mu.Unlock()
}

// RestartCoordinator crashes the coordinator and starts a new one after
// pause. Concurrent restarts (seeds sharing a fleet) take turns, so one
// coordinator runs at a time.
func (f *Fleet) RestartCoordinator(pause time.Duration) {
	f.restart.Lock()
	defer f.restart.Unlock()
	f.StopCoordinator()
	time.Sleep(pause)
	if f.ctx.Err() != nil {
		return // the fleet stopped meanwhile: nothing may start again
	}
	f.StartCoordinator()
}

// StopCoordinator stops the coordinator and waits for it (a crash, as far
// as the cluster can tell: it leaves everything as it was).
func (f *Fleet) StopCoordinator() {
	f.mu.Lock()
	cancel, done := f.coordCancel, f.coordDone
	f.coordCancel, f.coordDone = nil, nil
	proc := f.coordProc
	f.coordProc = nil
	f.mu.Unlock()
	proc.Stop(10 * time.Second)
	if cancel != nil {
		cancel()
		<-done
	}
}

// Stop ends everything the fleet started.
func (f *Fleet) Stop() {
	f.StopCoordinator()
	f.mu.Lock()
	var nodes []*SimNode
	for _, p := range f.pools {
		nodes = append(nodes, p.Nodes...)
	}
	f.mu.Unlock()
	for _, n := range nodes {
		n.StopAgent()
	}
	f.cancel()
}

// Converged reports whether every live node is booted on target and Idle.
func (p *Pool) Converged(target string) (bool, string) {
	f := p.f
	var waiting []string
	for _, n := range p.Nodes {
		if n.Dead() || n.Hostile() {
			continue // a hostile node never converges
		}
		if n.Down() || n.Machine.BootedImage() != target || target == "" {
			waiting = append(waiting, n.Name)
		}
	}
	if len(waiting) > 0 {
		// The machines decide it: no API reads while they are not there
		// (callers poll this, and 1,000 reads per poll would load the API
		// server more than the fleet does).
		return false, strings.Join(waiting, ",")
	}
	var list fleetv1.BootcNodeList
	if err := f.Env.Client.List(f.ctx, &list); err != nil {
		return false, "listing BootcNodes: " + err.Error()
	}
	phase := make(map[string]fleetv1.NodePhase, len(list.Items))
	for _, bn := range list.Items {
		phase[bn.Name] = bn.Status.Phase
	}
	for _, n := range p.Nodes {
		if ph, ok := phase[n.Name]; !n.Dead() && !n.Hostile() && (!ok || ph != fleetv1.PhaseIdle) {
			waiting = append(waiting, n.Name+"("+string(ph)+")")
		}
	}
	return len(waiting) == 0, strings.Join(waiting, ",")
}

// Status returns the pool's status.
func (p *Pool) Status() fleetv1.BootcNodePoolStatus {
	bnp := &fleetv1.BootcNodePool{}
	_ = p.f.Env.Client.Get(p.f.ctx, client.ObjectKey{Name: p.Name}, bnp)
	return bnp.Status
}

// Halted reports whether the pool's Halted condition is True.
func (p *Pool) Halted() bool {
	for _, c := range p.Status().Conditions {
		if c.Type == fleetv1.PoolHalted && c.Status == metav1.ConditionTrue {
			return true
		}
	}
	return false
}

// Final collects the pool's end state for the invariant checker.
func (p *Pool) Final(target string) invariant.Final {
	f := p.f
	fin := invariant.Final{Target: map[string]string{p.Name: target}, Halted: map[string]bool{p.Name: p.Halted()}, Nodes: map[string]invariant.FinalNode{}}
	for _, n := range p.Nodes {
		s := n.Machine.State()
		fn := invariant.FinalNode{Pool: p.Name, Healthy: !n.Dead()}
		if s.Booted != nil {
			fn.Booted = s.Booted.Image
		}
		bn := &fleetv1.BootcNode{}
		if err := f.Env.Client.Get(f.ctx, client.ObjectKey{Name: n.Name}, bn); err == nil {
			fn.Phase, fn.Reason = string(bn.Status.Phase), bn.Status.Reason
		}
		fin.Nodes[n.Name] = fn
	}
	return fin
}

// Remove stops the pool's agents and deletes its pool, Nodes, BootcNodes
// and slot Leases, so a long campaign does not pile up finished pools for
// the coordinator to keep reconciling.
func (p *Pool) Remove() {
	f := p.f
	for _, n := range p.Nodes {
		n.retire()
		n.StopAgent()
	}
	ctx := f.ctx
	_ = f.Env.Client.Delete(ctx, &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: p.Name}})
	for _, n := range p.Nodes {
		_ = f.Kube.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
		_ = f.Env.Client.Delete(ctx, &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: n.Name}})
	}
	_ = f.Kube.CoordinationV1().Leases(lease.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + p.Name})
	f.mu.Lock()
	delete(f.pools, p.Name)
	f.mu.Unlock()
}

// Events returns the logged events of this pool.
func (p *Pool) Events() []invariant.Event {
	var out []invariant.Event
	for _, e := range p.f.Log.Events() {
		if e.Pool == p.Name {
			out = append(out, e)
		}
	}
	return out
}

// Check runs the invariant checker over the pool's whole run.
func (p *Pool) Check(target string, budget invariant.Pool) []invariant.Violation {
	return invariant.Check(p.Events(), map[string]invariant.Pool{p.Name: budget}, p.Final(target))
}

// Reboots counts each node's agent-issued reboots, soft or full.
func (p *Pool) Reboots() map[string]int {
	out := map[string]int{}
	for _, e := range p.Events() {
		if e.Kind == invariant.Reboot {
			out[e.Node]++
		}
	}
	return out
}

// SoftReboots counts each node's agent-issued soft reboots.
func (p *Pool) SoftReboots() map[string]int {
	out := map[string]int{}
	for _, e := range p.Events() {
		if e.Kind == invariant.Reboot && e.Soft {
			out[e.Node]++
		}
	}
	return out
}

// RebootGrants counts, per node, the reboot grants that reached phase
// Reboot (each may be spent on exactly one reboot).
func (p *Pool) RebootGrants() map[string]int {
	seen := map[string]bool{}
	out := map[string]int{}
	for _, e := range p.Events() {
		if e.Kind != invariant.LeaseVersion || e.Phase != lease.PhaseReboot {
			continue
		}
		key := e.Lease + "/" + e.Holder + "/" + e.BootID + "/" + e.Image
		if !seen[key] {
			seen[key] = true
			out[e.Holder]++
		}
	}
	return out
}

// NodeNames returns the node names, sorted.
func (p *Pool) NodeNames() []string {
	var out []string
	for _, n := range p.Nodes {
		out = append(out, n.Name)
	}
	sort.Strings(out)
	return out
}

// Ready lists the Nodes whose Ready condition is True.
func (f *Fleet) Ready() map[string]bool {
	out := map[string]bool{}
	nodes, err := f.Kube.CoreV1().Nodes().List(f.ctx, metav1.ListOptions{})
	if err != nil {
		return out
	}
	for _, n := range nodes.Items {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				out[n.Name] = true
			}
		}
	}
	return out
}

var setGlobalLogger sync.Once

type testWriter struct{ tb testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
