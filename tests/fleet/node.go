package fleet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/rest"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/internal/agent"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/record"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/testbootc"
)

// NodeBehaviour shapes how a simulated machine behaves.
type NodeBehaviour struct {
	// BootTime is how long the machine is down in a reboot.
	BootTime time.Duration
	// StaleAfterReboot keeps bootc status showing the pre-reboot state this
	// long after each boot (early-boot lag).
	StaleAfterReboot time.Duration
	// StageTime is how long a stage (download) takes.
	StageTime time.Duration
	// NeverReturn: the machine does not come back from its next reboot.
	NeverReturn bool
	// CrashBeforeReboot: the agent dies this many times after recording a
	// reboot and before the reboot is issued (then it is restarted).
	CrashBeforeReboot int
	// CrashBeforeRollbackReboot: the agent dies this many times after
	// `bootc rollback` queued the rollback deployment and before the reboot
	// into it is issued (then it is restarted, in the same boot).
	CrashBeforeRollbackReboot int
	// Generation is the bootc release line the machine runs (default:
	// testbootc.Gen1_16); read when the node is made.
	Generation testbootc.Generation
	// ClockSkews, when set, put the machine's wall clock off by
	// ClockSkews[k % len] in its k-th boot (0 = the first), as a host whose
	// clock is wrong until NTP fixes it, differently after each reboot.
	ClockSkews []time.Duration
	// SoftRebootCapable: what the machine stages is soft-reboot capable
	// (bootc's softRebootCapable: same kernel and initramfs).
	SoftRebootCapable bool
	// OldSystemd plays systemd 252 (Debian 12): no SoftRebootsCount and no
	// soft reboot in logind. By default the host has both (systemd 254+).
	OldSystemd bool
	// SoftRebootTime is how long a soft reboot keeps userspace down
	// (default: BootTime / 4).
	SoftRebootTime time.Duration
}

// SimNode is one simulated machine: its bootc state, its kubelet and an
// in-process bootc-fleet-agent (the real agent code and API client with the
// bootc and host edges in memory).
type SimNode struct {
	Name    string
	Pool    string
	Machine *testbootc.Machine
	Kubelet *sim.Kubelet
	// bootc is the machine's bootc command line (its sysroot lock
	// outlives agent restarts, as a host's does).
	bootc *testbootc.Mem

	behaviour NodeBehaviour
	log       *sim.Log
	rest      *rest.Config // the node's identity
	stateDir  string
	agentCfg  func() agent.Config
	logger    *slog.Logger
	light     bool        // a LightAgent runs instead of the real agent
	hostile   *hostileRun // set: a hostile writer runs instead of any agent
	fleet     *Fleet      // for the images pushed bad (PushBad)

	mu          sync.Mutex
	cancel      context.CancelFunc
	done        chan struct{}
	down        bool
	dead        bool
	lastContent string     // boot the last status read described
	lastTrace   agent.Step // the last grant the agent confirmed
	rebooting   bool
	staging     bool
	boots       int // reboots so far, for ClockSkews
}

// Staging reports whether a stage (bootc switch) is in flight.
func (n *SimNode) Staging() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.staging
}

func (n *SimNode) setStaging(on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.staging = on
}

// Down reports whether the machine is rebooting or never came back.
func (n *SimNode) Down() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.down
}

// Dead reports whether the machine never came back.
func (n *SimNode) Dead() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dead
}

// retire keeps the agent from ever starting again (the node is removed).
func (n *SimNode) retire() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.dead = true
}

// SetBehaviour changes how the machine behaves from now on.
func (n *SimNode) SetBehaviour(b NodeBehaviour) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.behaviour = b
}

func (n *SimNode) behave() NodeBehaviour {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.behaviour
}

// StartAgent starts the node's agent; it runs until StopAgent or a reboot.
func (n *SimNode) StartAgent(ctx context.Context) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cancel != nil || n.dead {
		return
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	n.cancel, n.done = cancel, done
	if h := n.hostile; h != nil {
		go func() {
			defer close(done)
			n.runHostile(actx, h.kind, h.rec)
		}()
		return
	}
	if n.light {
		go func() {
			defer close(done)
			n.runLight(actx, ctx)
		}()
		return
	}
	deps := agent.Deps{
		Bootc:   newMemBootc(n),
		Host:    memHost{n, ctx},
		Records: record.Store{Dir: n.stateDir},
		Log:     n.logger,
		Trace:   n.trace,
	}
	if sk := n.behaviour.ClockSkews; len(sk) > 0 {
		deps.Clock = skewedClock{offset: sk[n.boots%len(sk)]}
	}
	cfg := n.agentCfg()
	go func() {
		defer close(done)
		if err := agent.Run(actx, cfg, deps); err != nil {
			n.logger.Error("agent did not start", "err", err)
		}
	}()
}

// hostileRun is a hostile node's part (hostile.go).
type hostileRun struct {
	kind HostileKind
	rec  *HostileRecord
}

// MakeHostile replaces the node's agent with a hostile writer of kind,
// whose writes rec counts.
func (n *SimNode) MakeHostile(ctx context.Context, kind HostileKind, rec *HostileRecord) {
	n.StopAgent()
	n.mu.Lock()
	n.hostile = &hostileRun{kind: kind, rec: rec}
	n.mu.Unlock()
	n.StartAgent(ctx)
}

// Hostile reports whether a hostile writer replaced the node's agent.
func (n *SimNode) Hostile() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.hostile != nil
}

// StopAgent stops the agent (as systemd would) and waits for it.
func (n *SimNode) StopAgent() {
	n.mu.Lock()
	cancel, done := n.cancel, n.done
	n.cancel, n.done = nil, nil
	n.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// CrashAgent kills the agent at once, as SIGKILL would: its goroutines are
// abandoned mid-step. The durable record survives; nothing else does.
func (n *SimNode) CrashAgent() { n.StopAgent() }

func (n *SimNode) trace(a agent.Step) {
	if a.Kind == agent.StepStageEnded {
		return // the in-process fleet sees stage ends in its test bootc
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lastTrace = a
}

// event fills the fields every action event carries.
func (n *SimNode) event(kind invariant.Kind, image string) invariant.Event {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.Machine.State()
	return invariant.Event{
		Kind: kind, Node: n.Name, Pool: n.Pool, Image: image,
		BootID:          st.BootID,
		SoftRebootCount: st.SoftRebootCount,
		CurrentBoot:     n.Machine.Boot(),
		ContentBoot:     n.lastContent,
		GrantLease:      n.lastTrace.Lease,
		GrantRV:         parseRV(n.lastTrace.ResourceVersion),
	}
}

func parseRV(s string) int64 {
	v, _ := strconv.ParseInt(s, 10, 64)
	return v
}

// Reboot plays the machine's reboot: the agent stops, the node goes
// NotReady, the staged deployment is entered (if unlocked), a new boot ID,
// the boot time passes, then the agent starts again and the node is Ready.
// planned says whether the agent asked for it (an unplanned one is a power
// cut). It returns at once; the reboot runs in the background.
func (n *SimNode) Reboot(ctx context.Context, planned bool) {
	n.mu.Lock()
	if n.rebooting || n.dead {
		n.mu.Unlock()
		return
	}
	n.rebooting, n.down = true, true
	n.mu.Unlock()
	if !planned {
		n.log.Add(n.event(invariant.UnplannedReboot, ""))
	}
	go func() {
		n.StopAgent()
		_ = n.Kubelet.SetReady(ctx, false, "")
		b := n.behave()
		newBoot := n.Machine.Reboot(testbootc.RebootOptions{StaleFor: b.StaleAfterReboot + b.BootTime})
		if b.NeverReturn {
			n.mu.Lock()
			n.dead, n.rebooting = true, false
			n.mu.Unlock()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(b.BootTime):
		}
		n.log.Add(invariant.Event{Kind: invariant.Boot, Node: n.Name, Pool: n.Pool, BootID: newBoot, Image: n.bootedImage()})
		n.mu.Lock()
		n.down, n.rebooting = false, false
		n.boots++
		n.mu.Unlock()
		n.StartAgent(ctx)
		_ = n.Kubelet.SetReady(ctx, true, newBoot)
	}()
}

// SoftReboot plays the machine's soft reboot (systemd soft-reboot.target
// after logind accepted it): the agent stops, the Node goes NotReady while
// the kubelet is down, the kernel stays (same boot ID, soft-reboot count +1),
// the staged deployment is entered only if the unlock prepared it (testbootc
// models ostree's /run/nextroot), status is stale for a while, then the
// agent and the kubelet start again. It returns at once.
func (n *SimNode) SoftReboot(ctx context.Context) {
	n.mu.Lock()
	if n.rebooting || n.dead {
		n.mu.Unlock()
		return
	}
	n.rebooting, n.down = true, true
	n.mu.Unlock()
	go func() {
		n.StopAgent()
		_ = n.Kubelet.SetReady(ctx, false, "")
		b := n.behave()
		down := b.SoftRebootTime
		if down <= 0 {
			down = b.BootTime / 4
		}
		count := n.Machine.SoftReboot(testbootc.RebootOptions{StaleFor: b.StaleAfterReboot + down})
		select {
		case <-ctx.Done():
			return
		case <-time.After(down):
		}
		bootID := n.Machine.BootID()
		n.log.Add(invariant.Event{Kind: invariant.Boot, Node: n.Name, Pool: n.Pool, BootID: bootID, SoftRebootCount: count, Soft: true, Image: n.bootedImage()})
		n.mu.Lock()
		n.down, n.rebooting = false, false
		n.mu.Unlock()
		n.StartAgent(ctx)
		_ = n.Kubelet.SetReady(ctx, true, bootID)
	}()
}

// memBootc is the agent's real bootc CLI over the simulated machine's
// command line (testbootc.Mem): the same sequences, parsing, messages and
// sysroot lock a host's bootc has. It logs what the agent does.
type memBootc struct {
	n   *SimNode
	cli *bootc.CLI
}

func newMemBootc(n *SimNode) memBootc {
	return memBootc{n: n, cli: &bootc.CLI{Runner: unlockWatch{n}}}
}

// unlockWatch runs bootc command lines on the machine and logs an Unlocked
// event whenever one leaves an unlocked staged deployment (I1 checks it was
// granted).
type unlockWatch struct{ n *SimNode }

func (u unlockWatch) Run(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	if len(args) > 0 && args[0] == "rollback" {
		// I1 checks that `bootc rollback` runs under a rollback grant for
		// the deployment it queues.
		img := ""
		if rb := u.n.Machine.State().Rollback; rb != nil {
			img = rb.Image
		}
		u.n.log.Add(u.n.event(invariant.RollbackRun, img))
	}
	code, err := u.n.bootc.Run(ctx, args, stdout, stderr)
	if len(args) > 0 && (args[0] == "switch" || args[0] == "upgrade") {
		if st := u.n.Machine.State().Staged; st != nil && !st.DownloadOnly {
			u.n.log.Add(u.n.event(invariant.Unlocked, st.Image))
		}
	}
	return code, err
}

func (b memBootc) Status(ctx context.Context) (bootc.Status, error) {
	st, err := b.cli.Status(ctx)
	if err == nil {
		// Which boot the document described (a stale window shows an
		// earlier one), for the invariant checker.
		boot := b.n.Machine.LastStatusBoot()
		b.n.mu.Lock()
		b.n.lastContent = boot
		b.n.mu.Unlock()
	}
	return st, err
}

func (b memBootc) Probe(ctx context.Context) (bootc.Capabilities, error) { return b.cli.Probe(ctx) }

func (b memBootc) Stage(ctx context.Context, img imageref.Pinned, caps bootc.Capabilities, opts bootc.StageOptions) error {
	b.n.log.Add(b.n.event(invariant.StageStart, img.String()))
	b.n.setStaging(true)
	defer func() {
		b.n.setStaging(false)
		b.n.log.Add(invariant.Event{Kind: invariant.StageEnd, Node: b.n.Name, Pool: b.n.Pool, Image: img.String()})
	}()
	// The pull takes StageTime, holding the sysroot lock as bootc does.
	d := b.n.behave().StageTime
	b.n.Machine.Configure(func(k *testbootc.Knobs) { k.SwitchDelay = testbootc.Duration(d) })
	return b.cli.Stage(ctx, img, caps, opts)
}

func (b memBootc) ApplyStaged(ctx context.Context, mode bootc.SoftReboot) error {
	st := b.n.Machine.State()
	img := ""
	if st.Staged != nil {
		img = st.Staged.Image
	}
	e := b.n.event(invariant.Apply, img)
	e.Detail = "--soft-reboot=" + string(mode)
	b.n.log.Add(e)
	return b.cli.ApplyStaged(ctx, mode)
}

// Rollback runs the agent's real `bootc rollback` sequence on the machine.
func (b memBootc) Rollback(ctx context.Context, to imageref.Pinned, mode bootc.SoftReboot) (bootc.RollbackResult, error) {
	return b.cli.Rollback(ctx, to, mode)
}

// memHost is the machine's boot identity and logind.
type memHost struct {
	n   *SimNode
	ctx context.Context // the harness's, outliving the agent
}

func (h memHost) BootID() (string, error) { return h.n.Machine.BootID(), nil }

func (h memHost) SoftRebootsCount(context.Context) (uint32, bool, error) {
	if h.n.behave().OldSystemd {
		return 0, false, nil // no such property on systemd 252
	}
	return h.n.Machine.State().SoftRebootCount, true, nil
}

func (h memHost) Reboot(context.Context) error {
	n := h.n
	e := n.rebootEvent()
	n.mu.Lock()
	crash := n.behaviour.CrashBeforeReboot > 0
	if crash {
		n.behaviour.CrashBeforeReboot--
	} else if crash = e.Rollback && n.behaviour.CrashBeforeRollbackReboot > 0; crash {
		n.behaviour.CrashBeforeRollbackReboot--
	}
	n.mu.Unlock()
	if crash {
		// The agent dies between recording the reboot and issuing it; it
		// is restarted shortly after, in the same boot.
		go func() {
			n.StopAgent()
			time.Sleep(100 * time.Millisecond)
			n.StartAgent(h.ctx)
		}()
		return fmt.Errorf("simulated crash before the reboot was issued")
	}
	n.log.Add(e)
	n.Reboot(h.ctx, true)
	return nil
}

// rebootEvent is the Reboot event of a reboot issued now: into the
// rollback deployment when `bootc rollback` queued it (Rollback), else into
// the staged deployment, if any.
func (n *SimNode) rebootEvent() invariant.Event {
	st := n.Machine.State()
	img := ""
	switch {
	case st.RollbackQueued && st.Rollback != nil:
		img = st.Rollback.Image
	case st.Staged != nil:
		img = st.Staged.Image
	}
	e := n.event(invariant.Reboot, img)
	e.Rollback = st.RollbackQueued
	return e
}

// bootedImage is the image the machine runs, "" if none.
func (n *SimNode) bootedImage() string {
	if b := n.Machine.State().Booted; b != nil {
		return b.Image
	}
	return ""
}

// SoftReboot is logind's RebootWithFlags(SD_LOGIND_SOFT_REBOOT): refused by
// a logind without soft reboot, else logged as a (soft) reboot under the
// grant the agent confirmed, and played.
func (h memHost) SoftReboot(context.Context) error {
	if h.n.behave().OldSystemd {
		return fmt.Errorf("logind RebootWithFlags: Invalid flags parameter")
	}
	e := h.n.rebootEvent()
	e.Soft = true
	h.n.log.Add(e)
	h.n.SoftReboot(h.ctx)
	return nil
}
