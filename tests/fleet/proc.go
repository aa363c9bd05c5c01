package fleet

// Process fleet: every node runs the real bootc-fleet-agent binary and the
// coordinator is the real bootc-fleet-coordinator binary. Each node has its
// own test-bootc state directory and boot-ID file, its own private
// dbus-daemon with fake logind and systemd1 (logind's name is unique per
// bus), its own NOTIFY_SOCKET and a kubeconfig for system:node:<name>.
//
// What the event log can know, and how:
//   - LeaseVersion, Cordon, Uncordon: Record (watches of the API server).
//   - StageStart, Apply: the agent's "grant confirmed" log line for the step
//     "stage" or "apply", which it writes right before it runs bootc switch or
//     bootc upgrade. The line names the lease version the agent's renew
//     produced (GrantLease/GrantRV). CheckInvocations cross-checks the counts
//     against the test bootc's own log of what ran.
//   - StageEnd: the agent's "stage finished", "stage failed" or "stage
//     cancelled" line, or the agent process ending. Logged a little late,
//     which only makes the staging count (I2) stricter.
//   - Reboot: the fake logind's Reboot call, with the grant of the agent's
//     last "grant confirmed" line for the step "reboot".
//   - Boot: the harness plays the reboot, so it knows the new boot.
//   - ContentBoot: the boot the last `bootc status` before the step's
//     confirmation described. The test bootc logs when each status ran; the
//     harness knows when each boot began and until when its status stayed
//     stale. A read logged inside a stale window counts as stale even if it
//     ran a moment after the window closed, so I5 can only be stricter.
//   - CurrentBoot/BootID: the harness's own machine state; the agent is
//     stopped while a reboot is played, so every line belongs to one boot.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
	"github.com/bootc-fleet/bootc-fleet/tests/fakedbus"
	"github.com/bootc-fleet/bootc-fleet/tests/fleet/invariant"
	"github.com/bootc-fleet/bootc-fleet/tests/notifysock"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
)

// CoordinatorIdentity is the coordinator's service account user.
const CoordinatorIdentity = "system:serviceaccount:bootc-fleet-system:bootc-fleet-coordinator"

// ProcBinaries are the executables a process fleet runs.
type ProcBinaries struct {
	Agent, Coordinator, Bootc string
}

// BuildProcBinaries builds bootc-fleet-agent, bootc-fleet-coordinator and
// test-bootc into dir with one `go build`.
func BuildProcBinaries(ctx context.Context, dir string) (ProcBinaries, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return ProcBinaries{}, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ProcBinaries{}, err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", abs+"/",
		"./agent/cmd/bootc-fleet-agent", "./coordinator/cmd/bootc-fleet-coordinator", "./tests/testbootc/cmd/test-bootc")
	cmd.Dir = envtest.RepoRoot()
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
	Env   *envtest.Env // the API server (required)
	Bin   ProcBinaries // required
	Dir   string       // state, logs and kubeconfigs (required)
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
}

// ProcFleet is a running fleet of process agents and a process coordinator.
type ProcFleet struct {
	Env      *envtest.Env
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
	coord    *procProcess
	reboots  sync.WaitGroup // reboots being played
	once     sync.Once

	mu      sync.Mutex
	closing bool
	images  map[string]string // tag -> repo@sha256
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
	f.registry = httptest.NewServer(registry.New(registry.Logger(nopLogger())))
	u, _ := url.Parse(f.registry.URL)
	f.Registry = u.Host
	root := envtest.RepoRoot()
	for _, p := range []string{"packaging/rbac/agent.yaml", "packaging/rbac/coordinator.yaml", "packaging/policy/agent-policy.yaml"} {
		if err := envtest.Apply(ctx, opts.Env.Client, filepath.Join(root, p)); err != nil {
			return nil, err
		}
	}
	initial, err := f.Push(opts.InitialTag)
	if err != nil {
		return nil, err
	}
	go FinishPodDeletions(fctx, f.Kube, 100*time.Millisecond)
	if err := Record(fctx, f.Kube, f.Log, func(string) string { return f.Pool }); err != nil {
		return nil, err
	}
	for i := 0; i < opts.Nodes; i++ {
		n, err := f.addNode(ctx, fmt.Sprintf("node-%d", i), initial)
		if err != nil {
			return nil, err
		}
		f.Nodes = append(f.Nodes, n)
	}
	if err := f.startCoordinator(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *ProcFleet) startCoordinator(ctx context.Context) error {
	kc, err := f.Env.KubeconfigFor(f.Dir, CoordinatorIdentity, "system:serviceaccounts", "system:serviceaccounts:bootc-fleet-system")
	if err != nil {
		return err
	}
	f.CoordinatorLog = filepath.Join(f.Dir, "coordinator.log")
	out, err := os.OpenFile(f.CoordinatorLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close() // the child holds its own descriptor
	p, err := startProc(f.opts.Bin.Coordinator, []string{
		"--kubeconfig", kc,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--resolve-interval", "1s", "--requeue-interval", "1s", "--lease-duration", "15s",
		"--insecure-registry", f.Registry,
	}, minimalEnv(), out)
	if err != nil {
		return err
	}
	f.coord = p
	return nil
}

// StopCoordinator stops the coordinator process (SIGTERM, then SIGKILL).
func (f *ProcFleet) StopCoordinator() {
	f.mu.Lock()
	p := f.coord
	f.coord = nil
	f.mu.Unlock()
	p.stop(10 * time.Second)
}

// Push uploads a new random image under tag and returns its repo@sha256.
func (f *ProcFleet) Push(tag string) (string, error) {
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
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"bootc.dev/pool": f.Pool}},
			Image:        f.TagRef(tag),
			Rollout: fleetv1.RolloutSpec{MaxUnavailable: &mu, MaxStaging: &ms, HaltAfterFailures: &halt,
				DrainTimeout:  &metav1.Duration{Duration: 20 * time.Second},
				RebootTimeout: &metav1.Duration{Duration: 2 * time.Minute}},
		},
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
// target and Idle, and no slot of the pool is held; otherwise it names
// what is still pending.
func (f *ProcFleet) Converged(ctx context.Context, target string) (bool, string) {
	var pending []string
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
		if kn := byName[n.Name]; kn.Spec.Unschedulable || !nodeReady(&kn) {
			pending = append(pending, n.Name+"(cordoned or not Ready)")
			continue
		}
		bn := &fleetv1.BootcNode{}
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, bn); err != nil || bn.Status.Phase != fleetv1.PhaseIdle {
			pending = append(pending, n.Name+"("+string(bn.Status.Phase)+")")
		}
	}
	leases, err := f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + f.Pool})
	if err != nil {
		return false, err.Error()
	}
	for _, l := range leases.Items {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
			pending = append(pending, l.Name+" held by "+*l.Spec.HolderIdentity)
		}
	}
	return len(pending) == 0, strings.Join(pending, ", ")
}

func nodeReady(n *corev1.Node) bool {
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
// agents' logs with what the test bootc says ran: every `switch` and every
// `upgrade` must have been logged, and nothing else.
func (f *ProcFleet) CheckInvocations() error {
	var errs []error
	for _, n := range f.Nodes {
		inv, err := n.Bootc.Invocations()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		switches, upgrades := 0, 0
		for _, i := range inv {
			switch {
			case len(i.Args) > 0 && i.Args[0] == "switch":
				switches++
			case len(i.Args) > 0 && i.Args[0] == "upgrade":
				upgrades++
			}
		}
		if s, a := f.Log.Count(invariant.StageStart, n.Name), f.Log.Count(invariant.Apply, n.Name); s != switches || a != upgrades {
			errs = append(errs, fmt.Errorf("%s: logged %d stage starts and %d applies, test bootc ran %d switches and %d upgrades",
				n.Name, s, a, switches, upgrades))
		}
	}
	return errors.Join(errs...)
}

// Reboots counts each node's agent-issued reboots.
func (f *ProcFleet) Reboots() map[string]int {
	out := map[string]int{}
	for _, e := range f.Log.Events() {
		if e.Kind == invariant.Reboot {
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

// RebootTiming is one reboot as the harness played it.
type RebootTiming struct {
	From, To     string    // boot IDs
	Requested    time.Time // logind Reboot call
	AgentStopped time.Time
	Booted       time.Time // the machine is up in the new boot
	AgentReady   time.Time // the new agent sent READY=1
}

// ProcNode is one simulated host running the agent binary.
type ProcNode struct {
	Name    string
	Pool    string
	Bootc   testbootc.Dir
	Kubelet *Kubelet
	Login   *fakedbus.Login1
	Systemd *fakedbus.Systemd1
	// AgentLog is the agent's output over all its runs.
	AgentLog string

	f        *ProcFleet
	stateDir string
	watchDir string
	kc       string
	bus      string
	stopBus  func()
	notify   *notifysock.Socket

	mu        sync.Mutex
	cond      *sync.Cond
	agent     *procProcess
	boot      string // current boot as testbootc names it
	bootID    string
	windows   []procBoot
	confirms  map[string][]procConfirm // step -> confirmations of the running agent
	used      map[string]int
	staging   string // image of the stage in flight, as logged
	down      bool
	timings   []RebootTiming
	status    string // last STATUS= line
	agentRuns int
}

// procBoot is one boot of a node and its stale-status window.
type procBoot struct {
	start      time.Time
	boot, prev string
	staleUntil time.Time
}

// procConfirm is one "grant confirmed" line.
type procConfirm struct {
	at     time.Time
	lease  string
	rv     int64
	image  string
	bootID string
}

func (f *ProcFleet) addNode(ctx context.Context, nodeName, image string) (*ProcNode, error) {
	base := filepath.Join(f.Dir, nodeName)
	n := &ProcNode{Name: nodeName, Pool: f.Pool, f: f, stateDir: filepath.Join(base, "state"), watchDir: filepath.Join(base, "watch"),
		AgentLog: filepath.Join(base, "agent.log"), confirms: map[string][]procConfirm{}, used: map[string]int{}}
	n.cond = sync.NewCond(&n.mu)
	for _, d := range []string{n.stateDir, n.watchDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	p, err := testbootc.ParseSwitchRef(image)
	if err != nil {
		return nil, err
	}
	st := testbootc.State{Booted: &testbootc.Deployment{Image: p.String(), Digest: p.Digest}}
	st.Knobs.SwitchDelay = testbootc.Duration(f.opts.StageTime)
	if n.Bootc, err = testbootc.Init(filepath.Join(base, "bootc"), st); err != nil {
		return nil, err
	}
	m, err := n.Bootc.Machine()
	if err != nil {
		return nil, err
	}
	n.boot, n.bootID = m.Boot(), m.BootID()
	n.windows = []procBoot{{boot: n.boot}}
	if n.kc, err = f.Env.KubeconfigFor(base, "system:node:"+nodeName, "system:nodes"); err != nil {
		return nil, err
	}
	if n.bus, n.stopBus, err = fakedbus.StartBusProcess(ctx, base); err != nil {
		return nil, err
	}
	n.Login, n.Systemd = &fakedbus.Login1{OnReboot: n.onReboot}, &fakedbus.Systemd1{}
	if err := n.Login.Serve(n.bus); err != nil {
		n.close()
		return nil, err
	}
	if err := n.Systemd.Serve(n.bus); err != nil {
		n.close()
		return nil, err
	}
	if n.notify, err = notifysock.Open(); err != nil {
		n.close()
		return nil, err
	}
	go n.readNotify(n.notify)
	n.Kubelet = &Kubelet{Client: f.Kube, Node: nodeName, Labels: map[string]string{"bootc.dev/pool": f.Pool}}
	if err := n.Kubelet.Register(ctx, n.bootID); err != nil {
		n.close()
		return nil, err
	}
	if err := n.startAgent(); err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

// Down reports whether the node is in a reboot.
func (n *ProcNode) Down() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.down
}

// AgentStatus is the last STATUS= line the agent sent over sd_notify.
func (n *ProcNode) AgentStatus() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.status
}

// RebootTimings returns the reboots played so far.
func (n *ProcNode) RebootTimings() []RebootTiming {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]RebootTiming(nil), n.timings...)
}

// AgentRuns is how many times the agent process was started.
func (n *ProcNode) AgentRuns() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.agentRuns
}

func (n *ProcNode) startAgent() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.agent != nil || n.f.ctx.Err() != nil {
		return nil
	}
	logf, err := os.OpenFile(n.AgentLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	n.confirms, n.used = map[string][]procConfirm{}, map[string]int{}
	env := append(minimalEnv(),
		"DBUS_SYSTEM_BUS_ADDRESS="+n.bus,
		"NOTIFY_SOCKET="+n.notify.Path,
		testbootc.EnvState+"="+string(n.Bootc),
	)
	lw := &lineWriter{out: logf, line: n.onLogLine}
	p, err := startProc(n.f.opts.Bin.Agent, []string{
		"--kubeconfig", n.kc,
		"--node-name", n.Name,
		"--bootc", n.f.opts.Bin.Bootc,
		"--boot-id-file", n.Bootc.Path(testbootc.DefaultBootID),
		"--state-dir", n.stateDir,
		"--watch-path", n.watchDir,
		"--poll-interval", "2s",
		"--settle-timeout", "1m",
		"--reboot-timeout", "2m",
	}, env, lw)
	if err != nil {
		logf.Close()
		return err
	}
	go func() { <-p.done; lw.flush(); logf.Close() }()
	n.agent = p
	n.agentRuns++
	return nil
}

// stopAgent stops the agent as systemd would (SIGTERM, then SIGKILL) and,
// once every line it wrote is handled, ends a stage it left open.
func (n *ProcNode) stopAgent() {
	n.mu.Lock()
	p := n.agent
	n.agent = nil
	n.mu.Unlock()
	p.stop(20 * time.Second)
	n.mu.Lock()
	img := n.staging
	n.staging = ""
	n.mu.Unlock()
	if img != "" {
		n.f.Log.Add(invariant.Event{Kind: invariant.StageEnd, Node: n.Name, Pool: n.Pool, Image: img, Detail: "agent stopped"})
	}
}

func (n *ProcNode) close() {
	n.stopAgent()
	if n.Login != nil {
		n.Login.Close()
	}
	if n.Systemd != nil {
		n.Systemd.Close()
	}
	if n.stopBus != nil {
		n.stopBus()
	}
	if n.notify != nil {
		n.notify.Close()
	}
}

func (n *ProcNode) readNotify(s *notifysock.Socket) {
	for m := range s.Messages() {
		n.mu.Lock()
		switch {
		case strings.HasPrefix(m, "STATUS="):
			n.status = strings.TrimPrefix(m, "STATUS=")
		case m == "READY=1":
			if k := len(n.timings); k > 0 && !n.timings[k-1].Booted.IsZero() && n.timings[k-1].AgentReady.IsZero() {
				n.timings[k-1].AgentReady = time.Now()
			}
		}
		n.mu.Unlock()
	}
}

// onLogLine turns the agent's log lines into events.
func (n *ProcNode) onLogLine(line string) {
	kv := parseLogfmt(line)
	switch kv["msg"] {
	case "grant confirmed":
		at, _ := time.Parse(time.RFC3339Nano, kv["time"])
		rv, _ := strconv.ParseInt(kv["resourceVersion"], 10, 64)
		c := procConfirm{at: at, lease: kv["lease"], rv: rv, image: kv["image"], bootID: kv["bootID"]}
		step := kv["step"]
		n.mu.Lock()
		n.confirms[step] = append(n.confirms[step], c)
		n.cond.Broadcast()
		n.mu.Unlock()
		switch step {
		case "stage":
			e := n.action(invariant.StageStart, c.image, c)
			n.mu.Lock()
			n.staging = c.image
			n.mu.Unlock()
			n.f.Log.Add(e)
		case "apply":
			e := n.action(invariant.Apply, n.stagedImage(), c)
			n.f.Log.Add(e)
		}
	case "stage finished", "stage failed", "stage cancelled":
		n.mu.Lock()
		img := n.staging
		n.staging = ""
		n.mu.Unlock()
		if img != "" {
			n.f.Log.Add(invariant.Event{Kind: invariant.StageEnd, Node: n.Name, Pool: n.Pool, Image: img, Detail: kv["msg"]})
		}
	}
}

func (n *ProcNode) stagedImage() string {
	m, err := n.Bootc.Machine()
	if err != nil || m.State().Staged == nil {
		return ""
	}
	return m.State().Staged.Image
}

// action fills an action event: the node's boot now, the boot the last
// status read before the confirmation described, and the confirmed grant.
func (n *ProcNode) action(kind invariant.Kind, image string, c procConfirm) invariant.Event {
	content := n.contentBoot(c.at)
	n.mu.Lock()
	defer n.mu.Unlock()
	return invariant.Event{
		Kind: kind, Node: n.Name, Pool: n.Pool, Image: image,
		BootID: n.bootID, CurrentBoot: n.boot, ContentBoot: content,
		GrantLease: c.lease, GrantRV: c.rv,
	}
}

// contentBoot is the boot described by the last `bootc status` that ran
// before t ("" when none ran).
func (n *ProcNode) contentBoot(t time.Time) string {
	inv, err := n.Bootc.Invocations()
	if err != nil {
		return ""
	}
	var last time.Time
	for _, i := range inv {
		if len(i.Args) > 0 && i.Args[0] == "status" && !i.Time.After(t) {
			last = i.Time
		}
	}
	if last.IsZero() {
		return ""
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return bootAt(n.windows, last)
}

// bootAt classifies a status read at t: the boot it ran in, or the boot
// before it while that boot's stale window was open.
func bootAt(windows []procBoot, t time.Time) string {
	for i := len(windows) - 1; i >= 0; i-- {
		w := windows[i]
		if w.start.After(t) {
			continue
		}
		if t.Before(w.staleUntil) {
			return w.prev
		}
		return w.boot
	}
	return ""
}

// onReboot is the fake logind's Reboot: it logs the reboot under the grant
// the agent confirmed for it and plays the reboot in the background.
func (n *ProcNode) onReboot() {
	now := time.Now()
	c, ok := n.nextConfirm("reboot", 5*time.Second)
	img := n.stagedImage()
	var e invariant.Event
	if ok {
		e = n.action(invariant.Reboot, img, c)
	} else {
		e = n.action(invariant.Reboot, img, procConfirm{at: now})
		e.GrantLease, e.GrantRV, e.Detail = "", 0, "no confirmed reboot grant in the agent's log"
	}
	n.f.Log.Add(e)
	n.mu.Lock()
	if n.down || !n.f.beginReboot() {
		n.mu.Unlock()
		return
	}
	n.down = true
	n.timings = append(n.timings, RebootTiming{From: n.bootID, Requested: now})
	n.mu.Unlock()
	go func() {
		defer n.f.reboots.Done()
		n.playReboot()
	}()
}

// nextConfirm waits for a confirmation of step not yet used by an event.
func (n *ProcNode) nextConfirm(step string, timeout time.Duration) (procConfirm, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	deadline := time.Now().Add(timeout)
	t := time.AfterFunc(timeout, func() { n.mu.Lock(); n.cond.Broadcast(); n.mu.Unlock() })
	defer t.Stop()
	for len(n.confirms[step]) <= n.used[step] {
		if time.Now().After(deadline) {
			return procConfirm{}, false
		}
		n.cond.Wait()
	}
	n.used[step] = len(n.confirms[step])
	return n.confirms[step][n.used[step]-1], true
}

// playReboot: the agent stops, the Node goes NotReady, the machine reboots
// (an unlocked staged deployment becomes booted) with status stale for a
// while, the boot time passes, the node is Ready in its new boot, and the
// agent starts again.
func (n *ProcNode) playReboot() {
	ctx := n.f.ctx
	n.stopAgent()
	stopped := time.Now()
	_ = n.Kubelet.SetReady(ctx, false, "")
	var newBoot, newID string
	var until time.Time
	start := time.Now()
	err := n.Bootc.Update(func(m *testbootc.Machine) error {
		newID = m.Reboot(testbootc.RebootOptions{StaleFor: n.f.opts.StaleAfterReboot + n.f.opts.BootTime})
		newBoot = m.Boot()
		if s := m.State().Stale; s != nil {
			until = s.Until
		}
		return nil
	})
	n.mu.Lock()
	k := len(n.timings) - 1
	n.timings[k].AgentStopped = stopped
	if err == nil {
		n.windows = append(n.windows, procBoot{start: start, boot: newBoot, prev: n.boot, staleUntil: until})
		n.boot, n.bootID = newBoot, newID
		n.timings[k].To = newID
	}
	n.mu.Unlock()
	if err != nil {
		return // the machine could not reboot: it stays down
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(n.f.opts.BootTime):
	}
	n.f.Log.Add(invariant.Event{Kind: invariant.Boot, Node: n.Name, Pool: n.Pool, BootID: newID})
	n.mu.Lock()
	n.down = false
	n.timings[k].Booted = time.Now()
	n.mu.Unlock()
	_ = n.startAgent()
	_ = n.Kubelet.SetReady(ctx, true, newID)
}

// procProcess is a child in its own process group that dies with us.
type procProcess struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startProc(path string, args, env []string, out io.Writer) (*procProcess, error) {
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	// Its own group: a terminal's Ctrl-C reaches only the harness, which
	// stops children in order. Pdeathsig: a harness killed outright does
	// not leave them running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", path, err)
	}
	p := &procProcess{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// stop sends SIGTERM, waits up to grace, then kills the process group.
func (p *procProcess) stop(grace time.Duration) {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// minimalEnv keeps the children's environment to what they need, so the
// caller's KUBECONFIG or BOOTC_FLEET_* settings cannot change them.
func minimalEnv() []string {
	env := []string{"PATH=" + os.Getenv("PATH")}
	if h := os.Getenv("HOME"); h != "" {
		env = append(env, "HOME="+h)
	}
	return env
}

// lineWriter copies output to out and hands each complete line to line.
type lineWriter struct {
	out  io.Writer
	line func(string)
	mu   sync.Mutex
	buf  []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.out.Write(p)
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		l := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		w.line(l)
	}
	return len(p), nil
}

func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.line(string(w.buf))
		w.buf = nil
	}
}

// parseLogfmt reads a log/slog text line: key=value pairs, values either
// bare or Go-quoted. Malformed pairs are skipped.
func parseLogfmt(line string) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(line))
	sc.Buffer(make([]byte, 0, len(line)+1), len(line)+1)
	sc.Split(splitLogfmt)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok || k == "" {
			continue
		}
		if strings.HasPrefix(v, `"`) {
			u, err := strconv.Unquote(v)
			if err != nil {
				continue
			}
			v = u
		}
		out[k] = v
	}
	return out
}

// splitLogfmt splits at spaces outside double quotes.
func splitLogfmt(data []byte, atEOF bool) (int, []byte, error) {
	start := 0
	for start < len(data) && data[start] == ' ' {
		start++
	}
	quoted, escaped := false, false
	for i := start; i < len(data); i++ {
		c := data[i]
		switch {
		case escaped:
			escaped = false
		case c == '\\' && quoted:
			escaped = true
		case c == '"':
			quoted = !quoted
		case c == ' ' && !quoted:
			return i + 1, data[start:i], nil
		}
	}
	if atEOF && start < len(data) {
		return len(data), data[start:], nil
	}
	return start, nil, nil
}
