package decide

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// world is one node as Step meets it: the host (boot, bootc's deployments,
// the record and spent list), its grants on the API server, and the clock.
// It runs the effects Step emits the way the runner does, each with an
// outcome the caller picks (ok, fail), and feeds the results back in. The
// history property test drives it with random operations; the trace tests
// with scripts.
type world struct {
	now      time.Time
	boot     BootIdentity
	booted   *Deployment
	staged   *Deployment
	rollback *Deployment
	queued   bool // bootc rollback queued the rollback deployment
	desired  Desired
	policy   fleetv1.RebootPolicy
	signed   bool
	leases   map[string]lease.Grant
	uids     int
	record   RecordState
	corrupt  bool
	spent    []lease.ID
	running  *imageref.Pinned // the stage bootc runs
	failNext bool             // the next status read fails
	staleIn  BootIdentity     // set: the next status read is of this boot
	bootc    BootcSupport

	s       State
	pending []Effect
	// out collects what each step emitted, for traces.
	out []string
	// check, if set, runs after every step with the state before, the
	// input and what the step returned.
	check func(before State, in Input, after State, effs []Effect)
}

func newWorld(start time.Time) *world {
	return &world{
		now:      start,
		boot:     BootIdentity{BootID: bootA},
		booted:   &Deployment{Image: imgV1},
		rollback: &Deployment{Image: imgV3, SoftRebootCapable: true},
		desired:  Desired{Set: true, Image: imgV2},
		policy:   fleetv1.RebootPolicyReboot,
		leases:   map[string]lease.Grant{},
		bootc:    BootcSupport{Known: true, Version: "1.16.9", CanStage: true, SoftReboot: true},
		s:        NewState(Params{Node: node, StageRetry: 30 * time.Second, SettleTimeout: 2 * time.Minute, RebootTimeout: 15 * time.Minute}),
	}
}

func (w *world) step(in Input) {
	before := w.s
	after, effs := Step(w.s, in)
	if w.check != nil {
		w.check(before, in, after, effs)
	}
	w.s = after
	w.pending = append(effs, w.pending...)
	for _, e := range effs {
		w.out = append(w.out, "effect: "+e.String())
	}
}

// observe is one round: the Lease informer's view and a fresh observation.
func (w *world) observe() {
	var v LeaseView
	names := make([]string, 0, len(w.leases))
	for n := range w.leases {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		v.Grants = append(v.Grants, w.leases[n])
	}
	o := Observation{Desired: w.desired, Policy: w.policy, Boot: w.boot, SoftRebootSupported: true, Bootc: w.bootc,
		RequireSigned: w.signed, Spent: append([]lease.ID(nil), w.spent...), Record: w.record}
	o.Status = w.status()
	if w.corrupt {
		o.Record = RecordState{Unreadable: "torn"}
	}
	w.step(Input{Now: w.now, Leases: &v, Observe: &o})
}

func (w *world) status() Status {
	switch {
	case w.failNext:
		w.failNext = false
		return Status{Unavailable: "bootc status failed"}
	case w.staleIn.Known():
		st := Status{ReadIn: w.staleIn, Booted: w.booted, Staged: w.staged, Rollback: w.rollback, RollbackQueued: w.queued}
		w.staleIn = BootIdentity{}
		return st
	}
	return Status{ReadIn: w.boot, Booted: clone(w.booted), Staged: clone(w.staged), Rollback: clone(w.rollback), RollbackQueued: w.queued}
}

func clone(d *Deployment) *Deployment {
	if d == nil {
		return nil
	}
	c := *d
	return &c
}

// run runs the first pending effect with outcome ok (or a failure) and
// feeds its result back.
func (w *world) run(ok bool) {
	if len(w.pending) == 0 {
		return
	}
	e := w.pending[0]
	w.pending = w.pending[1:]
	r := Result{Kind: e.Kind}
	if !ok {
		r.Err = "failed"
	}
	switch e.Kind {
	case EffectConfirmStage, EffectConfirmApply, EffectConfirmReboot, EffectConfirmRollback:
		if g, held := w.leases[e.Grant.Lease]; held && ok {
			r.Lease, r.ResourceVersion = &g, "1"
		} else if ok {
			r.Err = "leases \"" + e.Grant.Lease + "\" not found"
		}
	case EffectStage:
		if ok {
			img := e.Image
			w.running = &img
		}
	case EffectCancelStage:
		w.running = nil
	case EffectClearRecord:
		if ok {
			if e.MarkSpent {
				w.spent = append(w.spent, e.Grant.ID)
			}
			w.record = RecordState{}
		}
	case EffectWriteRecord:
		if ok {
			w.record = RecordState{Present: true, Grant: e.Grant.ID, Image: e.Image, Boot: e.Boot, Recorded: e.Recorded, Soft: e.Soft, Rollback: e.Rollback}
		}
	case EffectReadStatus:
		// A failed re-read: bootc status fails, or (the host changed
		// under the agent) shows another image staged, unlocked.
		switch {
		case !ok && w.uids%2 == 0:
			w.failNext = true
		case !ok && e.Step == StepAfterRollback:
			other := imgV3
			if e.Image == imgV3 {
				other = imgV2
			}
			w.rollback = &Deployment{Image: other}
		case !ok:
			w.staged = &Deployment{Image: imgV3}
		}
		r.Status = w.status()
		r.Err = ""
	case EffectUnlock:
		if ok && w.staged != nil {
			w.staged.DownloadOnly = false
		}
	case EffectRollback:
		// bootc: no rollback deployment is an error; a staged one is
		// discarded; a second rollback takes the queued one back.
		if ok && w.rollback == nil {
			r.Err = "No rollback available"
		} else if ok {
			w.queued, w.staged = !w.queued, nil
		}
	}
	w.out = append(w.out, fmt.Sprintf("result: %s %s", e.Kind, okOr(r.Err)))
	w.step(Input{Now: w.now, Result: &r})
}

func okOr(err string) string {
	if err == "" {
		return "ok"
	}
	return "err=" + err
}

// stageEnds ends the stage bootc runs: done, failed, rejected or
// unauthorized.
func (w *world) stageEnds(how string) {
	if w.running == nil || w.s.Stage == nil {
		return
	}
	img := *w.running
	w.running = nil
	d := StageDone{}
	switch how {
	case "done":
		w.staged = &Deployment{Image: img, DownloadOnly: true, SoftRebootCapable: true, Signature: fleetv1.SignatureContainerPolicy}
	case "rejected":
		d = StageDone{Err: "rejected", Rejected: true, Message: "policy"}
	case "unauthorized":
		d = StageDone{Err: "401", Unauthorized: true, Message: "unauthorized"}
	default:
		d = StageDone{Err: "pull failed"}
	}
	w.step(Input{Now: w.now, StageDone: &d})
}

// report is an accepted report of the last decision: the grants it lists
// in use get their heartbeat.
func (w *world) report() {
	r := Reported{Sent: w.now}
	for _, c := range Claims(w.s.Last.Obs, w.s.Last.Action) {
		if c.Released == "" {
			r.Grants = append(r.Grants, c.ID)
		}
	}
	w.step(Input{Now: w.now, Reported: &r})
}

// grant gives slot 0 of kind to this node for img in boot (a new grant:
// a new leaseTransitions).
func (w *world) grant(kind lease.Kind, img imageref.Pinned, boot BootIdentity, phase lease.Phase) {
	name := lease.SlotName("pool", kind, 0)
	w.uids++
	g := lease.Grant{ID: lease.ID{Lease: name, UID: types.UID("uid-" + string(kind)), Transitions: int32(w.uids)},
		Pool: "pool", Kind: kind, Holder: node, Image: img, BootID: boot.BootID, SoftRebootCount: boot.SoftRebootCount,
		Phase: phase, Duration: time.Minute, StageTimeout: time.Hour, Namespace: lease.Namespace}
	w.leases[name] = g
}

// grantRollback gives the reboot slot to this node as a rollback grant
// for img in the current boot.
func (w *world) grantRollback(img imageref.Pinned, phase lease.Phase) {
	w.grant(lease.KindReboot, img, w.boot, phase)
	name := lease.SlotName("pool", lease.KindReboot, 0)
	g := w.leases[name]
	g.Rollback = true
	w.leases[name] = g
}

func (w *world) revoke(kind lease.Kind) { delete(w.leases, lease.SlotName("pool", kind, 0)) }

// setPhase rewrites the reboot grant's phase in place (same identity).
func (w *world) setPhase(p lease.Phase) {
	name := lease.SlotName("pool", lease.KindReboot, 0)
	if g, ok := w.leases[name]; ok {
		g.Phase = p
		w.leases[name] = g
	}
}

// markFailed is the coordinator's failure mark on a grant.
func (w *world) markFailed(kind lease.Kind) {
	name := lease.SlotName("pool", kind, 0)
	if g, ok := w.leases[name]; ok {
		g.Failure = "NotBackInTime"
		w.leases[name] = g
	}
}

// reboot is the host going down and up: a soft reboot keeps the boot ID and
// counts one more soft reboot. An unlocked staged deployment becomes the
// booted one; a locked one is dropped. restart: the agent's process starts
// anew (its memory is gone); else it runs on, as in-process fleets do.
func (w *world) reboot(soft, restart bool) {
	prev := w.boot
	if soft {
		w.boot.SoftRebootCount++
	} else {
		w.uids++
		w.boot = BootIdentity{BootID: fmt.Sprintf("%08d-0000-0000-0000-000000000000", w.uids)}
	}
	switch {
	case w.queued:
		w.booted, w.rollback = w.rollback, w.booted
	case w.staged != nil && !w.staged.DownloadOnly:
		w.booted, w.rollback = &Deployment{Image: w.staged.Image, SoftRebootCapable: w.staged.SoftRebootCapable}, w.booted
	}
	w.staged, w.running, w.queued = nil, nil, false
	w.pending = nil
	if restart {
		w.s = NewState(w.s.Params)
	}
	w.staleIn = prev // the first read may still show the old boot
}

// summary is the state in one line, for traces.
func (w *world) summary() string {
	s := w.s
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s decision=%s", s.Phase(), s.Last.Action.Kind)
	if a := s.Last.Action; a.Phase != "" {
		fmt.Fprintf(&b, " report=%s/%s", a.Phase, a.Reason)
	}
	for _, g := range s.Grants {
		hb := "none"
		if !g.LastHeartbeat.IsZero() {
			hb = g.LastHeartbeat.Sub(t0).String()
		}
		kind := string(g.Kind)
		if g.Rollback {
			kind = "rollback"
		}
		fmt.Fprintf(&b, "\n  grant %s %s %s boot=%s phase=%q heartbeat=%s", g.ID, kind, short(g.Image), g.BootID[:8], g.Phase, hb)
	}
	if st := s.Stage; st != nil {
		fmt.Fprintf(&b, "\n  stage %s under %s", short(st.Image), st.Grant)
	}
	if f := s.StageFail; f != nil {
		fmt.Fprintf(&b, "\n  stage failure %d under %s, retry at %s", f.Attempts, f.Grant, f.RetryAt.Sub(t0))
	}
	if s.RebootIssued != nil {
		fmt.Fprintf(&b, "\n  reboot issued under %s", *s.RebootIssued)
	}
	if w.queued {
		fmt.Fprintf(&b, "\n  rollback %s queued", describe(w.rollback))
	}
	if w.record.Present {
		fmt.Fprintf(&b, "\n  record %s under %s in boot %s/%d", short(w.record.Image), w.record.Grant, w.record.Boot.BootID[:8], w.record.Boot.SoftRebootCount)
	}
	return b.String()
}
