package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
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
	nodeAgentState = "/var/lib/bootc-fleet"        // the unit's StateDirectory
	nodeBootcState = "/var/lib/test-bootc"         // test bootc's state
	nodeKubeconfig = "/var/lib/kubelet/kubeconfig" // a kubelet kubeconfig path the agent finds by itself
	nodeAgentEnv   = "/etc/bootc-fleet/agent.env"  // site configuration
	gateFile       = "/run/bootc-fleet-e2e-gate"   // see e2eLayer
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

// tracef notes a step of the boot follower; a failing test prints them.
func (n *Node) tracef(format string, args ...any) {
	line := time.Now().UTC().Format("15:04:05.000 ") + fmt.Sprintf(format, args...)
	n.mu.Lock()
	n.trace = append(n.trace, line)
	n.mu.Unlock()
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
	n := &Node{Name: name, f: f, StateDir: filepath.Join(dir, "agent-state"), changed: make(chan struct{})}
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
	// container (no /ostree to watch; the test bootc's state instead).
	conf := "BOOTC_FLEET_AGENT_EXTRA_ARGS=\"--watch-path=" + nodeBootcState + " --poll-interval=5s --log-level=debug\"\n"
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
		b, err := n.Machine.Start(n.f.ctx, i)
		if err != nil {
			if n.f.ctx.Err() == nil {
				t.Errorf("%s: boot %d: %v", n.Name, i, err)
			}
			n.setStopped()
			return
		}
		bl := &BootLog{BootID: b.BootID, Started: b.Started, Up: b.Up}
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

// followBoots follows the agent in the container's boot bl, and in every
// boot a soft reboot starts in the same container, until the container
// exits. A soft reboot shows on the host as the node's system bus going
// away while the container runs on: the test bootc's soft-reboot count grows
// (e2e-soft-reboot.service, which runs once the agent stopped; the kubelet
// is down from then on), then systemd's SoftRebootsCount does (the new
// userspace runs; the kubelet is back, in the same boot ID). The count of
// the test bootc is watched too, so a bus follower that missed the bus
// closing cannot hold the next userspace's gate shut.
func (n *Node) followBoots(b *Boot, bl *BootLog) {
	t := n.f.t
	for {
		gone, stop, err := n.watchAgent(b, bl)
		if err != nil {
			if n.f.ctx.Err() == nil {
				t.Errorf("%s: boot %d: following %s: %v", n.Name, bl.N, AgentUnit, err)
			}
			return
		}
		played := n.playedSoftReboots()
	wait:
		for {
			select {
			case <-b.Done():
				stop()
				n.tracef("boot %d: the container exited", bl.N)
				return
			case <-gone:
				n.tracef("boot %d: the system bus closed", bl.N)
				break wait
			case <-time.After(100 * time.Millisecond):
				if n.bootcSoftReboots() > played {
					n.tracef("boot %d: the test bootc played a soft reboot while the bus follower ran on; closing it", bl.N)
					stop()
					break wait
				}
			}
		}
		next, ok := n.awaitSoftReboot(b, bl)
		if !ok {
			return // the container is exiting: a full reboot or a poweroff
		}
		bl = next
	}
}

// bootcSoftReboots is the number of soft reboots the test bootc played (-1
// when its state cannot be read).
func (n *Node) bootcSoftReboots() int {
	m, err := n.Bootc.Machine()
	if err != nil {
		return -1
	}
	return m.State().SoftReboots
}

func (n *Node) playedSoftReboots() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.softPlayed
}

// awaitSoftReboot waits, after the bus went away, for the container to exit
// (false) or for a soft reboot to finish (true, with the new boot's log).
func (n *Node) awaitSoftReboot(b *Boot, prev *BootLog) (*BootLog, bool) {
	softReboots := n.bootcSoftReboots
	played := n.playedSoftReboots()
	var down time.Time
	var lastErr string
	for {
		if down.IsZero() && softReboots() > played {
			down = time.Now()
			n.tracef("boot %d: the test bootc played soft reboot %d", prev.N, played+1)
			n.mu.Lock()
			n.softPlayed = softReboots()
			n.mu.Unlock()
			_ = n.f.kubelet(n.Name, false, "")
			n.f.Events.add(n.Name, evDown, "soft-reboot")
		}
		if !down.IsZero() {
			// Bounded, then asked again: a systemctl that reaches PID 1
			// between two userspaces can wait minutes for an answer (seen:
			// the next userspace's gate timed out, 120 s, behind it).
			ctx, cancel := context.WithTimeout(n.f.ctx, 3*time.Second)
			out, err := b.Exec(ctx, "systemctl", "show", "-P", "SoftRebootsCount")
			cancel()
			if got := fmt.Sprintf("%q %v", strings.TrimSpace(out), err); got != lastErr {
				lastErr = got
				n.tracef("boot %d: SoftRebootsCount: %s", prev.N, got)
			}
			if c, perr := strconv.ParseUint(strings.TrimSpace(out), 10, 32); err == nil && perr == nil && uint32(c) > prev.SoftRebootsCount {
				bl := &BootLog{BootID: b.BootID, Started: down, Up: time.Now(), Soft: true, SoftRebootsCount: uint32(c)}
				n.mu.Lock()
				prev.Down = down
				bl.N = len(n.boots) + 1
				n.boots = append(n.boots, bl)
				n.mu.Unlock()
				if err := n.f.kubelet(n.Name, true, b.BootID); err != nil {
					n.f.t.Errorf("%s: kubelet: %v", n.Name, err)
				}
				n.f.Events.add(n.Name, evUp, b.BootID+" soft")
				n.notify()
				return bl, true
			}
		}
		select {
		case <-b.Done():
			n.tracef("boot %d: the container exited", prev.N)
			return nil, false
		case <-n.f.ctx.Done():
			return nil, false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// watchAgent follows the agent unit's ActiveState over the node's own
// system bus from before it starts: the e2e gate holds the unit's start
// until the harness has subscribed, then the harness opens the gate. It
// returns once the subscription is set up; recording goes on until the bus
// closes, with the boot or with a soft reboot, or stop is called, and then
// gone is closed.
func (n *Node) watchAgent(b *Boot, bl *BootLog) (gone <-chan struct{}, stop func(), err error) {
	ctx, cancel := context.WithTimeout(n.f.ctx, 60*time.Second)
	defer cancel()
	var conn *dbus.Conn
	for {
		c, err := connectBounded(n.f.ctx, b.BusAddress(), 10*time.Second)
		if err == nil {
			conn = c
			n.tracef("boot %d: connected to the system bus", bl.N)
			break
		}
		select {
		case <-b.Done():
			return nil, nil, fmt.Errorf("container exited before its system bus came up")
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("system bus: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	sd := conn.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1")
	if err := sd.CallWithContext(ctx, "org.freedesktop.systemd1.Manager.Subscribe", 0).Err; err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("Subscribe: %w", err)
	}
	path := unitPath(AgentUnit)
	if err := conn.AddMatchSignalContext(ctx, dbus.WithMatchObjectPath(path),
		dbus.WithMatchInterface("org.freedesktop.DBus.Properties"), dbus.WithMatchMember("PropertiesChanged")); err != nil {
		conn.Close()
		return nil, nil, err
	}
	ch := make(chan *dbus.Signal, 256)
	conn.Signal(ch)
	unit := conn.Object("org.freedesktop.systemd1", path)
	// Bounded: the bus goes away in a soft reboot, and a follower stuck on a
	// call would miss the agent stopping and the next userspace.
	get := func(iface, prop string) string {
		cctx, cancel := context.WithTimeout(n.f.ctx, 5*time.Second)
		defer cancel()
		var v dbus.Variant
		if err := unit.CallWithContext(cctx, "org.freedesktop.DBus.Properties.Get", 0, iface, prop).Store(&v); err != nil {
			return ""
		}
		return fmt.Sprint(v.Value())
	}
	record := func(active, sub string) {
		tr := Transition{At: time.Now(), ActiveState: active, Sub: sub}
		if active == "active" {
			tr.StatusText = get("org.freedesktop.systemd1.Service", "StatusText")
			tr.MainPID = get("org.freedesktop.systemd1.Service", "MainPID")
		}
		n.tracef("boot %d: agent %s/%s", bl.N, active, sub)
		n.mu.Lock()
		if k := len(bl.Transitions); k == 0 || bl.Transitions[k-1].ActiveState != active || bl.Transitions[k-1].Sub != sub {
			bl.Transitions = append(bl.Transitions, tr)
			if active == "active" && bl.AgentFirstActive.IsZero() {
				bl.AgentFirstActive = tr.At
			}
		}
		n.mu.Unlock()
		n.notify()
	}
	record(get("org.freedesktop.systemd1.Unit", "ActiveState"), get("org.freedesktop.systemd1.Unit", "SubState"))
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer conn.Close()
		for {
			select {
			case s, ok := <-ch:
				if !ok {
					n.tracef("boot %d: signals ended", bl.N)
					return
				}
				if len(s.Body) < 2 {
					continue
				}
				if iface, _ := s.Body[0].(string); iface != "org.freedesktop.systemd1.Unit" {
					continue
				}
				ch, _ := s.Body[1].(map[string]dbus.Variant)
				active, sub := variantString(ch["ActiveState"]), variantString(ch["SubState"])
				if active == "" {
					active = get("org.freedesktop.systemd1.Unit", "ActiveState")
				}
				if sub == "" {
					sub = get("org.freedesktop.systemd1.Unit", "SubState")
				}
				if active != "" {
					record(active, sub)
				}
			case <-b.Done():
				return
			}
		}
	}()
	// Open the gate: the agent's start job runs now.
	n.tracef("boot %d: subscribed; opening the gate", bl.N)
	stop = func() { conn.Close() }
	return done, stop, os.WriteFile(b.Path(gateFile), nil, 0o644)
}

// connectBounded connects to a D-Bus address and authenticates within
// timeout: a bus socket that a userspace in transition still holds may
// accept a connection that nobody answers. The connection lives until ctx
// ends or it is closed.
func connectBounded(ctx context.Context, addr string, timeout time.Duration) (*dbus.Conn, error) {
	cctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(timeout, cancel)
	c, err := dbus.Connect(addr, dbus.WithContext(cctx))
	if !timer.Stop() {
		if err == nil {
			c.Close()
		}
		return nil, fmt.Errorf("connecting to %s: no answer within %s", addr, timeout)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	go func() { <-c.Context().Done(); cancel() }()
	return c, nil
}

func variantString(v dbus.Variant) string {
	s, _ := v.Value().(string)
	return s
}

// unitPath is systemd's D-Bus object path of a unit.
func unitPath(unit string) dbus.ObjectPath {
	var sb strings.Builder
	for i := 0; i < len(unit); i++ {
		c := unit[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			sb.WriteByte(c)
		} else {
			fmt.Fprintf(&sb, "_%02x", c)
		}
	}
	return dbus.ObjectPath("/org/freedesktop/systemd1/unit/" + sb.String())
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

// Diagnosis is what the harness saw of the node: its boot follower's trace
// and the test bootc's invocations and state (for failures).
func (n *Node) Diagnosis() string {
	var sb strings.Builder
	n.mu.Lock()
	sb.WriteString("boot follower:\n")
	for _, l := range n.trace {
		sb.WriteString("  " + l + "\n")
	}
	n.mu.Unlock()
	if inv, err := n.Bootc.Invocations(); err != nil {
		fmt.Fprintf(&sb, "test bootc invocations: %v\n", err)
	} else {
		sb.WriteString("test bootc invocations:\n")
		for _, i := range inv {
			fmt.Fprintf(&sb, "  %s %q\n", i.Time.UTC().Format("15:04:05.000"), i.Args)
		}
	}
	if m, err := n.Bootc.Machine(); err != nil {
		fmt.Fprintf(&sb, "test bootc state: %v\n", err)
	} else {
		fmt.Fprintf(&sb, "test bootc state: %+v\n", m.State())
	}
	return sb.String()
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
			{"bootc-fleet-agent", "./agent/cmd/bootc-fleet-agent"},
			{"test-bootc", "./tests/testbootc/cmd/test-bootc"},
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
