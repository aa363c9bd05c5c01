package decide

import (
	"sort"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
)

// Params are the agent's fixed settings that the rules read.
type Params struct {
	// Node is this node's name: the holder of its grants.
	Node string
	// StageRetry is the first delay after a failed stage (doubling, at
	// most MaxStageDelay).
	StageRetry time.Duration
	// SettleTimeout bounds how long a status that disagrees with the
	// record after a reboot is re-read.
	SettleTimeout time.Duration
	// RebootTimeout bounds how long a recorded reboot may take.
	RebootTimeout time.Duration
}

// MaxStageDelay bounds the delay between two attempts of a failing stage.
const MaxStageDelay = 10 * time.Minute

// InFlight is the stage running now.
type InFlight struct {
	Image imageref.Pinned
	Grant lease.ID
	// Started (the agent's clock) and Timeout bound the stage (amendment
	// 19): the grant's stage timeout when it started.
	Started time.Time
	Timeout time.Duration
}

// State is the agent's whole memory between two steps. Step is the only
// code that changes it; the runner reads it to report and to pace itself.
type State struct {
	Params Params

	// Grants are the grants held by this node, in lease name order, each
	// with the agent's own time of its last accepted heartbeat.
	Grants []HeldGrant
	// LeaseDuration is the duration of the last grant seen: the agent
	// keeps its heartbeat pace while a revoked stage is still winding down.
	LeaseDuration time.Duration
	// Malformed are the Leases labelled with this node that do not follow
	// the slot protocol ("name: why"), sorted.
	Malformed []string

	Stage      *InFlight
	StageFail  *StageFailure
	StageDelay time.Duration
	// Verdict is a Degraded result kept for the rest of the boot.
	Verdict *Verdict
	// Rejected is the last stage the signature policy refused; it holds
	// until the desired image changes (or the agent restarts).
	Rejected *Rejection

	// SettleKey/SettleDeadline: when the record from another boot was
	// first seen in this boot.
	SettleKey      string
	SettleDeadline time.Time
	// RebootIssued is the grant this process already rebooted for.
	RebootIssued *lease.ID

	// Pending is the effect whose result the next step expects, with the
	// sequence it belongs to; nil between rounds.
	Pending *Pending
	// Last is the observation and decision of the last round.
	Last Decision
	// Again: the round ended in a way that wants another round at once.
	Again bool
	// Note says why the last step stopped a sequence (for the log).
	Note string
}

// Decision is an observation as the rules saw it (with the state's memory
// filled in) and the action they chose.
type Decision struct {
	Obs    Observation
	Action Action
}

// Pending is the effect awaited, and the action whose sequence it runs.
type Pending struct {
	Effect Effect
	Action Action
	// Soft and Why: how the reboot goes, decided after the unlock.
	Soft bool
	Why  string
}

// NewState is the memory of an agent that just started.
func NewState(p Params) State { return State{Params: p} }

// Held returns the held grant with this identity.
func (s State) Held(id lease.ID) (HeldGrant, bool) {
	for _, g := range s.Grants {
		if g.ID == id {
			return g, true
		}
	}
	return HeldGrant{}, false
}

// HeldIn returns the grant held in this Lease.
func (s State) HeldIn(name string) (HeldGrant, bool) {
	for _, g := range s.Grants {
		if g.Lease == name {
			return g, true
		}
	}
	return HeldGrant{}, false
}

// clone copies what Step may change in place, so a State passed in is
// never modified.
func (s State) clone() State {
	s.Grants = append([]HeldGrant(nil), s.Grants...)
	s.Malformed = append([]string(nil), s.Malformed...)
	return s
}

// Phase is where the Step stands: between rounds (Ready, Staging,
// RebootRequested) or waiting for the result of one effect.
type Phase string

// The phases of the Step. Each names the effect it waits for, or what the
// agent does between rounds.
const (
	PhaseReady            Phase = "Ready"
	PhaseConfirmingStage  Phase = "ConfirmingStage"
	PhaseStartingStage    Phase = "StartingStage"
	PhaseStaging          Phase = "Staging"
	PhaseCancelling       Phase = "Cancelling"
	PhaseClearing         Phase = "Clearing"
	PhaseRecording        Phase = "Recording"
	PhaseReporting        Phase = "Reporting"
	PhaseCheckingStaged   Phase = "CheckingStaged"
	PhaseConfirmingApply  Phase = "ConfirmingApply"
	PhaseUnlocking        Phase = "Unlocking"
	PhaseCheckingUnlocked Phase = "CheckingUnlocked"
	PhaseConfirmingReboot Phase = "ConfirmingReboot"
	// The rollback's own phases (amendment 25); it then goes on through
	// ConfirmingReboot and Rebooting.
	PhaseCheckingRollback   Phase = "CheckingRollback"
	PhaseConfirmingRollback Phase = "ConfirmingRollback"
	PhaseRollingBack        Phase = "RollingBack"
	PhaseCheckingRolledBack Phase = "CheckingRolledBack"
	PhaseRebooting          Phase = "Rebooting"
	PhaseRebootRequested    Phase = "RebootRequested"
)

var pendingPhase = map[EffectKind]Phase{
	EffectConfirmStage:  PhaseConfirmingStage,
	EffectStage:         PhaseStartingStage,
	EffectCancelStage:   PhaseCancelling,
	EffectClearRecord:   PhaseClearing,
	EffectWriteRecord:   PhaseRecording,
	EffectReport:        PhaseReporting,
	EffectConfirmApply:  PhaseConfirmingApply,
	EffectUnlock:        PhaseUnlocking,
	EffectConfirmReboot: PhaseConfirmingReboot,
	EffectReboot:        PhaseRebooting,

	EffectConfirmRollback: PhaseConfirmingRollback,
	EffectRollback:        PhaseRollingBack,
}

// Phase is the state's phase.
func (s State) Phase() Phase {
	if p := s.Pending; p != nil {
		if p.Effect.Kind == EffectReadStatus {
			switch p.Effect.Step {
			case StepAfterUnlock:
				return PhaseCheckingUnlocked
			case StepBeforeRollback:
				return PhaseCheckingRollback
			case StepAfterRollback:
				return PhaseCheckingRolledBack
			}
			return PhaseCheckingStaged
		}
		return pendingPhase[p.Effect.Kind]
	}
	switch {
	case s.Stage != nil:
		return PhaseStaging
	case s.RebootIssued != nil:
		return PhaseRebootRequested
	}
	return PhaseReady
}

// syncGrants takes the grants the Lease informer shows: a grant whose Lease
// disappeared or changed hands is dropped at once; a grant rewritten in
// place (phase Draining -> Reboot) keeps its heartbeat, a new grant in the
// same Lease starts without one.
func (s *State) syncGrants(v LeaseView) {
	out := make([]HeldGrant, 0, len(v.Grants))
	for _, g := range v.Grants {
		if g.Holder != s.Params.Node {
			continue
		}
		if g.Duration > 0 {
			s.LeaseDuration = g.Duration
		}
		h := HeldGrant{Grant: g}
		if old, ok := s.HeldIn(g.Lease); ok && old.ID == g.ID {
			h.LastHeartbeat = old.LastHeartbeat
		}
		out = append(out, h)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Lease < out[j].Lease })
	s.Grants = out
	s.Malformed = append([]string(nil), v.Malformed...)
	sort.Strings(s.Malformed)
}

// credit gives every listed grant still held with that identity the
// report sent at sent as its heartbeat.
func (s *State) credit(r Reported) {
	for i, g := range s.Grants {
		for _, id := range r.Grants {
			if g.ID == id {
				s.Grants[i].LastHeartbeat = r.Sent
			}
		}
	}
}

// drop forgets the grant held in this Lease.
func (s *State) drop(name string) {
	out := s.Grants[:0]
	for _, g := range s.Grants {
		if g.Lease != name {
			out = append(out, g)
		}
	}
	s.Grants = out
}

// view fills o with the memory the rules read, updating what the
// observation ends (a verdict of another boot, a rejection of another
// image, the settle deadline of a new record).
// A partial observation (the boot identity could not be read) gets only
// the rejection: the rules then read it again soon and do nothing.
func (s *State) view(o Observation, now time.Time, partial bool) Observation {
	o.Now, o.Node, o.RebootTimeout = now, s.Params.Node, s.Params.RebootTimeout
	if !s.Rejected.holdsFor(o.Desired) {
		s.Rejected = nil
	}
	o.Rejected = s.Rejected
	if partial {
		return o
	}
	if !s.Verdict.of(o.Boot) {
		s.Verdict = nil
	}
	o.Verdict = s.Verdict
	o.SettleDeadline, o.RebootIssued = time.Time{}, false
	switch {
	case o.Record.Unreadable != "":
	case !o.Record.Present:
		s.SettleKey = ""
	default:
		if o.Record.Boot != o.Boot {
			// The settle deadline starts when this process first sees
			// the record from another boot.
			key := o.Record.Grant.String() + "/" + o.Boot.String()
			if s.SettleKey != key {
				s.SettleKey, s.SettleDeadline = key, now.Add(s.Params.SettleTimeout)
			}
			o.SettleDeadline = s.SettleDeadline
		}
		o.RebootIssued = s.RebootIssued != nil && *s.RebootIssued == o.Record.Grant
	}
	o.InFlight, o.InFlightStarted, o.InFlightTimeout = nil, time.Time{}, 0
	if st := s.Stage; st != nil {
		img := st.Image
		o.InFlight, o.InFlightStarted, o.InFlightTimeout = &img, st.Started, st.Timeout
	}
	// A stage grant the agent is done with is not listed (amendment 31):
	// it keeps no heartbeat, so should its locked stage go in this boot it
	// is used again only once a report lists it anew, as a new grant is.
	// A copy: the caller's State shares the slice (Step is pure).
	s.Grants = append([]HeldGrant(nil), s.Grants...)
	for i := range s.Grants {
		if StageFinished(o, s.Grants[i].Grant) {
			s.Grants[i].LastHeartbeat = time.Time{}
		}
	}
	o.Grants = append([]HeldGrant(nil), s.Grants...)
	o.LastStageFailure = s.StageFail
	return o
}
