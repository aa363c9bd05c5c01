package plan

import (
	"errors"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
)

// ParseSlot reads a slot Lease of pool with the codec (lease.Parse,
// lease.ParseFree). ok is false when the Lease is not a slot of this pool at
// all (its name does not parse to the pool).
func ParseSlot(pool string, l *coordinationv1.Lease) (s Slot, ok bool) {
	p, kind, idx, err := lease.ParseSlotName(l.Name)
	if err != nil || p != pool {
		return Slot{}, false
	}
	s = Slot{Name: l.Name, Kind: kind, Index: idx, Holder: lease.Holder(l)}
	g, err := lease.Parse(l)
	switch {
	case errors.Is(err, lease.ErrFree):
		s.State = SlotFree
		if s.ReleasedAt, err = lease.ParseFree(l); err != nil {
			s.State, s.Problem = SlotMalformed, err.Error()
		}
	case err != nil:
		s.State, s.Problem = SlotMalformed, err.Error()
	default:
		s.State, s.Grant = SlotHeld, g
		s.BackSince, s.CameBack = g.BackSince, g.CameBack
		s.CordonedByUs, s.CordonPending = g.Cordon == lease.CordonOurs, g.Cordon == lease.CordonPending
		if g.CordonProblem != "" {
			s.State, s.Problem = SlotMalformed, g.CordonProblem
		}
	}
	s.Phase = PhaseOf(s)
	return s, true
}

// NewSlotLease is a free slot Lease to create.
func NewSlotLease(pool string, ref SlotRef) *coordinationv1.Lease {
	return lease.NewSlot(pool, ref.Kind, ref.Index)
}

// ApplyToLease makes change c on l (the Lease as read), at now, with the
// codec. The caller writes l back with one Update, so a concurrent change
// loses with a Conflict.
func ApplyToLease(l *coordinationv1.Lease, c SlotChange, now time.Time, leaseDuration time.Duration) {
	switch c.Op {
	case OpGrant:
		lease.Issue(l, lease.Terms{Kind: c.Kind, Holder: c.Node, Image: c.Image, BootID: c.BootID,
			SoftRebootCount: c.SoftRebootCount, StageTimeout: c.StageTimeout, Rollback: c.Rollback, Cordon: c.Cordon}, now, leaseDuration)
	case OpAdvance:
		lease.Advance(l, c.CordonedByUs, now)
	case OpMarkFailed:
		lease.MarkFailed(l, c.Failure)
	case OpMarkBack:
		lease.MarkBack(l, c.BackSince)
	case OpRelease, OpRevoke:
		if c.Op == OpRelease && c.Kind == lease.KindReboot && (c.Why == WhyVerified || c.Why == WhyRolledBack || c.Why == WhyRolledBackByHost) {
			lease.Release(l, now) // its time starts pauseBetweenBatches
		} else {
			lease.Clear(l)
		}
	case OpReset:
		lease.Reset(l)
	}
}
