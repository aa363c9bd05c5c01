package plan

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
)

// ParseSlot reads a slot Lease of pool. ok is false when the Lease is not a
// slot of this pool at all (its name does not parse to the pool).
func ParseSlot(pool string, l *coordinationv1.Lease) (s Slot, ok bool) {
	p, kind, idx, err := lease.ParseSlotName(l.Name)
	if err != nil || p != pool {
		return Slot{}, false
	}
	s = Slot{Name: l.Name, Kind: kind, Index: idx}
	if l.Spec.HolderIdentity != nil {
		s.Holder = *l.Spec.HolderIdentity
	}
	g, err := lease.Parse(l)
	switch {
	case errors.Is(err, lease.ErrFree):
		// A free slot with leftover grant annotations is damaged: reset it,
		// so nothing stale is read from it later.
		_, softCount := l.Annotations[lease.AnnotationSoftRebootCount]
		if l.Labels[lease.LabelHolder] != "" || l.Annotations[lease.AnnotationImage] != "" || l.Annotations[lease.AnnotationPhase] != "" || softCount {
			s.State, s.Problem = SlotMalformed, "free slot with leftover grant labels or annotations"
			return s, true
		}
		s.State = SlotFree
		// A timestamp we cannot read only loses the pause it would start.
		s.ReleasedAt, _ = time.Parse(time.RFC3339Nano, l.Annotations[lease.AnnotationReleasedAt])
	case err != nil:
		s.State, s.Problem = SlotMalformed, err.Error()
	default:
		s.State, s.Grant = SlotHeld, g
		// Unreadable: the minReadySeconds clock starts again, later, never earlier.
		s.BackSince, _ = time.Parse(time.RFC3339Nano, l.Annotations[lease.AnnotationBackSince])
		// Any value says the node came back under this grant.
		_, s.CameBack = l.Annotations[lease.AnnotationCameBack]
		if kind == lease.KindReboot {
			switch v := l.Annotations[lease.AnnotationCordonedByUs]; v {
			case "true", "false":
				s.CordonedByUs = v == "true"
			case CordonPending:
				s.CordonPending = true
			default:
				s.State, s.Problem = SlotMalformed, fmt.Sprintf("annotation %s=%q is not true, false or %s", lease.AnnotationCordonedByUs, v, CordonPending)
			}
		}
	}
	return s, true
}

// NewSlotLease is a free slot Lease to create.
func NewSlotLease(pool string, ref SlotRef) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      ref.Name,
			Namespace: lease.Namespace,
			Labels:    map[string]string{lease.LabelPool: pool, lease.LabelSlot: string(ref.Kind)},
		},
	}
}

// ApplyToLease makes change c on l (the Lease as read), at now. The caller
// writes l back with one Update, so a concurrent change loses with a Conflict.
func ApplyToLease(l *coordinationv1.Lease, c SlotChange, now time.Time, leaseDuration time.Duration) {
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	mt := &metav1.MicroTime{Time: now}
	switch c.Op {
	case OpGrant:
		tr := int32(0)
		if l.Spec.LeaseTransitions != nil {
			tr = *l.Spec.LeaseTransitions
		}
		clearGrant(l)
		secs := int32(leaseDuration / time.Second)
		if secs < 1 {
			secs = 1
		}
		l.Spec.HolderIdentity = ptr.To(c.Node)
		l.Spec.AcquireTime, l.Spec.RenewTime = mt, mt.DeepCopy()
		l.Spec.LeaseDurationSeconds = ptr.To(secs)
		l.Spec.LeaseTransitions = ptr.To(tr + 1)
		l.Labels[lease.LabelHolder] = c.Node
		l.Annotations[lease.AnnotationImage] = c.Image.String()
		l.Annotations[lease.AnnotationBootID] = c.BootID
		l.Annotations[lease.AnnotationSoftRebootCount] = lease.FormatSoftRebootCount(c.SoftRebootCount)
		if c.Kind == lease.KindStage && c.StageTimeout > 0 {
			l.Annotations[lease.AnnotationStageTimeout] = lease.FormatStageTimeout(c.StageTimeout)
		}
		if c.Kind == lease.KindReboot {
			l.Annotations[lease.AnnotationPhase] = string(lease.PhaseDraining)
			// The cordon call's answer is recorded right after it; until
			// then a Node cordoned with this grant's mark is ours (the call
			// writes the mark in the cordon's own update), amendment 23.
			l.Annotations[lease.AnnotationCordonedByUs] = CordonPending
		}
	case OpAdvance:
		l.Annotations[lease.AnnotationPhase] = string(lease.PhaseReboot)
		l.Annotations[lease.AnnotationCordonedByUs] = strconv.FormatBool(c.CordonedByUs)
		// renewTime starts the reboot timer, on the coordinator's clock.
		// Agents write no Lease, so nothing extends it.
		l.Spec.RenewTime = mt
	case OpMarkFailed:
		l.Annotations[lease.AnnotationFailure] = c.Failure
	case OpMarkBack:
		if c.BackSince.IsZero() {
			delete(l.Annotations, lease.AnnotationBackSince)
		} else {
			l.Annotations[lease.AnnotationBackSince] = c.BackSince.UTC().Format(time.RFC3339Nano)
			if _, ok := l.Annotations[lease.AnnotationCameBack]; !ok {
				l.Annotations[lease.AnnotationCameBack] = c.BackSince.UTC().Format(time.RFC3339Nano)
			}
		}
	case OpRelease, OpRevoke:
		clearGrant(l)
		if c.Op == OpRelease && c.Kind == lease.KindReboot && c.Why == WhyVerified {
			l.Annotations[lease.AnnotationReleasedAt] = now.UTC().Format(time.RFC3339Nano)
		}
	case OpReset:
		clearGrant(l)
		if pool, kind, _, err := lease.ParseSlotName(l.Name); err == nil {
			l.Labels[lease.LabelPool], l.Labels[lease.LabelSlot] = pool, string(kind)
		}
		if l.Spec.LeaseTransitions != nil && *l.Spec.LeaseTransitions < 0 {
			l.Spec.LeaseTransitions = ptr.To(int32(0))
		}
	}
}

func clearGrant(l *coordinationv1.Lease) {
	l.Spec.HolderIdentity = nil
	l.Spec.AcquireTime, l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = nil, nil, nil
	delete(l.Labels, lease.LabelHolder)
	for _, a := range []string{lease.AnnotationImage, lease.AnnotationBootID, lease.AnnotationSoftRebootCount, lease.AnnotationPhase,
		lease.AnnotationFailure, lease.AnnotationCordonedByUs, lease.AnnotationBackSince, lease.AnnotationCameBack, lease.AnnotationReleasedAt,
		lease.AnnotationStageTimeout} {
		delete(l.Annotations, a)
	}
}

// CordonPending is the cordoned-by-us value of a reboot grant whose cordon
// call has not been answered on the grant yet (amendment 23).
const CordonPending = "pending"

// RecordCordon records on reboot grant l (as read or just written) what its
// cordon call found: ours when that call made the cordon, not ours when the
// Node was cordoned already. The controller writes l back with one Update
// right after the call (amendments 21 and 23).
func RecordCordon(l *coordinationv1.Lease, ours bool) {
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[lease.AnnotationCordonedByUs] = strconv.FormatBool(ours)
}
