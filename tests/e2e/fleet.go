package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
)

// AgentUnit is the unit packaging/image/install.sh installs and enables.
const AgentUnit = "bootc-fleet-agent.service"

// Paths inside a node.
const (
	nodeAgentState = "/var/lib/bootc-fleet" // the unit's StateDirectory
	nodeBootcState = "/var/lib/test-bootc"  // test bootc's state
	// simSoftRebootLog: what e2e-soft-reboot.service did, on the node and the host side of nodeBootcState.
	simSoftRebootLog = nodeBootcState + "/sim-soft-reboot.log"
	nodeKubeconfig   = "/var/lib/kubelet/kubeconfig" // a kubelet kubeconfig path the agent finds by itself
	nodeAgentEnv     = "/etc/bootc-fleet/agent.env"  // site configuration
	gateFile         = "/run/bootc-fleet-e2e-gate"   // see e2eLayer
	// imageUnitDir is where an image's own units appear (Options.ImageUnits):
	// a directory of systemd's unit search path that Debian leaves empty.
	imageUnitDir = "/usr/local/lib/systemd/system"
)

// WatchdogSec is the agent's watchdog inside the nodes, shortened by a
// drop-in that exists only in the e2e root filesystem.
const WatchdogSec = 5

// NodeLabel selects the e2e nodes for a pool.
const NodeLabel = "node-restriction.kubernetes.io/bootc-fleet-e2e-pool"

// Fleet is N booted nodes plus the API server their agents talk to.
type Fleet struct {
	t      *testing.T
	Env    *envtest.Env
	Kube   kubernetes.Interface
	Root   string // the shared, installed root filesystem
	Nodes  []*Node
	Events *events

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Transition is one ActiveState/SubState change of the agent unit.
type Transition struct {
	At                  time.Time
	ActiveState, Sub    string
	StatusText, MainPID string // read when the unit became active
}

// BootLog is what the harness saw of one boot.
type BootLog struct {
	N               int
	BootID          string
	Image           string // what the test bootc said was booted as the boot started
	Started, Up     time.Time
	Down            time.Time
	Exit            int
	HarnessRebooted bool // the harness ran `systemctl reboot`, not the agent
	// Soft: this boot began with a soft reboot of the boot before it: the
	// same container and boot ID, systemd's SoftRebootsCount one higher.
	Soft             bool
	SoftRebootsCount uint32
	Transitions      []Transition
	AgentFirstActive time.Time
}

// Node is one machine of the fleet.
type Node struct {
	Name     string
	Machine  *Machine
	Bootc    testbootc.Dir // host side of nodeBootcState
	StateDir string        // host side of nodeAgentState
	// imageUnits is Options.ImageUnits.
	imageUnits map[string]string

	f  *Fleet
	mu sync.Mutex
	// cur is the running boot, nil while down.
	cur             *Boot
	boots           []*BootLog
	harnessRebooted bool
	softPlayed      int           // soft reboots the test bootc played, as last seen
	changed         chan struct{} // closed and replaced on every change
	stopped         bool
	trace           []string // what the boot follower saw, for failures
}

// Options shape a fleet.
type Options struct {
	Nodes  int
	Prefix string // node names: <prefix>-<i>
	// Booted is the image every node starts booted on (repo@sha256:...).
	Booted string
	// Pool labels the Nodes with NodeLabel=Pool.
	Pool string
	// Suite is the Debian release the nodes boot (default: $BOOTC_FLEET_E2E_SUITE,
	// else SuiteTrixie).
	Suite string
	// ImageUnits plays what an image ships beyond the shared root: a node
	// whose test bootc has the image named by a key (repo@sha256:...)
	// booted when the container starts boots with the host directory named
	// by the value bound read-only at imageUnitDir, so the units in it (and
	// their .wants/ links) exist in the boots of that image only, as units
	// an image ships do. Read at each full boot: a soft reboot keeps the
	// container and its binds.
	ImageUnits map[string]string
}

// NewFleet builds what the nodes need: root filesystem, API server, Node
// objects, per-node state. Boot starts them; everything stops when the test
// ends.
func NewFleet(t *testing.T, opts Options) *Fleet {
	t.Helper()
	SkipIfUnavailable(t)
	ctx, cancel := context.WithCancel(context.Background())
	f := &Fleet{t: t, Events: &events{}, ctx: ctx, cancel: cancel}
	bins := builds(t)
	if opts.Suite == "" {
		opts.Suite = os.Getenv(EnvSuite)
	}
	if opts.Suite == "" {
		opts.Suite = SuiteTrixie
	}
	base, err := BaseRootfs(ctx, opts.Suite, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	f.Env = envtest.Start(t)
	if f.Kube, err = kubernetes.NewForConfig(f.Env.Config); err != nil {
		t.Fatal(err)
	}
	root := envtest.RepoRoot()
	if err := envtest.Apply(ctx, f.Env.Client,
		filepath.Join(root, "packaging/rbac/agent.yaml"),
		filepath.Join(root, "packaging/policy/agent-policy.yaml")); err != nil {
		t.Fatal(err)
	}
	run := t.TempDir()
	if f.Root, err = InstalledRoot(t, base, run, bins); err != nil {
		t.Fatal(err)
	}
	go f.watchCordons()
	for i := 0; i < opts.Nodes; i++ {
		n, err := f.newNode(fmt.Sprintf("%s-%d", opts.Prefix, i), opts, run)
		if err != nil {
			t.Fatal(err)
		}
		f.Nodes = append(f.Nodes, n)
	}
	t.Cleanup(f.stop)
	return f
}

// Boot starts every node; each boots again after every reboot until the
// test ends.
func (f *Fleet) Boot() {
	for _, n := range f.Nodes {
		f.wg.Add(1)
		go n.run()
	}
}

func (f *Fleet) newNode(name string, opts Options, run string) (*Node, error) {
	dir := filepath.Join(run, name)
	n := &Node{Name: name, f: f, StateDir: filepath.Join(dir, "agent-state"), imageUnits: opts.ImageUnits, changed: make(chan struct{})}
	for _, d := range []string{dir, n.StateDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	m, err := testbootc.NewBooted(opts.Booted)
	if err != nil {
		return nil, err
	}
	if n.Bootc, err = testbootc.Init(filepath.Join(dir, "bootc"), m.State()); err != nil {
		return nil, err
	}
	kcUser, err := f.Env.KubeconfigFor(dir, "system:node:"+name, "system:nodes")
	if err != nil {
		return nil, err
	}
	// nspawn's --bind-ro splits on ':', which the user name contains.
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.Rename(kcUser, kc); err != nil {
		return nil, err
	}
	envFile := filepath.Join(dir, "agent.env")
	// The site configuration a user would write: only what differs in a
	// container (no /ostree to watch; the test bootc's state file instead).
	// Its file, not its directory: every test bootc call appends to a log
	// there, and a watch on the directory re-read status on each one.
	conf := "BOOTC_FLEET_AGENT_EXTRA_ARGS=\"--watch-path=" + nodeBootcState + "/" + testbootc.StateFile + " --poll-interval=5s --log-level=debug\"\n"
	if err := os.WriteFile(envFile, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	n.Machine = &Machine{
		Name: name, Root: f.Root, Dir: dir,
		Binds:   []string{n.StateDir + ":" + nodeAgentState, string(n.Bootc) + ":" + nodeBootcState},
		BindsRO: []string{kc + ":" + nodeKubeconfig, envFile + ":" + nodeAgentEnv},
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{NodeLabel: opts.Pool}}}
	if _, err := f.Kube.CoreV1().Nodes().Create(f.ctx, node, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	return n, f.kubelet(name, false, "")
}

// kubelet writes what a node's kubelet reports: Ready, and the boot ID.
func (f *Fleet) kubelet(name string, ready bool, bootID string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := f.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st, reason := corev1.ConditionFalse, "KubeletNotReady"
		if ready {
			st, reason = corev1.ConditionTrue, "KubeletReady"
		}
		now := metav1.Now()
		n.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: st, Reason: reason,
			LastHeartbeatTime: now, LastTransitionTime: now,
		}}
		if bootID != "" {
			n.Status.NodeInfo.BootID = bootID
		}
		_, err = f.Kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// watchCordons records every change of a Node's spec.unschedulable.
func (f *Fleet) watchCordons() {
	last := map[string]bool{}
	for f.ctx.Err() == nil {
		w, err := f.Kube.CoreV1().Nodes().Watch(f.ctx, metav1.ListOptions{})
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			if n.Spec.Unschedulable != last[n.Name] {
				last[n.Name] = n.Spec.Unschedulable
				what := evUncordon
				if n.Spec.Unschedulable {
					what = evCordon
				}
				f.Events.add(n.Name, what, "")
			}
		}
		w.Stop()
	}
}

// run boots the node again and again: after an exit with 133 (a reboot
// asked inside) the test bootc plays the reboot on the node's bootc state,
// then the node boots again; a poweroff or the end of the test stops it.
func (n *Node) run() {
	defer n.f.wg.Done()
	t := n.f.t
	for i := 1; ; i++ {
		image, binds, err := n.imageBinds()
		if err != nil {
			t.Errorf("%s: boot %d: %v", n.Name, i, err)
			n.setStopped()
			return
		}
		b, err := n.Machine.Start(n.f.ctx, i, binds...)
		if err != nil {
			if n.f.ctx.Err() == nil {
				t.Errorf("%s: boot %d: %v", n.Name, i, err)
			}
			n.setStopped()
			return
		}
		bl := &BootLog{BootID: b.BootID, Image: image, Started: b.Started, Up: b.Up}
		n.mu.Lock()
		bl.N = len(n.boots) + 1
		n.cur = b
		n.boots = append(n.boots, bl)
		n.harnessRebooted = false
		n.mu.Unlock()
		if err := n.f.kubelet(n.Name, true, b.BootID); err != nil {
			t.Errorf("%s: kubelet: %v", n.Name, err)
		}
		n.f.Events.add(n.Name, evUp, b.BootID)
		n.notify()
		n.followBoots(b, bl)
		code, err := b.Wait(context.Background())
		n.mu.Lock()
		n.cur = nil
		bl = n.boots[len(n.boots)-1]
		bl.Down, bl.Exit, bl.HarnessRebooted = time.Now(), code, n.harnessRebooted
		n.mu.Unlock()
		n.f.Events.add(n.Name, evDown, fmt.Sprint(code))
		if n.f.ctx.Err() != nil {
			n.setStopped()
			return
		}
		if err := n.f.kubelet(n.Name, false, ""); err != nil {
			t.Errorf("%s: kubelet: %v", n.Name, err)
		}
		if err != nil || code != exitReboot {
			if code != exitPoweroff {
				t.Errorf("%s: boot %d: systemd-nspawn exited with %d (%v); console: %s", n.Name, i, code, err, filepath.Join(n.Machine.Dir, fmt.Sprintf("console-%d.log", i)))
			}
			n.setStopped()
			return
		}
		if _, err := n.Bootc.Reboot(testbootc.RebootOptions{}); err != nil {
			t.Errorf("%s: test bootc reboot: %v", n.Name, err)
			n.setStopped()
			return
		}
		n.notify()
	}
}

// imageBinds reads the image the test bootc has booted and returns it with
// the binds of its units (Options.ImageUnits), if it ships any.
func (n *Node) imageBinds() (string, []string, error) {
	m, err := n.Bootc.Machine()
	if err != nil {
		return "", nil, fmt.Errorf("reading the test bootc's state: %w", err)
	}
	st := m.State()
	if st.Booted == nil {
		return "", nil, nil
	}
	if dir, ok := n.imageUnits[st.Booted.Image]; ok {
		n.tracef("booting %s: its units from %s at %s", st.Booted.Image, dir, imageUnitDir)
		return st.Booted.Image, []string{dir + ":" + imageUnitDir}, nil
	}
	return st.Booted.Image, nil, nil
}

func (n *Node) notify() {
	n.mu.Lock()
	close(n.changed)
	n.changed = make(chan struct{})
	n.mu.Unlock()
}

func (n *Node) setStopped() {
	n.mu.Lock()
	n.stopped = true
	n.mu.Unlock()
	n.notify()
}

// Current returns the running boot, or nil while the node is down.
func (n *Node) Current() *Boot {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cur
}

// Boots returns a copy of the boots so far.
func (n *Node) Boots() []BootLog {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]BootLog, len(n.boots))
	for i, b := range n.boots {
		out[i] = *b
		out[i].Transitions = append([]Transition(nil), b.Transitions...)
	}
	return out
}

// Await polls cond on every change of the node and every poll interval
// until it returns true or an error, or ctx ends.
func (n *Node) Await(ctx context.Context, what string, cond func() (bool, error)) error {
	for {
		n.mu.Lock()
		ch := n.changed
		stopped := n.stopped
		n.mu.Unlock()
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("%s: waiting for %s: %w", n.Name, what, err)
		}
		if ok {
			return nil
		}
		if stopped {
			return fmt.Errorf("%s: stopped while waiting for %s", n.Name, what)
		}
		select {
		case <-ch:
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("%s: waiting for %s: %w", n.Name, what, ctx.Err())
		}
	}
}

// Reboot makes the node reboot from inside, the way a person would
// (`systemctl reboot`), not through the agent.
func (n *Node) Reboot(ctx context.Context) error {
	b := n.Current()
	if b == nil {
		return fmt.Errorf("%s is down", n.Name)
	}
	n.mu.Lock()
	n.harnessRebooted = true
	n.mu.Unlock()
	_, err := b.Exec(ctx, "systemctl", "reboot")
	return err
}

// Journal returns the current boot's journal of the agent, of PID 1, logind
// and the e2e units (for failures): a soft reboot is PID 1's work.
func (n *Node) Journal(ctx context.Context) string {
	b := n.Current()
	if b == nil {
		return "(node down)"
	}
	out, err := b.Exec(ctx, "journalctl", "-b", "--no-pager", "-o", "short-iso-precise",
		"_SYSTEMD_UNIT="+AgentUnit, "+", "_PID=1", "+", "_COMM=systemd-logind", "+",
		"_SYSTEMD_UNIT=e2e-soft-reboot.service", "+", "_SYSTEMD_UNIT=e2e-gate.service")
	if err != nil {
		return err.Error()
	}
	return out
}

// stop powers every node off (SIGTERM to nspawn makes the container's
// systemd shut down), killing what does not stop in time.
func (f *Fleet) stop() {
	if f.t.Failed() {
		for _, n := range f.Nodes {
			f.t.Logf("%s journal:\n%s\n%s", n.Name, n.Journal(context.Background()), n.Diagnosis())
		}
	}
	f.cancel()
	for _, n := range f.Nodes {
		if b := n.Current(); b != nil {
			_ = syscall.Kill(b.cmd.Process.Pid, syscall.SIGTERM)
		}
	}
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		for _, n := range f.Nodes {
			if b := n.Current(); b != nil {
				_ = syscall.Kill(b.Leader, syscall.SIGKILL)
				b.Kill()
			}
		}
		<-done
	}
}

// binaries are the statically linked programs that go into the nodes.
type binaries struct {
	Agent, Bootc string
}

var (
	buildOnce sync.Once
	buildBins binaries
	buildErr  error
	buildDir  string
)

// builds compiles bootc-fleet-agent and test-bootc once per test binary,
// statically (CGO_ENABLED=0), as the image build does.
func builds(t *testing.T) binaries {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "bootc-fleet-e2e-bin-")
		if buildErr != nil {
			return
		}
		for _, b := range []struct{ out, pkg string }{
			{"bootc-fleet-agent", "./cmd/bootc-fleet-agent"},
			{"test-bootc", "./internal/sim/testbootc/cmd/test-bootc"},
		} {
			cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(buildDir, b.out), b.pkg)
			cmd.Dir = envtest.RepoRoot()
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
				return
			}
		}
		buildBins = binaries{Agent: filepath.Join(buildDir, "bootc-fleet-agent"), Bootc: filepath.Join(buildDir, "test-bootc")}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBins
}

// CleanupBuilds removes the binaries built by builds (call from TestMain).
func CleanupBuilds() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}
