package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/decide"
	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConditionGrantsReadable is False while a Lease labelled with this node does
// not follow the slot protocol (it is ignored, never acted on).
const ConditionGrantsReadable = "GrantsReadable"

// maxImmediate bounds how many iterations run back to back after actions
// that change local state (a cleared record, a finished stage).
const maxImmediate = 5

// apiTimeout bounds one API request, so an unreachable API server cannot
// hold the loop (and its watchdog) for long.
const apiTimeout = 10 * time.Second

// stageRun is the running bootc stage: how to stop it and when it ends.
type stageRun struct {
	image  imageref.Pinned
	grant  lease.ID
	cancel context.CancelFunc
	done   chan error
}

// runner observes, runs the effects decide.Step returns and reports. The
// agent's memory is r.st; the rest are handles (the running stage), caches
// of host reads (the last bootc status, the bootc probe) and what was last
// reported and notified.
type runner struct {
	cfg  Config
	deps Deps
	api  API
	log  *slog.Logger

	// st is the agent's memory; only decide.Step changes it.
	st    decide.State
	stage *stageRun

	// refusals are API requests the server refused, by request, until the
	// same request succeeds (the APIAccess condition).
	refusals map[string]string
	// hostErr is the last failure to read the host's health (logged once).
	hostErr      string
	refusalShown string        // the APIAccess message last written while waiting for the lists
	apiRounds    *rate.Limiter // paces rounds woken by the API server (pace.go)
	// lastRead is the last bootc status read: while the agent's own stage
	// holds the sysroot lock, rounds decide on it instead of waiting
	// behind the pull for a new one.
	lastRead *statusRead
	// reuseRead: the last round's report gave a new grant its first
	// heartbeat, or the last round cleared the reboot record, so the round
	// that follows at once acts on that round's read (milliseconds old,
	// this boot) instead of running bootc status again. Each step re-reads
	// what it depends on anyway: the reboot checks the staged digest before
	// and after unlocking, and bootc switch works on the deployment as it
	// is.
	reuseRead bool
	// waitingFor and waitingSince: the desired image an Idle node started
	// waiting for a stage grant for, and when (Config.WaitingHold).
	waitingFor   imageref.Pinned
	waitingSince time.Time
	// probe is what bootc supports, learned once per boot.
	probe *bootcProbe

	started      time.Time
	ready        bool
	lastAction   decide.Action
	lastNotify   string
	lastReport   statusReport
	lastReportAt time.Time
	reportTried  time.Time // the last report sent, accepted or not
	reported     bool
}

func newRunner(cfg Config, deps Deps) *runner {
	return &runner{
		cfg:  cfg,
		deps: deps,
		api:  deps.API,
		log:  deps.Log.With("node", cfg.NodeName),
		st: decide.NewState(decide.Params{Node: cfg.NodeName, StageRetry: cfg.StageRetry,
			SettleTimeout: cfg.SettleTimeout, RebootTimeout: cfg.RebootTimeout}),
		refusals: map[string]string{},
	}
}

// step feeds one input into decide.Step and returns the effects to run.
func (r *runner) step(in decide.Input) []decide.Effect {
	var effs []decide.Effect
	r.st, effs = decide.Step(r.st, in)
	return effs
}

func (r *runner) now() time.Time { return r.deps.Clock.Now() }

func (r *runner) run(ctx context.Context) error {
	r.started = r.now()
	r.api.Start(ctx)
	r.log.Info("bootc-fleet-agent started", "version", r.cfg.Version)
	defer r.shutdown()
	if !r.waitSynced(ctx) {
		return nil
	}
	for {
		wait := r.cfg.PollInterval
		for i := 0; ; i++ {
			again, next := r.iterate(ctx)
			if next < wait {
				wait = next
			}
			if !again || i >= maxImmediate || ctx.Err() != nil {
				break
			}
		}
		r.reuseRead = false // only the round that follows at once may reuse a read
		lastRound := r.now()
		nextRound := lastRound.Add(wait)
		// Sleep until the next round is due or something changes; wake in
		// between to ping the watchdog, which costs nothing, and to send a
		// heartbeat when one is due, which costs one status write (no
		// bootc status: any change wakes a full round anyway).
		var woke wake
		for {
			sleep := nextRound.Sub(r.now())
			if wd, ok := r.deps.Notifier.WatchdogInterval(); ok && wd/2 < sleep {
				sleep = wd / 2
			}
			if d := r.reportDue(); d < sleep {
				sleep = d
			}
			if sleep < 10*time.Millisecond {
				sleep = 10 * time.Millisecond
			}
			var ok bool
			woke, ok = r.sleep(ctx, sleep)
			if !ok {
				return nil
			}
			if woke != wokeByTimer || !r.now().Before(nextRound) {
				break
			}
			if r.reportDue() <= 0 && !r.heartbeat(ctx) {
				break // a full round reports instead
			}
			_ = r.deps.Notifier.Watchdog()
		}
		if !r.paceRound(ctx, woke, lastRound) {
			return nil
		}
	}
}

// waitSynced waits for the first list of the BootcNode and the Leases, so no
// decision runs on an empty view of the API server. Boot must not wait for
// the API server, though: systemd orders multi-user.target after this
// unit's start job, so READY=1 goes out as soon as the host side works (a
// fresh bootc status in the current boot), and STATUS= says what the agent
// is still waiting for. Nothing disruptive can happen before the lists.
func (r *runner) waitSynced(ctx context.Context) bool {
	var lastProbe time.Time
	for !r.api.Synced() {
		_ = r.deps.Notifier.Watchdog()
		if lastProbe.IsZero() || r.deps.Clock.Since(lastProbe) >= max(r.cfg.RereadInterval, time.Second) {
			lastProbe = r.now()
			r.probeHost(ctx)
		}
		t := r.deps.Clock.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-r.api.Changed():
			t.Stop()
		case <-t.C():
		}
	}
	return true
}

// probeHost reads the boot identity and bootc status while the API server is
// not yet listed: READY=1 once they read fresh, and a STATUS= line naming
// what the agent waits for.
func (r *runner) probeHost(ctx context.Context) {
	hostState := ""
	before, _, err := r.identity(ctx)
	if err == nil {
		_, err = r.readStatus(ctx)
	}
	if err == nil {
		after, _, idErr := r.identity(ctx)
		if idErr != nil || after != before {
			err = fmt.Errorf("the boot changed while reading bootc status")
		}
	}
	if err != nil {
		hostState = "; host not ready: " + err.Error()
	}
	// A refused list (e.g. no RBAC for Leases) never heals by waiting: say
	// so on the BootcNode, if it can be read and written.
	if n := r.api.BootcNode(); n != nil {
		if c := r.apiAccess(n.Generation); c.Status == metav1.ConditionFalse && c.Message != r.refusalShown {
			cctx, cancel := context.WithTimeout(ctx, apiTimeout)
			if r.reportRefusal(cctx, n.Generation, append([]metav1.Condition(nil), n.Status.Conditions...)) {
				r.refusalShown = c.Message
			}
			cancel()
		}
	}
	// After the report above, so STATUS= never says less than the
	// BootcNode: a list refused meanwhile shows in both.
	why := "no answer yet"
	var errs []string
	for inf, e := range r.api.ListErrors() {
		errs = append(errs, inf+": "+e.Error())
	}
	if len(errs) > 0 {
		sort.Strings(errs)
		why = strings.Join(errs, "; ")
	}
	line := text.Truncate(fmt.Sprintf("Waiting for the API server %s to list this node's BootcNode and grants (%s)%s", r.api.Host(), why, hostState), 512)
	if line != r.lastNotify {
		_ = r.deps.Notifier.Status(line)
		r.lastNotify = line
		if r.deps.Clock.Since(r.started) > 5*time.Second {
			r.log.Info("waiting for the API server", "server", r.api.Host(), "why", why)
		}
	}
	// READY=1 after STATUS=, so the unit is never active without saying
	// what it does. A host whose bootc status keeps failing must not hold
	// boot either: after ReadyGrace the agent is ready anyway, and STATUS=
	// says why it can do nothing.
	if (err == nil || r.deps.Clock.Since(r.started) > r.cfg.ReadyGrace) && !r.ready {
		if nerr := r.deps.Notifier.Ready(); nerr != nil {
			r.log.Error("sd_notify READY failed", "err", nerr)
		}
		r.ready = true
		r.log.Info("ready: bootc status read fresh in this boot; waiting for the API server before acting")
	}
}

func (r *runner) shutdown() {
	if r.stage != nil {
		r.log.Info("stopping: cancelling the stage", "image", r.stage.image.String())
		r.stage.cancel()
		<-r.stage.done
		r.stage = nil
	}
	_ = r.deps.Notifier.Stopping()
	r.log.Info("bootc-fleet-agent stopped")
}

func (r *runner) stageDone() <-chan error {
	if r.stage == nil {
		return nil
	}
	return r.stage.done
}

// iterate runs one round: observe, step, run the effects, report. again
// asks for another round at once; next is when to look again at the latest.
func (r *runner) iterate(ctx context.Context) (again bool, next time.Duration) {
	_ = r.deps.Notifier.Watchdog()
	view := r.leaseView()
	obs, st, ok, partial := r.observe(ctx)
	before := r.st.Grants
	effs := r.step(decide.Input{Now: obs.Now, Leases: &view, Observe: &obs, Partial: partial})
	r.logGrants(before)
	obs, act := r.st.Last.Obs, r.st.Last.Action
	fresh := ok && obs.Status.Unavailable == "" && obs.Status.ReadIn == obs.Boot
	if !r.ready && (fresh || r.deps.Clock.Since(r.started) > r.cfg.ReadyGrace) {
		r.notifyStatus(act) // STATUS= first: the unit is never active without it
		if err := r.deps.Notifier.Ready(); err != nil {
			r.log.Error("sd_notify READY failed", "err", err)
		}
		r.ready = true
		r.log.Info("ready: BootcNode and grants listed", "freshStatus", fresh)
	}
	r.explain(act)
	again, next = r.carryOut(ctx, act, effs)
	if s := r.st.Stage; s != nil && s.Timeout > 0 {
		// Wake for the stage's deadline (amendment 19), however long the poll.
		next = min(next, max(s.Started.Add(s.Timeout).Sub(r.now()), 0))
	}
	if act.Kind == decide.ClearRecord && again {
		// Bookkeeping done; the round that follows at once reports the
		// state after it (one status write, not two), on this round's
		// read when it was fresh in this boot: clearing the record ran no
		// bootc command, so a second bootc status, on the path from a
		// reboot to the report the coordinator releases the slot on, would
		// read the same (amendment 32).
		r.reuseRead = fresh
		return again, next
	}
	if hold := r.holdWaiting(obs, act); hold > 0 {
		return again, min(next, hold)
	}
	if decide.Unannounced(act) && r.reported && r.reportDue() > 0 {
		// An update's reboot writes no report of its own (amendment 37):
		// the coordinator's rollout-state says Rebooting, and the next
		// report is the node back in its new boot. One the pace makes due
		// (the host slow to go down) goes out, and says Rebooting.
		r.notifyStatus(act)
		return again, next
	}
	if r.report(ctx, obs, st, act) {
		again = true // a grant just got its first heartbeat: use it now
		r.reuseRead = fresh && act.Kind == decide.Nothing
	}
	return again, next
}

// holdWaiting returns how much longer the report of a is held back: an Idle
// node that starts waiting for a stage grant says so WaitingHold later, so
// a grant the coordinator gives at once costs one report (Staging), not two.
// Nothing waits on the Waiting report: the coordinator grants from the
// BootcNode's spec and the last report's boot.
func (r *runner) holdWaiting(o decide.Observation, a decide.Action) time.Duration {
	if a.Kind != decide.Nothing || a.Phase != fleetv1.PhaseWaiting || a.Reason != fleetv1.ReasonWaitingForStageGrant ||
		!r.reported || r.lastReport.Phase != fleetv1.PhaseIdle {
		r.waitingFor = imageref.Pinned{}
		return 0
	}
	if r.waitingFor != o.Desired.Image {
		r.waitingFor, r.waitingSince = o.Desired.Image, r.now()
	}
	return r.waitingSince.Add(r.cfg.WaitingHold).Sub(r.now())
}

// explain logs one line per decision that differs from the previous one, and
// every disruptive action.
func (r *runner) explain(a decide.Action) {
	l := r.lastAction
	if a.Kind == l.Kind && a.Phase == l.Phase && a.Reason == l.Reason && a.Message == l.Message && a.Kind != decide.Stage && a.Kind != decide.ApplyAndReboot {
		return
	}
	r.lastAction = a
	attrs := []any{"action", string(a.Kind), "phase", string(a.Phase), "reason", a.Reason}
	if a.Image.Digest != "" {
		attrs = append(attrs, "image", a.Image.String())
	}
	if a.Grant.Lease != "" {
		attrs = append(attrs, "grant", a.Grant.String(), "soft", a.Soft)
	}
	r.log.Info(a.Message, attrs...)
}

// observe reads what the rules need from the host and the API server: boot
// identity before and after a fresh bootc status read, the record and the
// spent grants. The agent's memory (grants, stage, verdicts) is Step's.
// partial says the boot identity could not be read.
func (r *runner) observe(ctx context.Context) (o decide.Observation, st bootc.Status, ok, partial bool) {
	o = decide.Observation{Now: r.now(), Policy: fleetv1.RebootPolicyReboot}
	if n := r.api.BootcNode(); n != nil {
		o.Desired = desiredOf(n.Spec.DesiredImage)
		if n.Spec.RebootPolicy != "" {
			o.Policy = n.Spec.RebootPolicy
		}
		o.RequireSigned = n.Spec.RequireSignedImages
	}
	before, supported, err := r.identity(ctx)
	if err != nil {
		o.Status.Unavailable = "reading the boot identity: " + err.Error()
		return o, bootc.Status{}, false, true
	}
	o.Boot, o.SoftRebootSupported = before, supported
	var stErr error
	reuse := r.reuseRead
	r.reuseRead = false
	if lr := r.lastRead; (r.stage != nil || reuse) && lr != nil && lr.boot == before {
		// bootc status would wait for the sysroot lock our own pull holds
		// (bootc issue #585): decide on the read taken before the stage.
		// Right after a first heartbeat, decide on that round's read.
		o.Status = statusOf(lr.st, before)
		st = lr.st
	} else {
		st, stErr = r.readStatus(ctx)
		after, _, err := r.identity(ctx)
		switch {
		case stErr != nil:
			o.Status.Unavailable = stErr.Error()
		case err == nil && after == before:
			o.Status = statusOf(st, before)
			r.lastRead = &statusRead{boot: before, st: st}
		default:
			// The boot changed while reading: the status belongs to no known boot.
			o.Status = statusOf(st, decide.BootIdentity{})
			if err == nil {
				o.Boot = after
			}
		}
	}
	o.Bootc = r.bootcSupport(ctx, o.Boot)
	o.Record, o.Spent = r.readRecord()
	return o, st, stErr == nil, false
}

// readRecord reads the reboot record and the spent grants.
func (r *runner) readRecord() (decide.RecordState, []lease.ID) {
	rec, err := r.deps.Records.Read()
	if err != nil {
		return decide.RecordState{Unreadable: err.Error()}, nil
	}
	spent, err := r.deps.Records.Spent()
	if err != nil {
		return decide.RecordState{Unreadable: "spent grants: " + err.Error()}, nil
	}
	if rec == nil {
		return decide.RecordState{}, spent
	}
	img, err := imageref.ParsePinned(rec.Image)
	if err != nil { // Read validates; kept as a guard
		return decide.RecordState{Unreadable: err.Error()}, spent
	}
	return decide.RecordState{
		Present:  true,
		Grant:    rec.Grant,
		Image:    img,
		Boot:     decide.BootIdentity{BootID: rec.BootID, SoftRebootCount: rec.SoftRebootCount},
		Recorded: rec.Recorded,
		Soft:     rec.Soft,
		Rollback: rec.Rollback,
	}, spent
}

func (r *runner) identity(ctx context.Context) (decide.BootIdentity, bool, error) {
	id, err := r.deps.Host.BootID()
	if err != nil {
		return decide.BootIdentity{}, false, err
	}
	if !lease.ValidBootID(id) {
		return decide.BootIdentity{}, false, fmt.Errorf("boot ID %q is not a boot ID", id)
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	n, supported, err := r.deps.Host.SoftRebootsCount(cctx)
	if err != nil {
		return decide.BootIdentity{}, false, fmt.Errorf("reading SoftRebootsCount: %w", err)
	}
	return decide.BootIdentity{BootID: id, SoftRebootCount: n}, supported, nil
}

func desiredOf(s string) decide.Desired {
	if s == "" {
		return decide.Desired{}
	}
	p, err := imageref.ParsePinned(s)
	if err != nil {
		return decide.Desired{Set: true, Invalid: err.Error()}
	}
	return decide.Desired{Set: true, Image: p}
}

func statusOf(st bootc.Status, in decide.BootIdentity) decide.Status {
	dep := func(e *bootc.Entry) *decide.Deployment {
		if e == nil {
			return nil
		}
		p, _ := e.Pinned() // an entry without a registry digest matches no image
		return &decide.Deployment{Image: p, DownloadOnly: e.DownloadOnly, SoftRebootCapable: e.SoftRebootCapable,
			Signature: fleetv1.ImageSignature(e.Signature)}
	}
	return decide.Status{ReadIn: in, Booted: dep(st.Booted), Staged: dep(st.Staged), Rollback: dep(st.Rollback),
		RollbackQueued: st.RollbackQueued}
}

// carryOut runs the effects of the round's decision, feeding each result
// back into Step, which emits the next (the reboot sequence is one effect
// at a time).
func (r *runner) carryOut(ctx context.Context, a decide.Action, effs []decide.Effect) (again bool, next time.Duration) {
	for len(effs) > 0 {
		e := effs[0]
		res := r.execute(ctx, e)
		more := r.step(decide.Input{Now: r.now(), Result: &res})
		r.noteResult(e, res)
		effs = append(more, effs[1:]...)
	}
	next = r.cfg.PollInterval
	switch {
	case a.Kind == decide.RereadLater || a.Kind == decide.ApplyAndReboot:
		next = r.cfg.RereadInterval
	case a.Kind == decide.Stage && r.st.Again:
		next = r.cfg.RereadInterval
	}
	return r.st.Again, next
}
