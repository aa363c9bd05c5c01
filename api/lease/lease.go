// Package lease is the slot-Lease protocol between the coordinator and the
// agents (docs/design.md): the names of its labels and annotations, the
// codec (codec.go) that reads a coordination.k8s.io/v1 Lease into a typed
// Grant and writes every change the coordinator makes to one, the one match
// of a grant an agent reports with a Lease's (claim.go), and whether a grant
// allows an action. Nothing here does I/O.
package lease

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
)

// Namespace holds every slot Lease.
const Namespace = "bootc-fleet-system"

// Labels and annotations of a slot Lease.
const (
	LabelPool   = "fleet.bootc.dev/pool"   // pool name
	LabelSlot   = "fleet.bootc.dev/slot"   // "reboot" or "stage"
	LabelHolder = "fleet.bootc.dev/holder" // node name while granted

	AnnotationImage  = "fleet.bootc.dev/image"   // repo@sha256:... the grant covers
	AnnotationBootID = "fleet.bootc.dev/boot-id" // the node's boot ID when granted
	// AnnotationSoftRebootCount is systemd's SoftRebootsCount the node's
	// agent reported in that boot when the grant was written (decimal;
	// absent means 0). A soft reboot keeps the kernel's boot ID, so the
	// boot a grant belongs to is the boot ID and this count together.
	AnnotationSoftRebootCount = "fleet.bootc.dev/soft-reboot-count"
	AnnotationPhase           = "fleet.bootc.dev/phase" // reboot slots: Draining, then Reboot
	// AnnotationPurpose (reboot slots): "Rollback" on a rollback grant,
	// whose image is the node's rollback deployment, to boot back into
	// with `bootc rollback` (amendment 25). Absent: an update.
	AnnotationPurpose = "fleet.bootc.dev/purpose"
	// PurposeRollback is AnnotationPurpose's value on a rollback grant.
	PurposeRollback = "Rollback"
	// AnnotationFailure is set by the coordinator on a reboot slot whose node
	// did not come back in time (value: a reason such as RebootTimeout).
	AnnotationFailure = "fleet.bootc.dev/failure"
	// AnnotationCordonedByUs records that the coordinator cordoned the node
	// for this grant ("true") or found it already cordoned ("false"), as its
	// cordon call found the Node (not as a cache showed it); "pending" from
	// the grant until that call's answer is recorded (amendment 23).
	AnnotationCordonedByUs = "fleet.bootc.dev/cordoned-by-us"
	// AnnotationBackSince (RFC 3339, held reboot slots, coordinator only):
	// when the holder was first found back on the image, Ready, in its new
	// boot; the slot is released minReadySeconds later if it stays so.
	AnnotationBackSince = "fleet.bootc.dev/back-since"
	// AnnotationCameBack (RFC 3339, held reboot slots in phase Reboot,
	// coordinator only): when the holder was first found back on the image
	// under this grant. Never cleared while the grant stands: a node that
	// came back is done with rebootTimeout, and a later NotReady blip only
	// restarts the minReadySeconds clock (amendment 21).
	AnnotationCameBack = "fleet.bootc.dev/came-back"
	// AnnotationReleasedAt (RFC 3339, free reboot slots, coordinator only):
	// when the slot was last released with its node verified back; the
	// start of pauseBetweenBatches.
	AnnotationReleasedAt = "fleet.bootc.dev/released-at"
	// AnnotationStageTimeout (stage grants, coordinator only): the pool's
	// spec.rollout.stageTimeout as a Go duration string; the agent cancels
	// a stage under the grant that runs longer (amendment 19). Absent or
	// invalid: DefaultStageTimeout, and the agent says so in its log.
	AnnotationStageTimeout = "fleet.bootc.dev/stage-timeout"

	// NodeAnnotationCordonedFor is written on the Node in the same update
	// that cordons it, naming the grant (CordonMark) it was cordoned for. A
	// coordinator that stopped between cordoning and recording
	// cordoned-by-us on the grant finds its own cordon there.
	NodeAnnotationCordonedFor = "fleet.bootc.dev/cordoned-for"
)

// MaxStageAttempts is how many failed stages an agent makes under one stage
// grant before it lets go of the grant (GrantInUse.Released = StageFailed),
// so the coordinator hands the slot to the next node.
const MaxStageAttempts = 3

// Stage timeouts (spec.rollout.stageTimeout, AnnotationStageTimeout): the
// default and the bounds the CRD schema enforces.
const (
	DefaultStageTimeout = time.Hour
	MinStageTimeout     = time.Minute
	MaxStageTimeout     = 24 * time.Hour
)

// ParseStageTimeout reads an AnnotationStageTimeout value: a Go duration
// from MinStageTimeout to MaxStageTimeout. Anything else is an error, and
// the caller uses DefaultStageTimeout.
func ParseStageTimeout(s string) (time.Duration, error) {
	if len(s) > 32 {
		return 0, fmt.Errorf("stage timeout %.32q… is too long", s)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("stage timeout %q is not a duration: %w", s, err)
	}
	if d < MinStageTimeout || d > MaxStageTimeout {
		return 0, fmt.Errorf("stage timeout %q is not from %s to %s", s, MinStageTimeout, MaxStageTimeout)
	}
	return d, nil
}

// FormatStageTimeout is the AnnotationStageTimeout value of d.
func FormatStageTimeout(d time.Duration) string { return d.String() }

// HeartbeatsPerLease is how many status reports an agent sends per lease
// duration while it holds a grant; the coordinator expires a stage grant
// once it has seen none for a whole lease duration.
const HeartbeatsPerLease = 4

// ValidFraction is the part of the lease duration after the agent's last
// accepted heartbeat during which the agent still uses a grant. The rest is
// margin: the coordinator's expiry runs from when it saw that heartbeat,
// which is later, so the agent has stopped before the slot can be re-granted.
func ValidFraction(d time.Duration) time.Duration { return d * 2 / 3 }

// CordonMark is the NodeAnnotationCordonedFor value for a grant.
func CordonMark(id ID) string { return fmt.Sprintf("%s#%d/%s", id.Lease, id.Transitions, id.UID) }

// Kind is the kind of slot.
type Kind string

// The kinds of slot: a reboot slot counts against maxUnavailable, a stage
// slot against maxStaging.
const (
	KindReboot Kind = "reboot"
	KindStage  Kind = "stage"
)

// Phase is the phase of a reboot grant.
type Phase string

const (
	// PhaseDraining means the coordinator is cordoning and draining; no reboot yet.
	PhaseDraining Phase = "Draining"
	// PhaseReboot means the node is drained; the agent may reboot once.
	PhaseReboot Phase = "Reboot"
)

// Errors a grant check can return; every one means "do not act".
var (
	ErrFree         = errors.New("slot is free")
	ErrMalformed    = errors.New("malformed grant")
	ErrNotHolder    = errors.New("granted to another node")
	ErrWrongKind    = errors.New("wrong slot kind for this action")
	ErrWrongImage   = errors.New("granted for another image")
	ErrWrongBoot    = errors.New("granted in another boot")
	ErrNotReboot    = errors.New("reboot grant not yet in phase Reboot")
	ErrExpired      = errors.New("no heartbeat accepted recently enough to use the grant")
	ErrFailedMarked = errors.New("grant marked failed by the coordinator")
)

// SlotName is the name of slot i of the given kind of a pool: P-reboot-<i> or P-stage-<i>.
func SlotName(pool string, kind Kind, i int) string {
	return pool + "-" + string(kind) + "-" + strconv.Itoa(i)
}

// ParseSlotName splits a slot Lease name made by SlotName.
func ParseSlotName(name string) (pool string, kind Kind, index int, err error) {
	for _, k := range []Kind{KindReboot, KindStage} {
		sep := "-" + string(k) + "-"
		at := strings.LastIndex(name, sep)
		if at <= 0 {
			continue
		}
		digits := name[at+len(sep):]
		if !isIndex(digits) {
			continue
		}
		i, _ := strconv.Atoi(digits)
		return name[:at], k, i, nil
	}
	return "", "", 0, fmt.Errorf("%w: lease name %q is not <pool>-reboot-<i> or <pool>-stage-<i>", ErrMalformed, name)
}

func isIndex(s string) bool {
	if s == "" || len(s) > 4 || (len(s) > 1 && s[0] == '0') {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// ID identifies one grant: a lease can be granted many times, and a grant is
// spent by at most one reboot.
type ID struct {
	Lease       string    `json:"lease"`
	UID         types.UID `json:"uid"`
	Transitions int32     `json:"leaseTransitions"`
}

func (id ID) String() string { return fmt.Sprintf("%s#%d", id.Lease, id.Transitions) }

// Grant is a held slot Lease, validated.
type Grant struct {
	ID
	Pool   string
	Kind   Kind
	Holder string
	Image  imageref.Pinned
	BootID string
	// SoftRebootCount is the soft-reboot count of the boot the grant was
	// issued in (AnnotationSoftRebootCount).
	SoftRebootCount uint32
	Phase           Phase // reboot slots only
	// Rollback (reboot slots): a rollback grant (AnnotationPurpose); its
	// Image is the rollback deployment the node boots back into.
	Rollback bool
	Failure  string // set by the coordinator when the node did not come back
	// StageTimeout (stage grants) bounds one stage under the grant: the
	// valid AnnotationStageTimeout, or DefaultStageTimeout when it is
	// absent or invalid (StageTimeoutProblem then says which). An invalid
	// value never makes the grant malformed: the bound is a safety net,
	// not part of what the grant allows.
	StageTimeout        time.Duration
	StageTimeoutProblem string
	Acquired            time.Time
	Renewed             time.Time
	Duration            time.Duration
	Namespace           string

	// The coordinator's own records on the grant; agents ignore them.

	// Cordon (reboot grants) is AnnotationCordonedByUs when it is one of
	// the Cordon values; otherwise CordonProblem says what it is, and the
	// coordinator treats the slot as malformed. Like StageTimeout, it never
	// makes the grant malformed for an agent.
	Cordon        Cordon
	CordonProblem string
	// BackSince is AnnotationBackSince (zero: absent or unreadable; the
	// minReadySeconds clock then starts again, later, never earlier).
	BackSince time.Time
	// CameBack: AnnotationCameBack is present (any value).
	CameBack bool
}

// ValidBootID reports whether s looks like /proc/sys/kernel/random/boot_id:
// a UUID in lowercase hex, 8-4-4-4-12. A loop, not a regexp: the planner
// checks every node's boot ID several times a pass, and at 1,000 nodes the
// regexp was 40% of a pass's CPU.
func ValidBootID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

// ParseSoftRebootCount reads an AnnotationSoftRebootCount value: a decimal
// uint32 with no sign, no leading zeros and no spaces, so every count has
// exactly one spelling. (An absent annotation means 0; an empty one is an
// error.)
func ParseSoftRebootCount(s string) (uint32, error) {
	if s == "" || len(s) > 10 || (len(s) > 1 && s[0] == '0') || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a soft-reboot count (decimal, 0..4294967295, no leading zeros)", s)
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is not a soft-reboot count (decimal, 0..4294967295, no leading zeros)", s)
	}
	return uint32(n), nil
}

// FormatSoftRebootCount is the AnnotationSoftRebootCount value of n.
func FormatSoftRebootCount(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// Action is what the agent wants to do under a grant.
type Action string

// The actions a grant can allow: staging under a stage grant, applying and
// rebooting under a reboot grant, rolling back and rebooting under a
// rollback grant (a reboot slot whose purpose is Rollback).
const (
	ActionStage    Action = "stage"
	ActionReboot   Action = "reboot"
	ActionRollback Action = "rollback"
)

// Check is the agent's side of a validity question.
type Check struct {
	Node   string
	Action Action
	Image  string // repo@sha256 the agent is about to stage or apply
	BootID string // the current boot ID
	// SoftRebootCount is systemd's SoftRebootsCount now: with BootID it
	// names the current boot (a soft reboot keeps the boot ID).
	SoftRebootCount uint32
	Now             time.Time
	// LastHeartbeat is when the agent sent its last status report that
	// listed this grant and that the API server accepted (its own clock).
	LastHeartbeat time.Time
}

// Allows returns nil when the grant allows the action, or an error saying why
// not (DESIGN.md, "Valid for the agent").
func (g Grant) Allows(c Check) error {
	switch {
	case g.Holder != c.Node:
		return fmt.Errorf("%w: %s holds %s, not %s", ErrNotHolder, g.Holder, g.Lease, c.Node)
	case !g.allowsAction(c.Action):
		return fmt.Errorf("%w: %s for %s", ErrWrongKind, g.describeKind(), c.Action)
	case g.Image.String() != c.Image:
		return fmt.Errorf("%w: %s, not %s", ErrWrongImage, g.Image, c.Image)
	case g.BootID != c.BootID || g.SoftRebootCount != c.SoftRebootCount:
		return fmt.Errorf("%w: boot %s (soft reboots %d), now %s (soft reboots %d)", ErrWrongBoot,
			g.BootID, g.SoftRebootCount, c.BootID, c.SoftRebootCount)
	case g.Failure != "":
		return fmt.Errorf("%w: %s", ErrFailedMarked, g.Failure)
	case c.Action != ActionStage && g.Phase != PhaseReboot:
		return fmt.Errorf("%w (phase %q)", ErrNotReboot, g.Phase)
	case NeedsHeartbeat(c.Action) &&
		(c.LastHeartbeat.IsZero() || c.Now.Sub(c.LastHeartbeat) >= ValidFraction(g.Duration) || c.Now.Before(c.LastHeartbeat.Add(-time.Minute))):
		return fmt.Errorf("%w (last heartbeat %s, valid for %s of the %s lease)", ErrExpired,
			c.LastHeartbeat.UTC().Format(time.RFC3339), ValidFraction(g.Duration), g.Duration)
	}
	return nil
}

// NeedsHeartbeat reports whether a grant allows a only while the agent's
// accepted reports that list it keep it alive (amendment 8): staging and
// rolling back. An update's reboot in phase Reboot needs none (amendment
// 37): the coordinator never expires a reboot grant by heartbeats, so a
// report listing it would tell nobody anything. A revoke in phase Reboot
// (the node rebooted outside it or left the pool, or amendment 21's proof of
// disuse) is caught by the consistent read before each step, as before.
func NeedsHeartbeat(a Action) bool { return a != ActionReboot }

// allowsAction: a stage slot allows staging, an update grant applying and
// rebooting, a rollback grant rolling back and rebooting; nothing else.
func (g Grant) allowsAction(a Action) bool {
	switch a {
	case ActionStage:
		return g.Kind == KindStage
	case ActionReboot:
		return g.Kind == KindReboot && !g.Rollback
	case ActionRollback:
		return g.Kind == KindReboot && g.Rollback
	}
	return false
}

func (g Grant) describeKind() string {
	if g.Rollback {
		return "rollback grant"
	}
	return string(g.Kind) + " slot"
}
