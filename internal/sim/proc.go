package sim

// Process fleet: every node runs the real bootc-fleet-agent binary and the
// coordinator is the real bootc-fleet-coordinator binary. Each node has its
// own test-bootc state directory and boot-ID file, its own private
// dbus-daemon with fake logind and systemd1 (logind's name is unique per
// bus), its own NOTIFY_SOCKET and a kubeconfig for system:node:<name>.
//
// What the event log can know, and how:
//   - LeaseVersion, Cordon, Uncordon: Record (watches of the API server).
//   - StageStart, Apply: the step "stage" or "apply" of the agent's trace
//     (--trace-file, JSON lines), which it writes right after the grant's
//     consistent read and right before it runs bootc switch or bootc
//     upgrade. The step names the lease version that read returned
//     (GrantLease/GrantRV). CheckInvocations cross-checks the counts against
//     the test bootc's own log of what ran.
//   - StageEnd: the trace's "stage-ended" step (finished, failed, rejected
//     or cancelled), or the agent process ending. Traced a little late,
//     which only makes the staging count (I2) stricter.
//   - Reboot: the fake logind's Reboot call, with the grant of the agent's
//     last traced step "reboot"; a soft reboot is logind's
//     RebootWithFlags(SD_LOGIND_SOFT_REBOOT), with the step "soft-reboot".
//     Its image is what the machine boots next (the staged deployment, or
//     the rollback deployment `bootc rollback` queued).
//   - Boot: the harness plays the reboot, so it knows the new boot and the
//     image booted; it also sets the node's fake systemd to what a boot of
//     that image says (PushBad).
//   - ContentBoot: the boot the last `bootc status` before the step's
//     confirmation described. The test bootc logs when each status ran; the
//     harness knows when each boot began and until when its status stayed
//     stale. A read logged inside a stale window counts as stale even if it
//     ran a moment after the window closed, so I5 can only be stricter.
//   - CurrentBoot/BootID: the harness's own machine state; the agent is
//     stopped while a reboot is played, so every traced step belongs to one boot.

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/controlplane"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// CoordinatorIdentity is the coordinator's service account user.
const CoordinatorIdentity = "system:serviceaccount:bootc-fleet-system:bootc-fleet-coordinator"

// ProcBinaries are the executables a process fleet runs.
type ProcBinaries struct {
	Agent, Coordinator, Bootc string
}

// BuildProcBinaries builds bootc-fleet-agent, bootc-fleet-coordinator and
// test-bootc into dir with one `go build`, as the release builds them
// (CoordinatorBuildFlags).
func BuildProcBinaries(ctx context.Context, dir string) (ProcBinaries, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return ProcBinaries{}, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ProcBinaries{}, err
	}
	args := append([]string{"build"}, CoordinatorBuildFlags...)
	args = append(args, "-o", abs+"/",
		"./cmd/bootc-fleet-agent", "./cmd/bootc-fleet-coordinator", "./internal/sim/testbootc/cmd/test-bootc")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = controlplane.RepoRoot()
	cmd.Env = buildEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		return ProcBinaries{}, fmt.Errorf("go build: %w\n%s", err, out)
	}
	return ProcBinaries{
		Agent:       filepath.Join(abs, "bootc-fleet-agent"),
		Coordinator: filepath.Join(abs, "bootc-fleet-coordinator"),
		Bootc:       filepath.Join(abs, "test-bootc"),
	}, nil
}

// ProcOptions configure a process fleet.
type ProcOptions struct {
	Env   *controlplane.Env // the API server (required)
	Bin   ProcBinaries      // required
	Dir   string            // state, logs and kubeconfigs (required)
	Nodes int
	Pool  string // default "pool"
	// BootTime is how long a node is down in a reboot (default 300ms).
	BootTime time.Duration
	// StaleAfterReboot keeps bootc status showing the previous boot this
	// long after the node is up again (default 1s).
	StaleAfterReboot time.Duration
	// StageTime is how long a bootc switch takes (default 0).
	StageTime time.Duration
	// InitialTag is pushed and booted on every node (default "v1").
	InitialTag string
	// RebootPolicy of the pool CreatePool creates (default Reboot).
	RebootPolicy fleetv1.RebootPolicy
	// Mutate, when set, adjusts the pool CreatePool creates (health gate,
	// canaries, ...) before it is written.
	Mutate func(*fleetv1.BootcNodePool)
	// SoftRebootCapable: what the nodes stage is soft-reboot capable.
	SoftRebootCapable bool
	// Replicas, when 2 or more, runs that many coordinator processes with
	// --leader-elect, each logging to its own file (Replicas, KillLeader).
	Replicas int
	// Private, when set, replaces the plain-HTTP registry: images are
	// pushed with PrivatePush, every node's test bootc pulls for real from
	// it (Knobs.Pull) with the host files NodeRoot writes under its root,
	// and the coordinator trusts its CA (--registry-ca-file).
	Private *PrivateRegistry
}

// PrivateRegistry is a TLS registry with authentication for a process fleet.
type PrivateRegistry struct {
	Host  string // host:port
	CAPEM []byte
	// Push pushes a new image at os:<tag> and returns it as repo@sha256.
	Push func(tag string) (string, error)
	// NodeRoot writes a node's host files (auth.json, certs.d, policy.json)
	// under root before its agent starts.
	NodeRoot func(node, root string) error
	// PullSecret names a Secret in bootc-fleet-system that CreatePool puts
	// in spec.imagePullSecret ("" none).
	PullSecret string
	// RequireSignedImages is the pool's spec.requireSignedImages.
	RequireSignedImages bool
}

// ProcFleet is a running fleet of process agents and a process coordinator.
type ProcFleet struct {
	Env      *controlplane.Env
	Kube     kubernetes.Interface
	Log      *Log
	Registry string // host:port of the in-process OCI registry
	Pool     string
	Nodes    []*ProcNode
	Dir      string
	// CoordinatorLog is the coordinator's output.
	CoordinatorLog string

	opts     ProcOptions
	ctx      context.Context
	cancel   context.CancelFunc
	registry *httptest.Server
	coord    *Process
	replicas []*CoordReplica // leader-elected replicas, in start order
	reboots  sync.WaitGroup  // reboots being played
	once     sync.Once

	mu      sync.Mutex
	closing bool
	images  map[string]string // tag -> repo@sha256
	bad     map[string]bool   // digests pushed with PushBad
	pool    invariant.Pool
}

// StartProcFleet starts the registry (with the initial image), RBAC and
// admission policies, N nodes booted on the initial image with their agents,
// and the coordinator. The pool is created by CreatePool. Close ends
// everything; on an error, what was started is already ended.
func StartProcFleet(ctx context.Context, opts ProcOptions) (_ *ProcFleet, err error) {
	if opts.Env == nil || opts.Bin.Agent == "" || opts.Bin.Coordinator == "" || opts.Bin.Bootc == "" || opts.Dir == "" {
		return nil, errors.New("ProcOptions: Env, Bin and Dir are required")
	}
	if opts.Pool == "" {
		opts.Pool = "pool"
	}
	if opts.BootTime <= 0 {
		opts.BootTime = 300 * time.Millisecond
	}
	if opts.StaleAfterReboot <= 0 {
		opts.StaleAfterReboot = time.Second
	}
	if opts.InitialTag == "" {
		opts.InitialTag = "v1"
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	fctx, cancel := context.WithCancel(context.Background())
	f := &ProcFleet{Env: opts.Env, Log: &Log{}, Pool: opts.Pool, Dir: dir, opts: opts,
		ctx: fctx, cancel: cancel, images: map[string]string{}}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if f.Kube, err = kubernetes.NewForConfig(opts.Env.Config); err != nil {
		return nil, err
	}
	if opts.Private != nil {
		f.Registry = opts.Private.Host
	} else {
		f.registry = httptest.NewServer(registry.New(registry.Logger(NopLogger())))
		u, _ := url.Parse(f.registry.URL)
		f.Registry = u.Host
	}
	root := controlplane.RepoRoot()
	for _, p := range []string{"packaging/rbac/agent.yaml", "packaging/rbac/coordinator.yaml", "packaging/policy/agent-policy.yaml", "packaging/policy/coordinator-policy.yaml"} {
		if err := controlplane.Apply(ctx, opts.Env.Client, filepath.Join(root, p)); err != nil {
			return nil, err
		}
	}
	initial, err := f.Push(opts.InitialTag)
	if err != nil {
		return nil, err
	}
	go FinishPodDeletions(fctx, f.Kube)
	if err := Record(fctx, f.Kube, f.Log, func(string) string { return f.Pool }); err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(opts.Env.Config)
	if err != nil {
		return nil, err
	}
	if err := RecordPools(fctx, dyn, f.Log); err != nil {
		return nil, err
	}
	for i := 0; i < opts.Nodes; i++ {
		n, err := f.addNode(ctx, fmt.Sprintf("node-%d", i), initial)
		if err != nil {
			return nil, err
		}
		f.Nodes = append(f.Nodes, n)
	}
	if err := f.startCoordinator(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *ProcFleet) startCoordinator() error {
	if f.opts.Replicas > 1 {
		for i := 0; i < f.opts.Replicas; i++ {
			if _, err := f.StartReplica(); err != nil {
				return err
			}
		}
		return nil
	}
	f.CoordinatorLog = filepath.Join(f.Dir, "coordinator.log")
	p, err := f.startCoordinatorProcess(f.CoordinatorLog)
	if err != nil {
		return err
	}
	f.coord = p
	return nil
}

// startCoordinatorProcess starts the coordinator binary with the fleet's
// flags (and extra), appending its output to logPath.
func (f *ProcFleet) startCoordinatorProcess(logPath string, extra ...string) (*Process, error) {
	kc, err := f.Env.KubeconfigFor(f.Dir, CoordinatorIdentity, "system:serviceaccounts", "system:serviceaccounts:bootc-fleet-system")
	if err != nil {
		return nil, err
	}
	out, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer out.Close() // the child holds its own descriptor
	args := []string{
		"--kubeconfig", kc,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--resolve-interval", "1s", "--requeue-interval", "1s", "--lease-duration", "15s",
	}
	if pr := f.opts.Private; pr != nil {
		ca := filepath.Join(f.Dir, "registry-ca.pem")
		if err := os.WriteFile(ca, pr.CAPEM, 0o644); err != nil {
			return nil, err
		}
		args = append(args, "--registry-ca-file", ca)
	} else {
		args = append(args, "--insecure-registry", f.Registry)
	}
	return StartProcess(f.opts.Bin.Coordinator, append(args, extra...), MinimalEnv(), out)
}

// StopCoordinator stops the coordinator process (SIGTERM, then SIGKILL).
func (f *ProcFleet) StopCoordinator() {
	f.mu.Lock()
	p := f.coord
	f.coord = nil
	f.mu.Unlock()
	p.Stop(10 * time.Second)
}

// Push uploads a new random image under tag and returns its repo@sha256.
func (f *ProcFleet) Push(tag string) (string, error) {
	if f.opts.Private != nil {
		pinned, err := f.opts.Private.Push(tag)
		if err != nil {
			return "", err
		}
		f.mu.Lock()
		f.images[tag] = pinned
		f.mu.Unlock()
		return pinned, nil
	}
	img, err := random.Image(512, 1)
	if err != nil {
		return "", err
	}
	ref, err := name.ParseReference(f.Registry+"/os:"+tag, name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img); err != nil {
		return "", fmt.Errorf("pushing %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	pinned := f.Registry + "/os@" + d.String()
	f.mu.Lock()
	f.images[tag] = pinned
	f.mu.Unlock()
	return pinned, nil
}

// Images returns the pushed images, tag -> repo@sha256.
func (f *ProcFleet) Images() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]string, len(f.images))
	for k, v := range f.images {
		out[k] = v
	}
	return out
}

// TagRef is the pool image reference of a pushed tag.
func (f *ProcFleet) TagRef(tag string) string { return f.Registry + "/os:" + tag }

// CreatePool creates the pool over every node, rolling out tag.
func (f *ProcFleet) CreatePool(ctx context.Context, tag string, maxUnavailable, maxStaging int) error {
	mu, ms := intstr.FromInt32(int32(max(maxUnavailable, 1))), intstr.FromInt32(int32(max(maxStaging, 1)))
	halt := int32(1)
	p := &fleetv1.BootcNodePool{
		ObjectMeta: metav1.ObjectMeta{Name: f.Pool},
		Spec: fleetv1.BootcNodePoolSpec{
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{PoolLabel: f.Pool}},
			Image:        f.TagRef(tag),
			Rollout: fleetv1.RolloutSpec{MaxUnavailable: &mu, MaxStaging: &ms, HaltAfterFailures: &halt,
				DrainTimeout:  &metav1.Duration{Duration: 20 * time.Second},
				RebootTimeout: &metav1.Duration{Duration: 2 * time.Minute}},
			RebootPolicy: f.opts.RebootPolicy,
		},
	}
	if pr := f.opts.Private; pr != nil {
		p.Spec.ImagePullSecret, p.Spec.RequireSignedImages = pr.PullSecret, pr.RequireSignedImages
	}
	if f.opts.Mutate != nil {
		f.opts.Mutate(p)
	}
	f.mu.Lock()
	f.pool = invariant.Pool{MaxUnavailable: max(maxUnavailable, 1), MaxStaging: max(maxStaging, 1), HaltAfter: 1}
	f.mu.Unlock()
	return f.Env.Client.Create(ctx, p)
}

// SetPoolImage points the pool at tag.
func (f *ProcFleet) SetPoolImage(ctx context.Context, tag string) error {
	p := &fleetv1.BootcNodePool{}
	if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: f.Pool}, p); err != nil {
		return err
	}
	patch := client.MergeFrom(p.DeepCopy())
	p.Spec.Image = f.TagRef(tag)
	return f.Env.Client.Patch(ctx, p, patch)
}

// PoolStatus returns the pool's status.
func (f *ProcFleet) PoolStatus(ctx context.Context) (fleetv1.BootcNodePoolStatus, error) {
	p := &fleetv1.BootcNodePool{}
	err := f.Env.Client.Get(ctx, client.ObjectKey{Name: f.Pool}, p)
	return p.Status, err
}

// Converged reports whether every node is up, Ready, uncordoned, booted on
// target and Idle, and no slot of the pool is held but stage slots whose
// holders are done with them (plan.StageFinished: released lazily,
// amendment 31); otherwise it names what is still pending.
func (f *ProcFleet) Converged(ctx context.Context, target string) (bool, string) {
	var pending []string
	bns := map[string]*fleetv1.BootcNode{}
	nodes, err := f.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err.Error()
	}
	byName := map[string]corev1.Node{}
	for _, n := range nodes.Items {
		byName[n.Name] = n
	}
	for _, n := range f.Nodes {
		m, err := n.Bootc.Machine()
		if err != nil || n.Down() || m.State().Booted == nil || m.State().Booted.Image != target {
			pending = append(pending, n.Name+"(not booted on target)")
			continue
		}
		if kn := byName[n.Name]; kn.Spec.Unschedulable || !NodeReady(&kn) {
			pending = append(pending, n.Name+"(cordoned or not Ready)")
			continue
		}
		bn := &fleetv1.BootcNode{}
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, bn); err != nil || bn.Status.Phase != fleetv1.PhaseIdle {
			pending = append(pending, n.Name+"("+string(bn.Status.Phase)+")")
			continue
		}
		bns[n.Name] = bn
	}
	leases, err := f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + f.Pool})
	if err != nil {
		return false, err.Error()
	}
	for _, l := range leases.Items {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && !finishedStage(f.Pool, &l, byName, bns) {
			pending = append(pending, l.Name+" held by "+*l.Spec.HolderIdentity)
		}
	}
	return len(pending) == 0, strings.Join(pending, ", ")
}

// finishedStage: l is a stage slot whose holder, converged (its BootcNode in
// bns), is done with it, as the coordinator reads it (plan.StageFinished).
func finishedStage(pool string, l *coordinationv1.Lease, nodes map[string]corev1.Node, bns map[string]*fleetv1.BootcNode) bool {
	s, ok := plan.ParseSlot(pool, l)
	bn, converged := bns[s.Holder]
	kn, exists := nodes[s.Holder]
	return ok && converged && exists && StageSlotFinished(pool, l, &kn, bn)
}

// StageSlotFinished says whether l is a stage slot of pool held by the
// node of kn and bn that is done with it, as the coordinator reads it
// (plan.StageFinished): such a slot stays held until the next stage grant
// hands it on (design.md, amendment 31).
func StageSlotFinished(pool string, l *coordinationv1.Lease, kn *corev1.Node, bn *fleetv1.BootcNode) bool {
	s, ok := plan.ParseSlot(pool, l)
	if !ok || s.State != plan.SlotHeld || s.Kind != lease.KindStage || s.Holder != kn.Name || s.Holder != bn.Name {
		return false
	}
	n := plan.Node{Name: kn.Name, BootID: kn.Status.NodeInfo.BootID}
	var st *fleetv1.BootcNodeStatus
	if bn.Status.BootID == n.BootID {
		st = &bn.Status
	}
	return plan.StageFinished(s.Grant, n, st, false)
}

// NodeReady says whether n's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Final collects the end state for the invariant checker.
func (f *ProcFleet) Final(ctx context.Context, target string) invariant.Final {
	fin := invariant.Final{Target: map[string]string{f.Pool: target}, Halted: map[string]bool{}, Nodes: map[string]invariant.FinalNode{}}
	if st, err := f.PoolStatus(ctx); err == nil {
		for _, c := range st.Conditions {
			if c.Type == fleetv1.PoolHalted && c.Status == metav1.ConditionTrue {
				fin.Halted[f.Pool] = true
			}
		}
	}
	for _, n := range f.Nodes {
		fn := invariant.FinalNode{Pool: f.Pool, Healthy: true}
		if m, err := n.Bootc.Machine(); err == nil && m.State().Booted != nil {
			fn.Booted = m.State().Booted.Image
		}
		bn := &fleetv1.BootcNode{}
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, bn); err == nil {
			fn.Phase, fn.Reason = string(bn.Status.Phase), bn.Status.Reason
		}
		fin.Nodes[n.Name] = fn
	}
	return fin
}

// Budget is the pool's budget as created.
func (f *ProcFleet) Budget() invariant.Pool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pool
}

// Check runs the invariant checker over the whole run.
func (f *ProcFleet) Check(ctx context.Context, target string) []invariant.Violation {
	return invariant.Check(f.Log.Events(), map[string]invariant.Pool{f.Pool: f.Budget()}, f.Final(ctx, target))
}

// CheckInvocations compares the stage and apply events derived from the
// agents' traces with what the test bootc says ran: every `switch` and every
// `upgrade` must have been logged, and nothing else.
func (f *ProcFleet) CheckInvocations() error {
	var errs []error
	for _, n := range f.Nodes {
		n.mu.Lock()
		errs = append(errs, n.traceErrs...)
		n.mu.Unlock()
		inv, err := n.Bootc.Invocations()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// A stage is one switch (then, on bootc 1.16, an upgrade
		// --download-only that locks it); an apply is upgrade
		// --from-downloaded; a rollback is rollback; --help is the
		// agent's probe.
		switches, upgrades, rollbacks := 0, 0, 0
		for _, i := range inv {
			switch {
			case len(i.Args) == 0 || slices.Contains(i.Args, "--help"):
			case i.Args[0] == "switch":
				switches++
			case i.Args[0] == "upgrade" && slices.Contains(i.Args, "--from-downloaded"):
				upgrades++
			case i.Args[0] == "rollback":
				rollbacks++
			}
		}
		if s, a := f.Log.Count(invariant.StageStart, n.Name), f.Log.Count(invariant.Apply, n.Name); s != switches || a != upgrades {
			errs = append(errs, fmt.Errorf("%s: logged %d stage starts and %d applies, test bootc ran %d switches and %d upgrades",
				n.Name, s, a, switches, upgrades))
		}
		if r := n.Rollbacks(); r != rollbacks {
			errs = append(errs, fmt.Errorf("%s: traced %d confirmed rollbacks, test bootc ran %d", n.Name, r, rollbacks))
		}
	}
	return errors.Join(errs...)
}

// Reboots counts each node's agent-issued reboots, soft or full.
func (f *ProcFleet) Reboots() map[string]int {
	out := map[string]int{}
	for _, e := range f.Log.Events() {
		if e.Kind == invariant.Reboot {
			out[e.Node]++
		}
	}
	return out
}

// SoftReboots counts each node's agent-issued soft reboots.
func (f *ProcFleet) SoftReboots() map[string]int {
	out := map[string]int{}
	for _, e := range f.Log.Events() {
		if e.Kind == invariant.Reboot && e.Soft {
			out[e.Node]++
		}
	}
	return out
}

// Close ends everything the fleet started: played reboots, agents,
// coordinator, buses, sockets and the registry. It is safe to call twice.
func (f *ProcFleet) Close() {
	f.once.Do(func() {
		f.mu.Lock()
		f.closing = true // no new reboot is played
		f.mu.Unlock()
		f.cancel() // a reboot being played starts no agent
		f.reboots.Wait()
		f.StopCoordinator()
		f.stopReplicas()
		var wg sync.WaitGroup
		for _, n := range f.Nodes {
			wg.Add(1)
			go func() { defer wg.Done(); n.close() }()
		}
		wg.Wait()
		if f.registry != nil {
			f.registry.Close()
		}
	})
}

// beginReboot registers a reboot to play, unless the fleet is closing.
func (f *ProcFleet) beginReboot() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closing {
		return false
	}
	f.reboots.Add(1)
	return true
}
