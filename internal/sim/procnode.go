package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bootc-fleet/bootc-fleet/internal/agent"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/decide"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/fakedbus"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/notifysock"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/testbootc"
)

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
	// AgentTrace is the agent's step trace (--trace-file) over all its
	// runs: the harness learns what the agent did from it.
	AgentTrace string

	f        *ProcFleet
	stateDir string
	watchDir string
	kc       string
	bus      string
	stopBus  func()
	notify   *notifysock.Socket
	trace    *traceFollower

	mu        sync.Mutex
	cond      *sync.Cond
	agent     *Process
	boot      string // current boot as testbootc names it
	bootID    string
	softCount uint32 // systemd's SoftRebootsCount in this boot
	windows   []procBoot
	confirms  map[string][]procConfirm // step -> confirmations of the running agent
	used      map[string]int
	staging   string // image of the stage in flight, as traced
	down      bool
	timings   []RebootTiming
	status    string // last STATUS= line
	agentRuns int
	rollbacks int     // confirmed `bootc rollback` steps, over every agent run
	traceErrs []error // lines of AgentTrace that did not decode, host states not played
}

// procBoot is one boot of a node and its stale-status window.
type procBoot struct {
	start      time.Time
	boot, prev string
	staleUntil time.Time
}

// procConfirm is one confirmed step of the agent's trace.
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
		AgentLog: filepath.Join(base, "agent.log"), AgentTrace: filepath.Join(base, "agent-trace.jsonl"), confirms: map[string][]procConfirm{}, used: map[string]int{}}
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
	st.Knobs.SoftRebootCapable = f.opts.SoftRebootCapable
	if pr := f.opts.Private; pr != nil {
		st.Knobs.Pull, st.Knobs.Root = true, filepath.Join(base, "root")
		if err := pr.NodeRoot(nodeName, st.Knobs.Root); err != nil {
			return nil, err
		}
	}
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
	n.Login, n.Systemd = &fakedbus.Login1{OnReboot: n.onReboot, OnSoftReboot: n.onSoftReboot}, &fakedbus.Systemd1{}
	if err := n.Login.Serve(n.bus); err != nil {
		n.close()
		return nil, err
	}
	if err := n.Systemd.Serve(n.bus); err != nil {
		n.close()
		return nil, err
	}
	if err := n.playHostHealth(); err != nil {
		n.close()
		return nil, err
	}
	if n.notify, err = notifysock.Open(); err != nil {
		n.close()
		return nil, err
	}
	go n.readNotify(n.notify)
	if n.trace, err = followTrace(n.AgentTrace, n.onTrace); err != nil {
		n.close()
		return nil, err
	}
	n.Kubelet = &Kubelet{Client: f.Kube, Node: nodeName, Labels: map[string]string{PoolLabel: f.Pool}}
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

// Rollbacks is how many `bootc rollback` steps the agent confirmed and
// traced, over all its runs.
func (n *ProcNode) Rollbacks() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.rollbacks
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
	env := append(MinimalEnv(),
		"DBUS_SYSTEM_BUS_ADDRESS="+n.bus,
		"NOTIFY_SOCKET="+n.notify.Path,
		testbootc.EnvState+"="+string(n.Bootc),
	)
	p, err := StartProcess(n.f.opts.Bin.Agent, []string{
		"--kubeconfig", n.kc,
		"--node-name", n.Name,
		"--bootc", n.f.opts.Bin.Bootc,
		"--boot-id-file", n.Bootc.Path(testbootc.DefaultBootID),
		"--state-dir", n.stateDir,
		"--watch-path", n.watchDir,
		"--poll-interval", "2s",
		"--settle-timeout", "1m",
		"--reboot-timeout", "2m",
		"--trace-file", n.AgentTrace,
	}, env, logf)
	if err != nil {
		logf.Close()
		return err
	}
	go func() { <-p.done; logf.Close() }()
	n.agent = p
	n.agentRuns++
	return nil
}

// stopAgent stops the agent as systemd would (SIGTERM, then SIGKILL) and,
// once every step it traced is handled, ends a stage it left open.
func (n *ProcNode) stopAgent() {
	n.mu.Lock()
	p := n.agent
	n.agent = nil
	n.mu.Unlock()
	p.Stop(20 * time.Second)
	if n.trace != nil {
		n.trace.sync()
	}
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
	if n.trace != nil {
		n.trace.close()
	}
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

// onTrace turns one line of the agent's trace into events.
func (n *ProcNode) onTrace(line []byte) {
	var st agent.Step
	if err := json.Unmarshal(line, &st); err != nil {
		n.mu.Lock()
		n.traceErrs = append(n.traceErrs, fmt.Errorf("%s: unreadable trace line %q: %w", n.Name, line, err))
		n.mu.Unlock()
		return
	}
	if st.Kind == agent.StepStageEnded {
		n.mu.Lock()
		img := n.staging
		n.staging = ""
		n.mu.Unlock()
		if img != "" {
			n.f.Log.Add(invariant.Event{Kind: invariant.StageEnd, Node: n.Name, Pool: n.Pool, Image: img, Detail: "stage " + st.Outcome})
		}
		return
	}
	rv, _ := strconv.ParseInt(st.ResourceVersion, 10, 64)
	c := procConfirm{at: st.Time, lease: st.Lease, rv: rv, image: st.Image, bootID: st.BootID}
	n.mu.Lock()
	n.confirms[st.Kind] = append(n.confirms[st.Kind], c)
	n.cond.Broadcast()
	n.mu.Unlock()
	switch st.Kind {
	case decide.StepStage:
		e := n.action(invariant.StageStart, c.image, c)
		n.mu.Lock()
		n.staging = c.image
		n.mu.Unlock()
		n.f.Log.Add(e)
	case decide.StepApply:
		n.f.Log.Add(n.action(invariant.Apply, n.stagedImage(), c))
	case decide.StepRollback:
		n.mu.Lock()
		n.rollbacks++
		n.mu.Unlock()
	}
}

func (n *ProcNode) stagedImage() string {
	m, err := n.Bootc.Machine()
	if err != nil || m.State().Staged == nil {
		return ""
	}
	return m.State().Staged.Image
}

// bootedImage is the image the machine runs ("" when unreadable).
func (n *ProcNode) bootedImage() string {
	m, err := n.Bootc.Machine()
	if err != nil || m.State().Booted == nil {
		return ""
	}
	return m.State().Booted.Image
}

// action fills an action event: the node's boot now, the boot the last
// status read before the confirmation described, and the confirmed grant.
func (n *ProcNode) action(kind invariant.Kind, image string, c procConfirm) invariant.Event {
	content := n.contentBoot(c.at)
	n.mu.Lock()
	defer n.mu.Unlock()
	return invariant.Event{
		Kind: kind, Node: n.Name, Pool: n.Pool, Image: image,
		BootID: n.bootID, SoftRebootCount: n.softCount, CurrentBoot: n.boot, ContentBoot: content,
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

// onReboot is the fake logind's Reboot; onSoftReboot its
// RebootWithFlags(SD_LOGIND_SOFT_REBOOT).
func (n *ProcNode) onReboot()     { n.rebootRequested(false) }
func (n *ProcNode) onSoftReboot() { n.rebootRequested(true) }

// rebootRequested logs the (soft) reboot under the grant the agent
// confirmed for it and plays it in the background.
func (n *ProcNode) rebootRequested(soft bool) {
	now := time.Now()
	step := "reboot"
	if soft {
		step = "soft-reboot"
	}
	c, ok := n.nextConfirm(step, 5*time.Second)
	img, rollback := n.stagedImage(), false
	if m, err := n.Bootc.Machine(); err == nil && m.State().RollbackQueued && m.State().Rollback != nil {
		// The reboot enters the rollback deployment `bootc rollback`
		// queued (I1: only under a rollback grant for it).
		img, rollback = m.State().Rollback.Image, true
	}
	var e invariant.Event
	if ok {
		e = n.action(invariant.Reboot, img, c)
	} else {
		e = n.action(invariant.Reboot, img, procConfirm{at: now})
		e.GrantLease, e.GrantRV, e.Detail = "", 0, "no confirmed "+step+" grant in the agent's log"
	}
	e.Soft, e.Rollback = soft, rollback
	n.f.Log.Add(e)
	n.mu.Lock()
	if n.down || !n.f.beginReboot() {
		n.mu.Unlock()
		return
	}
	n.down = true
	from := n.bootID
	if soft {
		from = n.boot
	}
	n.timings = append(n.timings, RebootTiming{From: from, Requested: now})
	n.mu.Unlock()
	go func() {
		defer n.f.reboots.Done()
		if soft {
			n.playSoftReboot()
		} else {
			n.playReboot()
		}
	}()
}

// playSoftReboot: the agent stops, the kubelet is down (NotReady), systemd
// switches into the prepared root if there is one (the kernel and its boot
// ID stay; SoftRebootsCount grows, over D-Bus too), status is stale for a
// while, then the node is Ready in the same boot ID and the agent starts.
func (n *ProcNode) playSoftReboot() {
	ctx := n.f.ctx
	n.stopAgent()
	stopped := time.Now()
	_ = n.Kubelet.SetReady(ctx, false, "")
	down := n.f.opts.BootTime / 4
	var newBoot string
	var count uint32
	var until time.Time
	start := time.Now()
	err := n.Bootc.Update(func(m *testbootc.Machine) error {
		count = m.SoftReboot(testbootc.RebootOptions{StaleFor: n.f.opts.StaleAfterReboot + down})
		newBoot = m.Boot()
		if s := m.State().Stale; s != nil {
			until = s.Until
		}
		return nil
	})
	if err == nil {
		n.Systemd.SetSoftRebootsCount(count)
	}
	n.mu.Lock()
	k := len(n.timings) - 1
	n.timings[k].AgentStopped = stopped
	if err == nil {
		n.windows = append(n.windows, procBoot{start: start, boot: newBoot, prev: n.boot, staleUntil: until})
		n.boot, n.softCount = newBoot, count
		n.timings[k].To = newBoot
	}
	bootID := n.bootID
	n.mu.Unlock()
	if err != nil {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(down):
	}
	n.hostPlayed(n.playHostHealth())
	n.f.Log.Add(invariant.Event{Kind: invariant.Boot, Node: n.Name, Pool: n.Pool, BootID: bootID, SoftRebootCount: count, Soft: true,
		Image: n.bootedImage()})
	n.mu.Lock()
	n.down = false
	n.timings[k].Booted = time.Now()
	n.mu.Unlock()
	_ = n.startAgent()
	_ = n.Kubelet.SetReady(ctx, true, bootID)
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
	n.hostPlayed(n.playHostHealth())
	n.f.Log.Add(invariant.Event{Kind: invariant.Boot, Node: n.Name, Pool: n.Pool, BootID: newID, Image: n.bootedImage()})
	n.mu.Lock()
	n.down = false
	n.timings[k].Booted = time.Now()
	n.mu.Unlock()
	_ = n.startAgent()
	_ = n.Kubelet.SetReady(ctx, true, newID)
}
