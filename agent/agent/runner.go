package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/agent/decide"
	"github.com/bootc-fleet/bootc-fleet/agent/record"
	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// ConditionGrantsReadable is False while a Lease labelled with this node does
// not follow the slot protocol (it is ignored, never acted on).
const ConditionGrantsReadable = "GrantsReadable"

// Condition reasons of ConditionGrantsReadable.
const (
	ReasonGrantsValid    = "AsExpected"
	ReasonMalformedGrant = "MalformedGrant"
)

// maxImmediate bounds how many iterations run back to back after actions
// that change local state (a cleared record, a finished stage).
const maxImmediate = 5

// apiTimeout bounds one API request, so an unreachable API server cannot
// hold the loop (and its watchdog) for long.
const apiTimeout = 10 * time.Second

// held is a grant as the agent last renewed it.
type held struct {
	grant     lease.Grant
	lastRenew time.Time
	// rvs are resource versions known to carry this grant unchanged (the
	// one read before the renew and the one the renew produced), so the
	// informer catching up does not trigger another renew.
	rvs []string
}

type stageRun struct {
	image  imageref.Pinned
	cancel context.CancelFunc
	done   chan error
}

type runner struct {
	cfg  Config
	deps Deps
	kube *kube
	log  *slog.Logger

	held       map[string]*held
	malformed  []string
	stage      *stageRun
	stageFail  *decide.StageFailure
	stageDelay time.Duration
	verdict    *decide.Verdict

	// settleKey/settleDeadline: when the record from another boot was first
	// seen in this boot.
	settleKey      string
	settleDeadline time.Time
	// rebootIssued is the grant this process already rebooted for.
	rebootIssued *lease.ID

	started      time.Time
	ready        bool
	lastAction   decide.Action
	lastNotify   string
	lastReport   statusReport
	lastReportAt time.Time
	reported     bool
}

func newRunner(cfg Config, deps Deps, k *kube) *runner {
	return &runner{
		cfg:  cfg,
		deps: deps,
		kube: k,
		log:  deps.Log.With("node", cfg.NodeName),
		held: map[string]*held{},
	}
}

func (r *runner) now() time.Time { return r.deps.Clock.Now() }

func (r *runner) run(ctx context.Context) error {
	r.started = r.now()
	r.kube.start(ctx)
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
		lastRound := r.now()
		nextRound := lastRound.Add(wait)
		// Sleep until the next round is due, something changes, or a grant
		// needs renewing; wake in between only to ping the watchdog, which
		// costs nothing (no bootc status, no API call).
		for {
			sleep := nextRound.Sub(r.now())
			if wd, ok := r.deps.Notifier.WatchdogInterval(); ok && wd/2 < sleep {
				sleep = wd / 2
			}
			if d := r.renewDue(); d < sleep {
				sleep = d
			}
			if sleep < 10*time.Millisecond {
				sleep = 10 * time.Millisecond
			}
			woke, ok := r.sleep(ctx, sleep)
			if !ok {
				return nil
			}
			if woke || !r.now().Before(nextRound) || r.renewDue() <= 0 {
				break
			}
			_ = r.deps.Notifier.Watchdog()
		}
		// A file-system change right after a round is usually that round's
		// own doing (or a burst): wait a little so a feedback loop or a
		// burst costs at most a few rounds a second.
		if d := minRoundGap - r.now().Sub(lastRound); d > 0 {
			if _, ok := r.sleep(ctx, d); !ok {
				return nil
			}
		}
	}
}

// minRoundGap is the shortest time between two rounds woken by events.
const minRoundGap = 250 * time.Millisecond

// sleep waits d or until an event: woke reports an event (an informer poke,
// a file-system change, the stage finishing); ok is false once ctx ended.
func (r *runner) sleep(ctx context.Context, d time.Duration) (woke, ok bool) {
	t := r.deps.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, false
	case <-r.kube.pokes:
		return true, true
	case <-r.deps.Changes:
		return true, true
	case err := <-r.stageDone():
		r.stageFinished(err)
		return true, true
	case <-t.C():
		return false, true
	}
}

// waitSynced waits for the first list of the BootcNode and the Leases, so no
// decision runs on an empty view of the API server.
func (r *runner) waitSynced(ctx context.Context) bool {
	logged := false
	for !r.kube.synced() {
		_ = r.deps.Notifier.Watchdog()
		t := r.deps.Clock.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C():
		}
		if !logged && r.deps.Clock.Since(r.started) > 10*time.Second {
			r.log.Info("waiting for the API server (listing the BootcNode and the Leases)")
			_ = r.deps.Notifier.Status("Waiting for the API server")
			logged = true
		}
	}
	return true
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

// iterate runs one observe-decide-act round. again asks for another round at
// once; next is when to look again at the latest.
func (r *runner) iterate(ctx context.Context) (again bool, next time.Duration) {
	_ = r.deps.Notifier.Watchdog()
	now := r.now()
	r.renewGrants(ctx, now)
	obs, st, ok := r.observe(ctx)
	act := decide.Decide(obs)
	if ok && !r.ready && r.kube.synced() && obs.Status.Unavailable == "" && obs.Status.ReadIn == obs.Boot {
		if err := r.deps.Notifier.Ready(); err != nil {
			r.log.Error("sd_notify READY failed", "err", err)
		}
		r.ready = true
		r.log.Info("ready: first fresh bootc status read and BootcNode listed")
	}
	r.explain(act)
	again, next = r.carryOut(ctx, obs, act)
	r.report(ctx, obs, st, act)
	return again, next
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

// observe builds the Observation: boot identity before and after a fresh
// bootc status read, the record, the grants and the in-flight stage.
func (r *runner) observe(ctx context.Context) (decide.Observation, bootc.Status, bool) {
	now := r.now()
	o := decide.Observation{
		Now:           now,
		Node:          r.cfg.NodeName,
		RebootTimeout: r.cfg.RebootTimeout,
		Policy:        fleetv1.RebootPolicyReboot,
	}
	if n := r.kube.bootcNode(); n != nil {
		o.Desired = desiredOf(n.Spec.DesiredImage)
		if n.Spec.RebootPolicy != "" {
			o.Policy = n.Spec.RebootPolicy
		}
	}
	before, supported, err := r.identity(ctx)
	if err != nil {
		o.Status.Unavailable = "reading the boot identity: " + err.Error()
		return o, bootc.Status{}, false
	}
	o.Boot, o.SoftRebootSupported = before, supported
	st, stErr := r.readStatus(ctx)
	after, _, err := r.identity(ctx)
	switch {
	case stErr != nil:
		o.Status.Unavailable = stErr.Error()
	case err == nil && after == before:
		o.Status = statusOf(st, before)
	default:
		// The boot changed while reading: the status belongs to no known boot.
		o.Status = statusOf(st, decide.BootIdentity{})
		if err == nil {
			o.Boot = after
		}
	}
	r.observeRecord(&o)
	if r.verdict != nil && r.verdict.Boot != o.Boot {
		r.verdict = nil
	}
	o.Verdict = r.verdict
	o.Grants = r.grants()
	if r.stage != nil {
		img := r.stage.image
		o.InFlight = &img
	}
	o.LastStageFailure = r.stageFail
	return o, st, stErr == nil
}

func (r *runner) observeRecord(o *decide.Observation) {
	rec, err := r.deps.Records.Read()
	if err != nil {
		o.Record.Unreadable = err.Error()
		return
	}
	spent, err := r.deps.Records.Spent()
	if err != nil {
		o.Record.Unreadable = "spent grants: " + err.Error()
		return
	}
	o.Spent = spent
	if rec == nil {
		r.settleKey = ""
		return
	}
	img, err := imageref.ParsePinned(rec.Image)
	if err != nil { // Read validates; kept as a guard
		o.Record.Unreadable = err.Error()
		return
	}
	o.Record = decide.RecordState{
		Present:  true,
		Grant:    rec.Grant,
		Image:    img,
		Boot:     decide.BootIdentity{BootID: rec.BootID, SoftRebootCount: rec.SoftRebootCount},
		Recorded: rec.Recorded,
		Soft:     rec.Soft,
	}
	if o.Record.Boot != o.Boot {
		// The settle deadline starts when this process first sees the
		// record from another boot.
		key := rec.Grant.String() + "/" + o.Boot.String()
		if r.settleKey != key {
			r.settleKey, r.settleDeadline = key, o.Now.Add(r.cfg.SettleTimeout)
		}
		o.SettleDeadline = r.settleDeadline
	}
	o.RebootIssued = r.rebootIssued != nil && *r.rebootIssued == rec.Grant
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

func (r *runner) readStatus(ctx context.Context) (bootc.Status, error) {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	return r.deps.Bootc.Status(cctx)
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
		return &decide.Deployment{Image: p, DownloadOnly: e.DownloadOnly, SoftRebootCapable: e.SoftRebootCapable}
	}
	return decide.Status{ReadIn: in, Booted: dep(st.Booted), Staged: dep(st.Staged)}
}

// grants returns the held grants that the informer still shows unchanged.
func (r *runner) grants() []decide.HeldGrant {
	var out []decide.HeldGrant
	names := make([]string, 0, len(r.held))
	for n := range r.held {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		h := r.held[n]
		out = append(out, decide.HeldGrant{Grant: h.grant, LastRenew: h.lastRenew})
	}
	return out
}

// renewGrants reconciles the held grants with the informer's Leases: a grant
// seen for the first time or changed is read fresh and renewed before it is
// used; a grant that disappeared (revoked, released) is dropped at once; the
// others are renewed every duration/3.
func (r *runner) renewGrants(ctx context.Context, now time.Time) {
	seen := map[string]bool{}
	r.malformed = r.malformed[:0]
	boot, _ := r.deps.Host.BootID()
	for _, l := range r.kube.cachedLeases() {
		g, err := lease.Parse(l)
		switch {
		case errors.Is(err, lease.ErrMalformed):
			r.malformed = append(r.malformed, l.Name+": "+err.Error())
			continue
		case err != nil || g.Holder != r.cfg.NodeName:
			continue
		}
		seen[l.Name] = true
		h := r.held[l.Name]
		switch {
		case h == nil || !containsRV(h.rvs, l.ResourceVersion):
			r.renew(ctx, l.Name, now)
		case g.BootID == boot && now.Sub(h.lastRenew) >= g.Duration/3:
			r.renew(ctx, l.Name, now)
		}
	}
	for n := range r.held {
		if !seen[n] {
			r.log.Info("grant gone", "lease", n, "grant", r.held[n].grant.ID.String())
			delete(r.held, n)
		}
	}
	if len(r.malformed) > 0 {
		sort.Strings(r.malformed)
	}
}

func (r *runner) renew(ctx context.Context, name string, now time.Time) {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	fresh, updated, err := r.kube.renew(cctx, name, now)
	if apierrors.IsNotFound(err) || (err == nil && updated == nil) {
		delete(r.held, name)
		return
	}
	if err != nil {
		// A conflict means the coordinator changed the grant: the next
		// round reads it again. Until a renew succeeds the grant ages out.
		r.log.Info("renew failed", "lease", name, "err", err)
		if h := r.held[name]; h != nil && fresh != nil {
			if g, perr := lease.Parse(fresh); perr != nil || g.ID != h.grant.ID || g.Image != h.grant.Image || g.Phase != h.grant.Phase || g.Failure != h.grant.Failure {
				delete(r.held, name) // what we hold is no longer what the API server has
			}
		}
		return
	}
	g, err := lease.Parse(updated)
	if err != nil || g.Holder != r.cfg.NodeName {
		delete(r.held, name)
		return
	}
	if old := r.held[name]; old == nil || old.grant.ID != g.ID || old.grant.Phase != g.Phase || old.grant.Image != g.Image {
		r.log.Info("grant held", "lease", name, "grant", g.ID.String(), "kind", string(g.Kind), "image", g.Image.String(),
			"phase", string(g.Phase), "bootID", g.BootID)
	}
	r.held[name] = &held{grant: g, lastRenew: now, rvs: []string{fresh.ResourceVersion, updated.ResourceVersion}}
}

func containsRV(rvs []string, rv string) bool {
	for _, v := range rvs {
		if v == rv {
			return true
		}
	}
	return false
}

// renewDue is the time until the next renew.
func (r *runner) renewDue() time.Duration {
	due := time.Duration(1<<62 - 1)
	now := r.now()
	for _, h := range r.held {
		if d := h.lastRenew.Add(h.grant.Duration / 3).Sub(now); d < due {
			due = d
		}
	}
	return due
}

// carryOut performs the action.
func (r *runner) carryOut(ctx context.Context, o decide.Observation, a decide.Action) (again bool, next time.Duration) {
	next = r.cfg.PollInterval
	switch a.Kind {
	case decide.Nothing:
	case decide.RereadLater:
		next = r.cfg.RereadInterval
	case decide.Stage:
		if !r.startStage(ctx, o, a.Image) {
			return true, r.cfg.RereadInterval
		}
	case decide.CancelStage:
		r.cancelStage(ctx)
		return true, next
	case decide.ClearRecord:
		return r.clearRecord(o, a), next
	case decide.ApplyAndReboot:
		return r.applyAndReboot(ctx, o, a), r.cfg.RereadInterval
	}
	return false, next
}

func (r *runner) startStage(ctx context.Context, o decide.Observation, img imageref.Pinned) bool {
	g, ok := r.stageGrant(o, img)
	if !ok || !r.confirm(ctx, g, "stage", o.Boot.BootID) {
		return false
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &stageRun{image: img, cancel: cancel, done: make(chan error, 1)}
	r.stage = s
	go func() { s.done <- r.deps.Bootc.Switch(sctx, img) }()
	return true
}

// stageGrant finds the held stage grant the decision to stage img relied on.
func (r *runner) stageGrant(o decide.Observation, img imageref.Pinned) (lease.Grant, bool) {
	for _, h := range o.Grants {
		c := lease.Check{Node: r.cfg.NodeName, Action: lease.ActionStage, Image: img.String(), BootID: o.Boot.BootID, Now: o.Now, LastRenew: h.LastRenew}
		if h.Grant.Allows(c) == nil {
			return h.Grant, true
		}
	}
	return lease.Grant{}, false
}

// heldGrant returns the held grant with this identity.
func (r *runner) heldGrant(id lease.ID) (lease.Grant, bool) {
	h := r.held[id.Lease]
	if h == nil || h.grant.ID != id {
		return lease.Grant{}, false
	}
	return h.grant, true
}

// confirm renews want right before a disruptive step. The renew updates the
// version just read, so it succeeds only if the API server still holds this
// exact grant (same identity, image, phase and boot): a revoke made after
// the informer last looked cannot slip through. On success the step is
// traced and logged with the version the renew produced.
func (r *runner) confirm(ctx context.Context, want lease.Grant, step, bootID string) bool {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	now := r.now()
	fresh, updated, err := r.kube.renew(cctx, want.Lease, now)
	var g lease.Grant
	if err == nil && updated != nil {
		g, err = lease.Parse(updated)
	}
	if err != nil || updated == nil || g.ID != want.ID || g.Image != want.Image || g.Phase != want.Phase ||
		g.BootID != want.BootID || g.Failure != want.Failure || g.Holder != r.cfg.NodeName {
		r.log.Info("grant not confirmed; not acting", "step", step, "lease", want.Lease, "grant", want.ID.String(), "err", err)
		delete(r.held, want.Lease)
		return false
	}
	rvs := []string{updated.ResourceVersion}
	if fresh != nil {
		rvs = append(rvs, fresh.ResourceVersion)
	}
	r.held[want.Lease] = &held{grant: g, lastRenew: now, rvs: rvs}
	r.log.Info("grant confirmed", "step", step, "lease", want.Lease, "resourceVersion", updated.ResourceVersion,
		"grant", g.ID.String(), "image", g.Image.String(), "bootID", bootID)
	if r.deps.Trace != nil {
		r.deps.Trace(Step{Kind: step, Lease: want.Lease, ResourceVersion: updated.ResourceVersion, Grant: g.ID,
			Image: g.Image.String(), BootID: bootID})
	}
	return true
}

func (r *runner) stageFinished(err error) {
	s := r.stage
	r.stage = nil
	if s == nil {
		return
	}
	s.cancel()
	if err != nil {
		if r.stageDelay == 0 {
			r.stageDelay = r.cfg.StageRetry
		} else if r.stageDelay *= 2; r.stageDelay > 10*time.Minute {
			r.stageDelay = 10 * time.Minute
		}
		r.stageFail = &decide.StageFailure{Image: s.image, Message: err.Error(), RetryAt: r.now().Add(r.stageDelay)}
		r.log.Error("stage failed", "image", s.image.String(), "err", err, "retryIn", r.stageDelay)
		return
	}
	r.stageFail, r.stageDelay = nil, 0
	r.log.Info("stage finished", "image", s.image.String())
}

// cancelStage stops the in-flight stage and waits for the bootc process to
// be gone, pinging the watchdog meanwhile.
func (r *runner) cancelStage(ctx context.Context) {
	s := r.stage
	if s == nil {
		return
	}
	s.cancel()
	r.await(ctx, s.done)
	r.stage = nil
	r.log.Info("stage cancelled", "image", s.image.String())
}

// await waits for done, sending WATCHDOG=1 from this loop while it waits.
func (r *runner) await(ctx context.Context, done <-chan error) error {
	tick := time.Second
	if wd, ok := r.deps.Notifier.WatchdogInterval(); ok && wd/2 < tick {
		tick = wd / 2
	}
	for {
		t := r.deps.Clock.NewTimer(tick)
		select {
		case err := <-done:
			t.Stop()
			return err
		case <-t.C():
			_ = r.deps.Notifier.Watchdog()
		}
	}
}

func (r *runner) clearRecord(o decide.Observation, a decide.Action) bool {
	if a.MarkSpent {
		if err := r.deps.Records.AddSpent(o.Record.Grant); err != nil {
			r.log.Error("could not mark the grant spent; keeping the record", "grant", o.Record.Grant.String(), "err", err)
			return false
		}
	}
	if err := r.deps.Records.Clear(); err != nil {
		r.log.Error("could not clear the reboot record", "err", err)
		return false
	}
	r.rebootIssued = nil
	if a.Keep && o.Desired.Set && o.Desired.Invalid == "" {
		r.verdict = &decide.Verdict{Boot: o.Boot, Desired: o.Desired.Image, Reason: a.Reason, Message: a.Message}
	}
	return true
}

// applyAndReboot: write the record (first use of the grant), report
// Rebooting, re-read status and check the staged digest, unlock, re-read and
// check again, then reboot through D-Bus.
func (r *runner) applyAndReboot(ctx context.Context, o decide.Observation, a decide.Action) bool {
	if a.WriteRecord {
		rec := record.Record{Grant: a.Grant, Image: a.Image.String(), BootID: o.Boot.BootID,
			SoftRebootCount: o.Boot.SoftRebootCount, Soft: a.Soft, Recorded: o.Now}
		if err := r.deps.Records.Write(rec); err != nil {
			r.log.Error("could not write the reboot record; not rebooting", "err", err)
			return false
		}
		r.log.Info("reboot recorded", "grant", a.Grant.String(), "image", a.Image.String(), "boot", o.Boot.String())
	}
	r.report(ctx, o, bootc.Status{}, a)
	if !r.stagedIs(ctx, o.Boot, a.Image, "before unlocking") {
		return true
	}
	g, ok := r.heldGrant(a.Grant)
	if !ok || !r.confirm(ctx, g, "apply", o.Boot.BootID) {
		return true
	}
	actx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	done := make(chan error, 1)
	go func() { done <- r.deps.Bootc.ApplyStaged(actx) }()
	err := r.await(ctx, done)
	cancel()
	if err != nil {
		r.log.Error("bootc upgrade --from-downloaded failed; will retry while the grant is valid", "err", err)
		return false
	}
	if !r.stagedIs(ctx, o.Boot, a.Image, "after unlocking") {
		return true
	}
	step := "reboot"
	if a.Soft {
		step = "soft-reboot"
	}
	if !r.confirm(ctx, g, step, o.Boot.BootID) {
		return true
	}
	rctx, rcancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer rcancel()
	if a.Soft {
		err = r.deps.Host.SoftReboot(rctx)
	} else {
		err = r.deps.Host.Reboot(rctx)
	}
	if err != nil {
		r.log.Error("reboot request failed; will retry while the grant is valid", "soft", a.Soft, "err", err)
		return false
	}
	id := a.Grant
	r.rebootIssued = &id
	r.log.Info("reboot requested", "grant", a.Grant.String(), "image", a.Image.String(), "soft", a.Soft)
	return false
}

// stagedIs re-reads bootc status and checks, in the same boot, that the
// staged deployment is exactly img. On a mismatch it drops the record (no
// reboot happens) and the next round reports what it finds.
func (r *runner) stagedIs(ctx context.Context, boot decide.BootIdentity, img imageref.Pinned, when string) bool {
	st, err := r.readStatus(ctx)
	now, _, idErr := r.identity(ctx)
	var got imageref.Pinned
	if err == nil && st.Staged != nil {
		got, _ = st.Staged.Pinned()
	}
	if err == nil && idErr == nil && now == boot && got == img {
		return true
	}
	r.log.Error("staged deployment is not the granted image; not rebooting", "when", when,
		"staged", got.String(), "granted", img.String(), "statusErr", err, "boot", now.String())
	if st.Staged != nil && !st.Staged.DownloadOnly && got != img {
		return false // leave the record: the next round reports the unlocked mismatch
	}
	if cerr := r.deps.Records.Clear(); cerr != nil {
		r.log.Error("could not clear the reboot record", "err", cerr)
	}
	return false
}

// report patches BootcNode.status when it changed (or every ReportInterval)
// and sends STATUS= when the phase or message changed.
func (r *runner) report(ctx context.Context, o decide.Observation, st bootc.Status, a decide.Action) {
	msg := a.Message
	if len(r.malformed) > 0 {
		msg += fmt.Sprintf(" (ignoring %d malformed lease(s))", len(r.malformed))
	}
	line := string(a.Phase) + ": " + msg
	if line != r.lastNotify {
		if err := r.deps.Notifier.Status(line); err != nil {
			r.log.Error("sd_notify STATUS failed", "err", err)
		}
		r.lastNotify = line
	}
	n := r.kube.bootcNode()
	if n == nil {
		return // the coordinator has not created it yet
	}
	rep := statusReport{
		ObservedGeneration: n.Generation,
		BootID:             o.Boot.BootID,
		SoftRebootCount:    o.Boot.SoftRebootCount,
		Phase:              a.Phase,
		Reason:             a.Reason,
		Message:            msg,
		AgentVersion:       r.cfg.Version,
		LastReportTime:     r.now(),
	}
	if st.Booted != nil || st.Staged != nil || st.Rollback != nil {
		rep.Booted, rep.Staged, rep.Rollback = deployment(st.Booted), deployment(st.Staged), deployment(st.Rollback)
	} else if r.reported {
		rep.Booted, rep.Staged, rep.Rollback = r.lastReport.Booted, r.lastReport.Staged, r.lastReport.Rollback
	}
	conds := append([]metav1.Condition(nil), n.Status.Conditions...)
	c := metav1.Condition{Type: ConditionGrantsReadable, Status: metav1.ConditionTrue, Reason: ReasonGrantsValid,
		Message: "every lease labelled with this node follows the slot protocol", ObservedGeneration: n.Generation}
	if len(r.malformed) > 0 {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, ReasonMalformedGrant, "ignored: "+strings.Join(r.malformed, "; ")
	}
	meta.SetStatusCondition(&conds, c)
	rep.Conditions = conds
	if r.reported && rep.sameAs(r.lastReport) && r.now().Sub(r.lastReportAt) < r.cfg.ReportInterval {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if err := r.kube.patchStatus(pctx, rep); err != nil {
		r.log.Info("status report failed", "err", err)
		return
	}
	r.lastReport, r.lastReportAt, r.reported = rep, r.now(), true
}

func deployment(e *bootc.Entry) *fleetv1.Deployment {
	if e == nil {
		return nil
	}
	d := &fleetv1.Deployment{
		Image: e.Image, Digest: e.Digest, Version: e.Version,
		DownloadOnly: e.DownloadOnly, SoftRebootCapable: e.SoftRebootCapable,
	}
	if e.Timestamp != nil {
		t := metav1.NewTime(*e.Timestamp)
		d.Timestamp = &t
	}
	return d
}
