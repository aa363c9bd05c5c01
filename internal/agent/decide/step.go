package decide

import (
	"errors"
	"fmt"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// EffectKind names what the runner is to run.
type EffectKind string

// The effects. Each one the runner runs is answered with a Result of the
// same kind; Step then emits the next one, at most one at a time.
const (
	// EffectConfirmStage, EffectConfirmApply, EffectConfirmReboot: read
	// the grant's Lease with a consistent GET (the Result carries it).
	EffectConfirmStage  EffectKind = "ConfirmStage"
	EffectConfirmApply  EffectKind = "ConfirmApply"
	EffectConfirmReboot EffectKind = "ConfirmReboot"
	// EffectConfirmRollback: the same read, before `bootc rollback`.
	EffectConfirmRollback EffectKind = "ConfirmRollback"
	// EffectStage: start bootc's locked stage of Image in the background;
	// its end comes as a StageDone input.
	EffectStage EffectKind = "Stage"
	// EffectCancelStage: stop the stage and wait for bootc to be gone.
	EffectCancelStage EffectKind = "CancelStage"
	// EffectClearRecord: remove the reboot record (marking its grant spent
	// first when MarkSpent).
	EffectClearRecord EffectKind = "ClearRecord"
	// EffectWriteRecord: write the reboot record (first use of the grant).
	EffectWriteRecord EffectKind = "WriteRecord"
	// EffectReport: report Action (RollingBack) before the rollback; an
	// update's reboot is not reported (amendment 37).
	EffectReport EffectKind = "Report"
	// EffectReadStatus: read bootc status and the boot identity again.
	EffectReadStatus EffectKind = "ReadStatus"
	// EffectUnlock: bootc upgrade --from-downloaded (with
	// --soft-reboot=auto when Soft).
	EffectUnlock EffectKind = "Unlock"
	// EffectReboot: ask logind to reboot (soft when Soft).
	EffectReboot EffectKind = "Reboot"
	// EffectRollback: `bootc rollback` (with --soft-reboot=auto when Soft):
	// queue the rollback deployment for the next boot.
	EffectRollback EffectKind = "Rollback"
)

// Steps: the Step of a confirm and of the disruptive effect it guards (as
// Deps.Trace and the log name them), and of a status re-read.
const (
	StepStage        = "stage"
	StepApply        = "apply"
	StepReboot       = "reboot"
	StepSoftReboot   = "soft-reboot"
	StepBeforeUnlock = "before unlocking"
	StepAfterUnlock  = "after unlocking"
	// The rollback's confirm and re-reads (amendment 25).
	StepRollback       = "rollback"
	StepBeforeRollback = "before rolling back"
	StepAfterRollback  = "after rolling back"
)

// Effect is one thing for the runner to run.
type Effect struct {
	Kind EffectKind
	// Grant is the grant it runs under (for ClearRecord and WriteRecord
	// only its ID is set).
	Grant HeldGrant
	Image imageref.Pinned
	// Boot is the boot the decision was made in.
	Boot BootIdentity
	// Step names a confirm and the step it guards, or a re-read.
	Step string
	// Soft: a soft reboot (WriteRecord, Unlock, Rollback, Reboot).
	Soft bool
	// Rollback: WriteRecord records a rollback.
	Rollback bool
	// Enforce: stage with bootc's signature enforcement.
	Enforce bool
	// MarkSpent: ClearRecord marks the record's grant spent.
	MarkSpent bool
	// TimedOut: CancelStage of a stage past its timeout.
	TimedOut bool
	// Action is what Report reports.
	Action Action
	// Recorded is the time WriteRecord records.
	Recorded time.Time
	// ResourceVersion is the version of the read that confirmed the grant
	// (Stage, Unlock, Reboot).
	ResourceVersion string
	// Why says why a reboot is soft or full.
	Why string
}

func (e Effect) String() string {
	s := string(e.Kind)
	if e.Step != "" {
		s += " " + e.Step
	}
	if e.Grant.Lease != "" {
		s += " grant=" + e.Grant.ID.String()
	}
	if e.Image.Digest != "" {
		s += " image=" + short(e.Image)
	}
	if e.Soft {
		s += " soft"
	}
	if e.Rollback {
		s += " rollback"
	}
	if e.MarkSpent {
		s += " mark-spent"
	}
	if e.TimedOut {
		s += " timed-out"
	}
	if e.Kind == EffectReport {
		s += " " + string(e.Action.Phase) + "/" + e.Action.Reason
	}
	return s
}

// Result is what running an effect gave.
type Result struct {
	Kind EffectKind
	// Err is why it failed; empty on success.
	Err string
	// Status (ReadStatus) is the re-read, ReadIn the boot identity read
	// after it (zero when that failed).
	Status Status
	// Lease (Confirm*) is the grant the consistent read returned, and
	// ResourceVersion its version.
	Lease           *lease.Grant
	ResourceVersion string
}

// LeaseView is what the Lease informer shows for this node.
type LeaseView struct {
	Grants    []lease.Grant
	Malformed []string
}

// StageDone is the end of a stage.
type StageDone struct {
	// Err is why it failed; empty when it finished.
	Err string
	// Rejected: the host's signature policy refused the image.
	Rejected bool
	// Unauthorized: the registry refused bootc's credentials.
	Unauthorized bool
	// Message is bootc's error line (Rejected, Unauthorized).
	Message string
}

// Reported is a status report the API server accepted: each grant it
// listed in use has it as its heartbeat.
type Reported struct {
	Sent   time.Time
	Grants []lease.ID
}

// Input is one thing that happened: a round's observation (with the Lease
// informer's grants), the result of an effect, the end of a stage, or an
// accepted report. Now is the agent's clock when it happened.
type Input struct {
	Now     time.Time
	Leases  *LeaseView
	Observe *Observation
	// Partial: the boot identity could not be read.
	Partial   bool
	Result    *Result
	StageDone *StageDone
	Reported  *Reported
}

// ErrNotConfirmed means the consistent read does not show the grant as held.
var ErrNotConfirmed = errors.New("grant not confirmed")

// Step is the agent: from its memory and one input to its next memory and
// the effects to run, in order. It does no I/O and reads no clock.
func Step(s State, in Input) (State, []Effect) {
	s = s.clone()
	s.Note = ""
	switch {
	case in.Result != nil:
		return s.result(in.Now, *in.Result)
	case in.StageDone != nil:
		s.stageDone(in.Now, *in.StageDone)
		return s, nil
	case in.Reported != nil:
		s.credit(*in.Reported)
		return s, nil
	}
	if in.Leases != nil {
		s.syncGrants(*in.Leases)
	}
	if in.Observe == nil {
		return s, nil
	}
	s.Pending, s.Again = nil, false
	o := s.view(*in.Observe, in.Now, in.Partial)
	a := Decide(o)
	s.Last = Decision{Obs: o, Action: a}
	return s.act(in.Now, o, a)
}

// act turns a decision into its first effect.
func (s State) act(now time.Time, o Observation, a Action) (State, []Effect) {
	switch a.Kind {
	case Stage:
		g, ok := s.Held(a.Grant)
		if !ok {
			s.Again, s.Note = true, "grant "+a.Grant.String()+" is no longer held"
			return s, nil
		}
		return s.await(Effect{Kind: EffectConfirmStage, Grant: g, Image: a.Image, Boot: o.Boot, Step: StepStage, Enforce: a.Enforce}, a)
	case CancelStage:
		return s.await(Effect{Kind: EffectCancelStage, Image: a.Image, TimedOut: a.TimedOut}, a)
	case ClearRecord:
		return s.await(Effect{Kind: EffectClearRecord, Grant: idOnly(o.Record.Grant), Image: o.Record.Image, MarkSpent: a.MarkSpent}, a)
	case ApplyAndReboot, Rollback:
		if a.WriteRecord {
			return s.await(Effect{Kind: EffectWriteRecord, Grant: idOnly(a.Grant), Image: a.Image, Boot: o.Boot, Soft: a.Soft,
				Rollback: a.Kind == Rollback, Recorded: now}, a)
		}
		return s.recorded(a)
	}
	return s, nil
}

// recorded goes on once the reboot record is written: a rollback is
// reported first (a node in trouble says so before it goes down); an update's
// reboot re-reads the staged deployment at once, unreported (amendment 37).
func (s State) recorded(a Action) (State, []Effect) {
	if a.Kind == Rollback {
		return s.await(Effect{Kind: EffectReport, Action: a}, a)
	}
	return s.await(Effect{Kind: EffectReadStatus, Step: StepBeforeUnlock, Image: a.Image, Boot: s.Last.Obs.Boot}, a)
}

func idOnly(id lease.ID) HeldGrant { return HeldGrant{Grant: lease.Grant{ID: id}} }

// await emits e and waits for its result.
func (s State) await(e Effect, a Action) (State, []Effect) {
	p := &Pending{Effect: e, Action: a}
	if s.Pending != nil {
		p.Soft, p.Why = s.Pending.Soft, s.Pending.Why
	}
	s.Pending = p
	return s, []Effect{e}
}

// stop ends the sequence; again asks for another round at once.
func (s State) stop(again bool, note string) (State, []Effect) {
	s.Pending, s.Again, s.Note = nil, again, note
	return s, nil
}

// result takes the result of the pending effect and emits the next one.
func (s State) result(now time.Time, r Result) (State, []Effect) {
	p := s.Pending
	if p == nil || p.Effect.Kind != r.Kind {
		s.Note = "a result of " + string(r.Kind) + " that no effect awaits; ignored"
		return s, nil
	}
	e, a := p.Effect, p.Action
	switch r.Kind {
	case EffectConfirmStage, EffectConfirmApply, EffectConfirmReboot, EffectConfirmRollback:
		return s.confirmResult(now, e, a, r)
	case EffectStage:
		if r.Err != "" {
			return s.stop(true, r.Err)
		}
		s.Stage = &InFlight{Image: e.Image, Grant: e.Grant.ID, Started: now, Timeout: e.Grant.StageTimeout}
		return s.stop(false, "")
	case EffectCancelStage:
		if st := s.Stage; st != nil && e.TimedOut {
			s.stageTimedOut(now, st)
		}
		s.Stage = nil
		return s.stop(true, "")
	case EffectClearRecord:
		return s.cleared(e, a, r)
	case EffectWriteRecord:
		if r.Err != "" {
			return s.stop(false, "could not write the reboot record; not rebooting: "+r.Err)
		}
		return s.recorded(a)
	case EffectReport:
		return s.await(Effect{Kind: EffectReadStatus, Step: StepBeforeRollback, Image: a.Image, Boot: s.Last.Obs.Boot}, a)
	case EffectReadStatus:
		if a.Kind == Rollback {
			return s.rollbackReread(e, a, r)
		}
		return s.reread(e, a, r)
	case EffectRollback:
		if r.Err != "" {
			return s.stop(false, "bootc rollback failed; will retry while the grant is valid: "+r.Err)
		}
		return s.await(Effect{Kind: EffectReadStatus, Step: StepAfterRollback, Image: a.Image, Boot: e.Boot}, a)
	case EffectUnlock:
		if r.Err != "" {
			return s.stop(false, "bootc upgrade --from-downloaded failed; will retry while the grant is valid: "+r.Err)
		}
		return s.await(Effect{Kind: EffectReadStatus, Step: StepAfterUnlock, Image: a.Image, Boot: e.Boot}, a)
	case EffectReboot:
		if r.Err != "" {
			return s.stop(false, r.Err)
		}
		id := a.Grant
		s.RebootIssued = &id
		return s.stop(false, "")
	}
	return s.stop(false, "")
}

// confirmResult checks the consistent read of a confirm and emits the step
// it guards.
func (s State) confirmResult(now time.Time, e Effect, a Action, r Result) (State, []Effect) {
	act := lease.ActionReboot
	switch {
	case e.Kind == EffectConfirmStage:
		act = lease.ActionStage
	case a.Kind == Rollback:
		act = lease.ActionRollback
	}
	if err := s.Confirmed(now, e, act, r); err != nil {
		if !errors.Is(err, lease.ErrExpired) {
			s.drop(e.Grant.Lease) // what we hold is not what the API server has
		}
		return s.stop(true, err.Error())
	}
	next := Effect{Grant: e.Grant, Image: e.Image, Boot: e.Boot, Step: e.Step, ResourceVersion: r.ResourceVersion}
	switch e.Kind {
	case EffectConfirmStage:
		next.Kind, next.Enforce = EffectStage, e.Enforce
	case EffectConfirmApply:
		next.Kind, next.Soft = EffectUnlock, a.Soft
	case EffectConfirmRollback:
		next.Kind, next.Soft = EffectRollback, a.Soft
	default:
		next.Kind, next.Soft, next.Why = EffectReboot, e.Soft, e.Why
	}
	return s.await(next, a)
}

// Confirmed is the one rule for a confirm: the API server's copy of the
// grant has the identity the decision used (lease name, UID,
// leaseTransitions) and lease.Grant.Allows accepts it for this node,
// action, image and boot, with the agent's last accepted heartbeat.
func (s State) Confirmed(now time.Time, e Effect, act lease.Action, r Result) error {
	switch {
	case r.Err != "":
		return fmt.Errorf("%w: %s", ErrNotConfirmed, r.Err)
	case r.Lease == nil:
		return fmt.Errorf("%w: no grant read", ErrNotConfirmed)
	case r.Lease.ID != e.Grant.ID:
		return fmt.Errorf("%w: the API server has %s", ErrNotConfirmed, r.Lease.ID)
	}
	return r.Lease.Allows(lease.Check{Node: s.Params.Node, Action: act, Image: e.Image.String(), BootID: e.Boot.BootID,
		SoftRebootCount: e.Boot.SoftRebootCount, Now: now, LastHeartbeat: e.Grant.LastHeartbeat})
}

// cleared: the record is gone; a Degraded result asked to be kept becomes
// the boot's verdict.
func (s State) cleared(e Effect, a Action, r Result) (State, []Effect) {
	if e.Step != "" { // dropped by a re-read in the reboot sequence
		return s.stop(true, "")
	}
	if r.Err != "" {
		return s.stop(false, "could not clear the reboot record: "+r.Err)
	}
	s.RebootIssued = nil
	o := s.Last.Obs
	if a.Keep && o.Desired.Set && o.Desired.Invalid == "" {
		s.Verdict = &Verdict{Boot: o.Boot, Desired: o.Desired.Image, Reason: a.Reason, Message: a.Message}
	}
	return s.stop(true, "")
}

// reread checks a status re-read in the reboot sequence: before the
// unlock it leads to the apply's confirm, after it to the reboot's.
func (s State) reread(e Effect, a Action, r Result) (State, []Effect) {
	staged, ok := StagedIs(r.Status, e.Boot, e.Image)
	if !ok {
		note := "staged deployment is not the granted image; not rebooting (" + e.Step + "): staged " + describe(r.Status.Staged) +
			", boot " + r.Status.ReadIn.String()
		if r.Status.Unavailable != "" {
			note += ", status: " + r.Status.Unavailable
		}
		if st := r.Status.Staged; st != nil && !st.DownloadOnly && !st.Is(e.Image) {
			return s.stop(true, note) // leave the record: the next round reports the unlocked mismatch
		}
		s.Note = note
		return s.await(Effect{Kind: EffectClearRecord, Grant: idOnly(a.Grant), Image: e.Image, Step: e.Step}, a)
	}
	g, held := s.Held(a.Grant)
	if !held {
		return s.stop(true, "grant "+a.Grant.String()+" is no longer held")
	}
	if e.Step == StepBeforeUnlock {
		return s.await(Effect{Kind: EffectConfirmApply, Grant: g, Image: e.Image, Boot: e.Boot, Step: StepApply, Soft: a.Soft}, a)
	}
	soft, why := SoftAfterUnlock(a, staged)
	step := StepReboot
	if soft {
		step = StepSoftReboot
	}
	s, effs := s.await(Effect{Kind: EffectConfirmReboot, Grant: g, Image: e.Image, Boot: e.Boot, Step: step, Soft: soft, Why: why}, a)
	s.Pending.Soft, s.Pending.Why = soft, why
	return s, effs
}

// StagedIs is the rule both the decision (rule 1) and the reboot sequence
// check: a status read in boot, without error, shows exactly img staged.
// It returns the staged deployment as read.
func StagedIs(st Status, boot BootIdentity, img imageref.Pinned) (*Deployment, bool) {
	if st.Unavailable != "" || !boot.Known() || st.ReadIn != boot || !st.Staged.Is(img) {
		return nil, false
	}
	return st.Staged, true
}

// stageDone takes the end of the stage: a signature rejection is final for
// the image, a failure backs off (doubling from StageRetry), a success
// forgets the failures.
func (s *State) stageDone(now time.Time, d StageDone) {
	st := s.Stage
	s.Stage = nil
	if st == nil {
		return
	}
	switch {
	case d.Err == "":
		s.StageFail, s.StageDelay = nil, 0
	case d.Rejected:
		// Deterministic: no retry for this image (Rejection).
		s.Rejected = &Rejection{Image: st.Image, Message: d.Message}
		s.StageFail, s.StageDelay = nil, 0
	default:
		attempts := 1
		if f := s.StageFail; f != nil && f.Grant == st.Grant && f.Image == st.Image {
			attempts = f.Attempts + 1
		} else {
			s.StageDelay = 0
		}
		if s.StageDelay == 0 {
			s.StageDelay = s.Params.StageRetry
		} else if s.StageDelay *= 2; s.StageDelay > MaxStageDelay {
			s.StageDelay = MaxStageDelay
		}
		f := &StageFailure{Image: st.Image, Grant: st.Grant, Attempts: attempts, Message: d.Err, RetryAt: now.Add(s.StageDelay)}
		if d.Unauthorized {
			f.Class, f.Message = fleetv1.ReasonRegistryUnauthorized, d.Message
		}
		s.StageFail = f
	}
}

// stageTimedOut counts a stage cancelled at its timeout (amendment 19) as a
// failed stage that lets go of its grant (StageFailure.TimedOut): the next
// round reports StageTimedOut and lists the grant as released.
func (s *State) stageTimedOut(now time.Time, st *InFlight) {
	attempts := 1
	if f := s.StageFail; f != nil && f.Grant == st.Grant && f.Image == st.Image {
		attempts = f.Attempts + 1
	}
	s.StageFail = &StageFailure{Image: st.Image, Grant: st.Grant, Attempts: attempts, TimedOut: true, RetryAt: now,
		Message: fmt.Sprintf("the stage did not finish within the stage timeout of %s", st.Timeout)}
	s.StageDelay = 0
}
