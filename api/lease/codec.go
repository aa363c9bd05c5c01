package lease

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
)

// The slot-Lease codec: Parse reads a Lease into a Grant; Encode writes a
// Grant; NewSlot, Issue, Advance, RecordCordon, MarkFailed, MarkBack, Clear,
// Release and Reset are the coordinator's changes to a Lease as read, which
// it writes back with one Update (a concurrent change loses with a
// Conflict). Every annotation of a grant is written and read here only.

// Cordon is a reboot grant's record of whose cordon its node carries
// (AnnotationCordonedByUs).
type Cordon string

const (
	// CordonPending means the grant's cordon call has not been answered on the
	// grant yet; a Node cordoned with the grant's CordonMark is ours
	// (amendment 23).
	CordonPending Cordon = "pending"
	// CordonOurs means the grant's cordon call made the cordon.
	CordonOurs Cordon = "true"
	// CordonNotOurs means the Node was cordoned already when the call came.
	CordonNotOurs Cordon = "false"
)

// CordonOf is the record of a cordon call's answer.
func CordonOf(ours bool) Cordon { return Cordon(strconv.FormatBool(ours)) }

// Terms are what the coordinator grants a node: the slot's kind, and the
// image and boot (the kubelet's boot ID and the soft-reboot count the
// node's agent reported in it) the grant is for.
type Terms struct {
	Kind            Kind
	Holder          string
	Image           imageref.Pinned
	BootID          string
	SoftRebootCount uint32
	// StageTimeout (stage grants): written when positive (amendment 19).
	StageTimeout time.Duration
	// Rollback (reboot grants): a rollback grant; Image is the node's
	// rollback deployment (amendment 25).
	Rollback bool
	// Cordon (reboot grants): the cordon record to start from; empty means
	// pending (a new cordon call follows). A rollback grant keeps its
	// update grant's record: the node never left that cordon.
	Cordon Cordon
}

// NewSlot is free slot index of kind of pool, to create.
func NewSlot(pool string, kind Kind, index int) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      SlotName(pool, kind, index),
			Namespace: Namespace,
			Labels:    map[string]string{LabelPool: pool, LabelSlot: string(kind)},
		},
	}
}

// Encode is the slot Lease that holds g, as the coordinator writes it:
// Parse(Encode(g)) is g for every grant Parse can return.
func Encode(g Grant) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: g.Lease, Namespace: g.Namespace, UID: g.UID,
		Labels: map[string]string{LabelPool: g.Pool, LabelSlot: string(g.Kind)},
	}}
	put(l, g)
	return l
}

// Issue grants slot l (as read) on terms t at now, for d (whole seconds,
// at least one): the grant before it is cleared, leaseTransitions counts
// one more grant, and a reboot grant starts in phase Draining with its
// cordon pending. It returns the grant written.
func Issue(l *coordinationv1.Lease, t Terms, now time.Time, d time.Duration) Grant {
	tr := ptr.Deref(l.Spec.LeaseTransitions, 0)
	pool, _, _, _ := ParseSlotName(l.Name)
	g := Grant{
		ID:   ID{Lease: l.Name, UID: l.UID, Transitions: tr + 1},
		Pool: pool, Kind: t.Kind, Holder: t.Holder, Image: t.Image,
		BootID: t.BootID, SoftRebootCount: t.SoftRebootCount,
		Acquired: now, Renewed: now, Duration: max(d.Truncate(time.Second), time.Second),
		Namespace: l.Namespace,
	}
	switch t.Kind {
	case KindStage:
		g.StageTimeout = max(t.StageTimeout, 0)
	case KindReboot:
		// The cordon call's answer is recorded right after it; until
		// then a Node cordoned with this grant's mark is ours (the call
		// writes the mark in the cordon's own update), amendment 23.
		g.Phase, g.Cordon = PhaseDraining, CordonPending
		if t.Cordon != "" {
			g.Cordon = t.Cordon
		}
		g.Rollback = t.Rollback
	}
	Clear(l)
	put(l, g)
	return g
}

// put writes g on l: spec, holder label and annotations. Fields at their
// zero value write nothing, but for the soft-reboot count, always written.
func put(l *coordinationv1.Lease, g Grant) {
	setMaps(l)
	l.Spec.HolderIdentity = ptr.To(g.Holder)
	l.Spec.AcquireTime = &metav1.MicroTime{Time: g.Acquired}
	l.Spec.RenewTime = &metav1.MicroTime{Time: g.Renewed}
	l.Spec.LeaseDurationSeconds = ptr.To(int32(g.Duration / time.Second))
	l.Spec.LeaseTransitions = ptr.To(g.Transitions)
	l.Labels[LabelHolder] = g.Holder
	a := l.Annotations
	a[AnnotationImage] = g.Image.String()
	a[AnnotationBootID] = g.BootID
	a[AnnotationSoftRebootCount] = FormatSoftRebootCount(g.SoftRebootCount)
	for k, v := range map[string]string{AnnotationPhase: string(g.Phase), AnnotationFailure: g.Failure, AnnotationCordonedByUs: string(g.Cordon)} {
		if v != "" {
			a[k] = v
		}
	}
	if g.Kind == KindReboot && g.Rollback {
		a[AnnotationPurpose] = PurposeRollback
	}
	if g.Kind == KindStage && g.StageTimeout > 0 && g.StageTimeoutProblem == "" {
		a[AnnotationStageTimeout] = FormatStageTimeout(g.StageTimeout)
	}
	if !g.BackSince.IsZero() {
		a[AnnotationBackSince] = formatTime(g.BackSince)
	}
	if g.CameBack {
		// Read for its presence only; MarkBack writes when it was.
		a[AnnotationCameBack] = formatTime(g.Renewed)
		if !g.BackSince.IsZero() {
			a[AnnotationCameBack] = a[AnnotationBackSince]
		}
	}
}

func setMaps(l *coordinationv1.Lease) {
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
}

// formatTime is how the coordinator's time annotations are written:
// RFC 3339 in UTC with nanoseconds (what parseTime reads back exactly).
func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// parseTime reads a time annotation; anything unreadable is zero. Most
// are absent: time.Parse would allocate an error for each, on every pass.
func parseTime(s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

// Advance moves reboot grant l from Draining to Reboot at now, recording
// whether its cordon call made the cordon (the call's own answer, never a
// cached guess nor the Node's mark). renewTime starts the reboot timer, on
// the coordinator's clock; agents write no Lease, so nothing extends it.
func Advance(l *coordinationv1.Lease, cordonedByUs bool, now time.Time) {
	setMaps(l)
	l.Annotations[AnnotationPhase] = string(PhaseReboot)
	l.Annotations[AnnotationCordonedByUs] = string(CordonOf(cordonedByUs))
	l.Spec.RenewTime = &metav1.MicroTime{Time: now}
}

// RecordCordon records on reboot grant l (as read or just written) what its
// cordon call found: ours when that call made the cordon, not ours when the
// Node was cordoned already. The controller writes l back with one Update
// right after the call (amendments 21 and 23).
func RecordCordon(l *coordinationv1.Lease, ours bool) {
	setMaps(l)
	l.Annotations[AnnotationCordonedByUs] = string(CordonOf(ours))
}

// MarkFailed marks grant l failed for reason (a CamelCase reason such as
// RebootTimeout); the slot stays held.
func MarkFailed(l *coordinationv1.Lease, reason string) {
	setMaps(l)
	l.Annotations[AnnotationFailure] = reason
}

// MarkBack records when the holder of reboot grant l was first found back
// on the image, Ready, in its new boot (zero clears it: not back any more),
// and, the first time, that it came back under this grant (amendment 21).
func MarkBack(l *coordinationv1.Lease, since time.Time) {
	setMaps(l)
	if since.IsZero() {
		delete(l.Annotations, AnnotationBackSince)
		return
	}
	l.Annotations[AnnotationBackSince] = formatTime(since)
	if _, ok := l.Annotations[AnnotationCameBack]; !ok {
		l.Annotations[AnnotationCameBack] = formatTime(since)
	}
}

// grantAnnotations are every annotation a grant (or its release) writes.
var grantAnnotations = []string{AnnotationImage, AnnotationBootID, AnnotationSoftRebootCount, AnnotationPhase,
	AnnotationFailure, AnnotationCordonedByUs, AnnotationBackSince, AnnotationCameBack, AnnotationReleasedAt,
	AnnotationStageTimeout, AnnotationPurpose}

// GrantAnnotations are the annotations a grant, or the release of one,
// writes on a slot Lease; Clear removes them all.
func GrantAnnotations() []string { return append([]string(nil), grantAnnotations...) }

// Clear frees slot l: no holder, no grant annotations. leaseTransitions
// stays, so the next grant is a new one.
func Clear(l *coordinationv1.Lease) {
	l.Spec.HolderIdentity = nil
	l.Spec.AcquireTime, l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = nil, nil, nil
	delete(l.Labels, LabelHolder)
	for _, a := range grantAnnotations {
		delete(l.Annotations, a)
	}
}

// Release frees reboot slot l whose node was verified back, at now: the
// release time starts pauseBetweenBatches (AnnotationReleasedAt).
func Release(l *coordinationv1.Lease, now time.Time) {
	Clear(l)
	setMaps(l)
	l.Annotations[AnnotationReleasedAt] = formatTime(now)
}

// Reset rewrites malformed slot l as free: no grant, the labels its name
// says, leaseTransitions not negative.
func Reset(l *coordinationv1.Lease) {
	setMaps(l)
	Clear(l)
	if pool, kind, _, err := ParseSlotName(l.Name); err == nil {
		l.Labels[LabelPool], l.Labels[LabelSlot] = pool, string(kind)
	}
	if l.Spec.LeaseTransitions != nil && *l.Spec.LeaseTransitions < 0 {
		l.Spec.LeaseTransitions = ptr.To(int32(0))
	}
}

// ParseFree reads a free slot (Parse returned ErrFree): when it was last
// released with its node verified back (zero: never, or unreadable, which
// only loses the pause it would start). A free slot with leftover grant
// labels or annotations is damaged: an error, and the coordinator resets
// it, so nothing stale is read from it later.
func ParseFree(l *coordinationv1.Lease) (releasedAt time.Time, err error) {
	_, softCount := l.Annotations[AnnotationSoftRebootCount]
	if l.Labels[LabelHolder] != "" || l.Annotations[AnnotationImage] != "" || l.Annotations[AnnotationPhase] != "" || l.Annotations[AnnotationPurpose] != "" || softCount {
		return time.Time{}, errors.New("free slot with leftover grant labels or annotations")
	}
	return parseTime(l.Annotations[AnnotationReleasedAt]), nil
}

// Holder is l's spec.holderIdentity ("" when unset), valid or not.
func Holder(l *coordinationv1.Lease) string { return ptr.Deref(l.Spec.HolderIdentity, "") }

// Parse reads a slot Lease. A free slot returns ErrFree; anything that does
// not follow the protocol returns an error wrapping ErrMalformed and must be
// treated as no grant at all.
func Parse(l *coordinationv1.Lease) (Grant, error) {
	if l == nil {
		return Grant{}, fmt.Errorf("%w: nil lease", ErrMalformed)
	}
	pool, kind, _, err := ParseSlotName(l.Name)
	if err != nil {
		return Grant{}, err
	}
	bad := func(format string, a ...any) (Grant, error) {
		return Grant{}, fmt.Errorf("%w: lease %s/%s: %s", ErrMalformed, l.Namespace, l.Name, fmt.Sprintf(format, a...))
	}
	if got := l.Labels[LabelPool]; got != pool {
		return bad("label %s=%q does not match the name's pool %q", LabelPool, got, pool)
	}
	if got := l.Labels[LabelSlot]; got != string(kind) {
		return bad("label %s=%q does not match the name's kind %q", LabelSlot, got, kind)
	}
	g := Grant{ID: ID{Lease: l.Name, UID: l.UID}, Pool: pool, Kind: kind, Holder: Holder(l), Namespace: l.Namespace}
	if g.Holder == "" {
		return g, ErrFree
	}
	if problem := parseHeld(l, &g); problem != "" {
		return bad("%s", problem)
	}
	parseRecords(l, &g)
	return g, nil
}

// parseHeld reads what a held grant allows into g: "" when all of it
// follows the protocol, else what does not.
func parseHeld(l *coordinationv1.Lease, g *Grant) string {
	if errs := validation.IsDNS1123Subdomain(g.Holder); len(errs) > 0 {
		return fmt.Sprintf("holder %q is not a node name: %s", g.Holder, strings.Join(errs, "; "))
	}
	if got := l.Labels[LabelHolder]; got != g.Holder {
		return fmt.Sprintf("label %s=%q does not match holder %q", LabelHolder, got, g.Holder)
	}
	var err error
	if g.Image, err = imageref.ParsePinned(l.Annotations[AnnotationImage]); err != nil {
		return fmt.Sprintf("annotation %s: %v", AnnotationImage, err)
	}
	if g.BootID = l.Annotations[AnnotationBootID]; !ValidBootID(g.BootID) {
		return fmt.Sprintf("annotation %s=%q is not a boot ID", AnnotationBootID, g.BootID)
	}
	if v, ok := l.Annotations[AnnotationSoftRebootCount]; ok { // absent: 0, as grants written before the annotation
		if g.SoftRebootCount, err = ParseSoftRebootCount(v); err != nil {
			return fmt.Sprintf("annotation %s: %v", AnnotationSoftRebootCount, err)
		}
	}
	switch p := Phase(l.Annotations[AnnotationPhase]); {
	case g.Kind == KindStage && p == "":
	case g.Kind == KindReboot && (p == PhaseDraining || p == PhaseReboot):
		g.Phase = p
	default:
		return fmt.Sprintf("annotation %s=%q is not valid on a %s slot", AnnotationPhase, p, g.Kind)
	}
	switch v, ok := l.Annotations[AnnotationPurpose]; {
	case !ok:
	case g.Kind == KindReboot && v == PurposeRollback:
		g.Rollback = true
	default:
		return fmt.Sprintf("annotation %s=%q is not valid on a %s slot", AnnotationPurpose, v, g.Kind)
	}
	return parseSpec(l, g)
}

// parseSpec reads the held grant's spec and failure mark into g.
func parseSpec(l *coordinationv1.Lease, g *Grant) string {
	if l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds <= 0 || *l.Spec.LeaseDurationSeconds > 24*3600 {
		return "leaseDurationSeconds must be 1..86400"
	}
	if l.Spec.RenewTime == nil || l.Spec.AcquireTime == nil {
		return "acquireTime and renewTime must be set"
	}
	if g.Transitions = ptr.Deref(l.Spec.LeaseTransitions, 0); g.Transitions < 1 {
		return "leaseTransitions must be >= 1 on a held slot"
	}
	if g.Failure = l.Annotations[AnnotationFailure]; g.Failure != "" && !reasonRE.MatchString(g.Failure) {
		return fmt.Sprintf("annotation %s=%q is not a CamelCase reason", AnnotationFailure, g.Failure)
	}
	g.Acquired, g.Renewed = l.Spec.AcquireTime.Time, l.Spec.RenewTime.Time
	g.Duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	return ""
}

var reasonRE = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,63}$`)

// parseRecords reads into valid grant g what never makes it malformed: its
// stage timeout (a safety net, not part of what the grant allows) and the
// coordinator's own records.
func parseRecords(l *coordinationv1.Lease, g *Grant) {
	if g.Kind == KindStage {
		g.StageTimeout = DefaultStageTimeout
		if v, ok := l.Annotations[AnnotationStageTimeout]; !ok {
			g.StageTimeoutProblem = "annotation " + AnnotationStageTimeout + " is absent"
		} else if d, err := ParseStageTimeout(v); err != nil {
			g.StageTimeoutProblem = "annotation " + AnnotationStageTimeout + ": " + err.Error()
		} else {
			g.StageTimeout = d
		}
	}
	if g.Kind == KindReboot {
		switch v := Cordon(l.Annotations[AnnotationCordonedByUs]); v {
		case CordonOurs, CordonNotOurs, CordonPending:
			g.Cordon = v
		default:
			g.CordonProblem = fmt.Sprintf("annotation %s=%q is not true, false or %s", AnnotationCordonedByUs, v, CordonPending)
		}
	}
	g.BackSince = parseTime(l.Annotations[AnnotationBackSince])
	_, g.CameBack = l.Annotations[AnnotationCameBack]
}
