// Package plan is the coordinator's decision: one pure function from what it
// observed about a pool (spec, nodes, BootcNodes, slot Leases, drains, now) to
// the changes to make. Nothing here does I/O; the controller reads, calls Plan
// and writes (docs/coordinator.md).
package plan

import (
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/health"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/platform"
)

// Input is one observation of a pool.
type Input struct {
	// Pool is the pool as read (spec, status, generation).
	Pool *fleetv1.BootcNodePool
	// Target is the resolved image, or the last one resolved when
	// ResolveError is set (existing grants still finish against it).
	Target imageref.Pinned
	// ResolveError is why spec.image could not be resolved; no new grants.
	ResolveError string
	// Index holds the per-platform images when Target is a multi-arch index
	// (nil: a single manifest). Each node's target is then the image of its
	// platform (Node.OS, Node.Arch) in it; Target stays the pool's
	// status.targetImage (docs/design.md, amendment 12).
	Index *platform.Index
	// IndexUnknown: Target was taken from the pool's status and could not be
	// resolved again, so whether it is an index is not known (a restarted
	// coordinator whose registry does not answer). Each node keeps the
	// desiredImage it has; ResolveError is set, so nothing new is granted.
	IndexUnknown bool
	// Uninspected, when set, is why the registry could not be asked whether
	// Target, a digest spec.image names, is an index: it is used as written
	// for every node.
	Uninspected string
	// ResolvedAt is when Target was last resolved (zero: keep the status's).
	ResolvedAt time.Time
	// Nodes are every Node the pool cares about: those its selector matches
	// (InPool) and those a slot or BootcNode of the pool still refers to. A
	// node absent from this list does not exist.
	Nodes []Node
	// BootcNodes named after Nodes, or whose spec.pool is this pool.
	BootcNodes []fleetv1.BootcNode
	// Slots are the pool's slot Leases.
	Slots []Slot
	// Drains is the drain tracker's view, by node.
	Drains map[string]Drain
	// Now is the time of the observation.
	Now time.Time
	// LeaseDuration is written on every grant. A stage grant expires when
	// the coordinator has seen no heartbeat of its holder for this long.
	LeaseDuration time.Duration
	// Heartbeats are, by node, when the coordinator saw its agent's
	// reports change (its own clock: a node's clock never sets a timer).
	Heartbeats map[string]Heartbeat
	// QuietAfter is how long a node with rollout work may go without a new
	// report before the pool names it (0: never).
	QuietAfter time.Duration
	// GrantsSeen are, by grant, when this coordinator first saw each held
	// grant, on its own clock (a grant it wrote itself: when its cache
	// first showed it). Absent: seen now. A stage grant is revoked
	// stageTimeout plus LeaseDuration after it (amendment 19); a restarted
	// coordinator starts from "seen now", so it may wait longer, never
	// shorter, whatever clock wrote the Lease's acquireTime.
	GrantsSeen map[lease.ID]time.Time
	// UngrantedStagingSince are, by node, when this coordinator first saw
	// the node staging without a stage grant (Output.StagingWithoutGrant of
	// its earlier passes, its own clock). Absent: first seen now. Its share
	// of maxStaging lapses stageTimeout plus LeaseDuration after it
	// (amendment 20).
	UngrantedStagingSince map[string]time.Time
	// Health: by node, the gate's verdict for nodes whose pool has spec.health and that
	// hold a reboot slot after its drain (phases Rebooting/Verifying). Absent: not
	// evaluated yet (not passed).
	Health map[string]health.Verdict
	// MetricsBlocked: by node, series the pool's metrics query returned for it (a
	// message); such a node gets no new reboot grant.
	MetricsBlocked map[string]string
	// MetricsError: the pool's metrics query failed (message): no new reboot grant in
	// the pool.
	MetricsError string
}

// Heartbeat is what the coordinator saw of one node's reports.
type Heartbeat struct {
	// Seen is when the coordinator first saw the current value of the
	// BootcNode's status.lastReportTime: the agent's last heartbeat, timed
	// by the coordinator's clock. Zero: never seen.
	Seen time.Time
	// SpecSeen is when the coordinator first saw the BootcNode's current
	// spec.desiredImage: a quiet agent is judged from the later of the two.
	SpecSeen time.Time
	// SlotsSeen is when the coordinator first saw the BootcNode's current
	// fleetv1.AnnotationSlots: its agent can list a grant only once it
	// names the slot (amendment 39).
	SlotsSeen time.Time
}

// Node is what the planner needs of a Node.
type Node struct {
	Name string
	// InPool: the pool's selector matches the node.
	InPool bool
	// OtherPools lists other pools whose selectors match it too (a conflict).
	OtherPools []string
	Ready      bool
	// Unschedulable is spec.unschedulable (cordoned).
	Unschedulable bool
	// BootID is status.nodeInfo.bootID, written by the kubelet.
	BootID string
	// OS and Arch are status.nodeInfo.operatingSystem and .architecture,
	// written by the kubelet: they pick the node's image from an index.
	OS, Arch string
	// CordonedFor is the Node's lease.NodeAnnotationCordonedFor: the grant
	// (lease.CordonMark) the coordinator cordoned it for, if any.
	CordonedFor string
	// Held: the Node carries fleetv1.AnnotationHold; HoldReason is its value.
	Held       bool
	HoldReason string
	// Zone is the Node's fleetv1.LabelZone label; Canary: it carries
	// fleetv1.LabelCanary (any value). The rollout's waves (amendment 26).
	Zone   string
	Canary bool
}

// SlotState is what a slot Lease reads as.
type SlotState int

const (
	// SlotFree means nobody holds the slot.
	SlotFree SlotState = iota
	// SlotHeld means the slot holds a valid grant.
	SlotHeld
	// SlotMalformed means the slot is held or damaged in a way that is not
	// a valid grant.
	SlotMalformed
)

// Slot is one slot Lease, parsed.
type Slot struct {
	Name  string
	Kind  lease.Kind
	Index int
	State SlotState
	// Phase is where the slot is in its lifecycle (PhaseOf): the planner
	// and the plugin derive it once as they take the slots in (WithPhases).
	Phase SlotPhase
	// Grant is valid when State is SlotHeld.
	Grant lease.Grant
	// Finished (a held stage slot): its holder is done with the grant
	// (StageFinished), as its Node and report say, not its Lease: the
	// planner and the plugin find it from the holder (WithFinished).
	Finished bool
	// CordonedByUs is the cordoned-by-us annotation of a reboot grant.
	CordonedByUs bool
	// CordonPending: the annotation says "pending", the grant's cordon call
	// has not been answered on the grant yet (amendment 23).
	CordonPending bool
	// Holder is spec.holderIdentity, also for a malformed slot.
	Holder string
	// Problem says why a slot is malformed.
	Problem string
	// BackSince (held reboot slots): when the coordinator first found the
	// holder back on the image, Ready, for minReadySeconds (annotation
	// lease.AnnotationBackSince). Zero: not back, or not tracked.
	BackSince time.Time
	// RebootSince (held reboot slots in phase Reboot): when this
	// coordinator process first saw the grant in phase Reboot, on its own
	// clock; the reboot timeout runs from it. Zero: the grant's renewTime
	// (set by whichever coordinator advanced it). The controller also puts
	// its own first sight of the BackSince and ReleasedAt records in those
	// fields, so a previous leader's clock never shortens a timer
	// (amendment 21).
	RebootSince time.Time
	// CameBack (held reboot slots): the holder was found back on the image
	// under this grant at least once (annotation lease.AnnotationCameBack);
	// rebootTimeout no longer applies to it (amendment 21).
	CameBack bool
	// ReleasedAt (free reboot slots): when the slot was last released with
	// its node verified back (annotation lease.AnnotationReleasedAt), for
	// pauseBetweenBatches.
	ReleasedAt time.Time
}

// DrainState is where a node's drain is.
type DrainState string

// The states of a drain attempt: running, done, or failed (it did not
// finish in time or errored; it is retried).
const (
	DrainRunning DrainState = "Running"
	DrainDone    DrainState = "Done"
	DrainFailed  DrainState = "Failed"
)

// Drain is the tracker's record of a node's drain for one grant.
type Drain struct {
	Grant lease.ID
	State DrainState
	// Message of the last failed attempt: names the blocking pods or PDBs.
	Message  string
	Attempts int
}

// Op is a change to one slot Lease.
type Op string

const (
	// OpGrant gives a free slot to a node (one optimistic-concurrency update).
	OpGrant Op = "Grant"
	// OpAdvance moves a reboot grant from Draining to Reboot.
	OpAdvance Op = "Advance"
	// OpCordon cordons the node of a Draining grant (marking the Node with
	// the grant in the same update) and starts its drain; it writes no
	// Lease. What the cordon call found is recorded on the grant by
	// OpAdvance (the Node's mark holds it meanwhile, amendment 16).
	OpCordon Op = "Cordon"
	// OpMarkFailed writes the failure annotation; the slot stays held.
	OpMarkFailed Op = "MarkFailed"
	// OpRelease frees a slot whose work is done (verified for reboot slots).
	OpRelease Op = "Release"
	// OpRevoke frees a slot whose work is no longer wanted.
	OpRevoke Op = "Revoke"
	// OpReset rewrites a malformed slot as free.
	OpReset Op = "Reset"
	// OpMarkBack records (BackSince set) or clears (zero) when the holder of
	// a reboot slot in phase Reboot was first found back (minReadySeconds).
	OpMarkBack Op = "MarkBack"
	// OpReport is no change the planner makes: it names, in Transitions
	// and the diagram, a phase change its holder's report (or its Node's
	// boot) makes on a stage slot, Staging <-> Finished (amendment 31).
	OpReport Op = "Report"
)

// SlotChange is one update of one slot Lease, applied to the Lease as read.
type SlotChange struct {
	Slot string
	Kind lease.Kind
	Op   Op
	// Node is the holder (granted to, or released from).
	Node string
	// Grant fields: the boot is BootID (the kubelet's) and the soft-reboot
	// count the agent reported in it.
	Image           imageref.Pinned
	BootID          string
	SoftRebootCount uint32
	// CordonedByUs is what OpAdvance records: the grant's own record (the
	// cordon call's result, never a cached guess nor the Node's mark).
	CordonedByUs bool
	// DrainTimeout: a reboot grant (or OpCordon) drains its node once the
	// cordon is made, for at most this long.
	DrainTimeout time.Duration
	// Failure is the reason OpMarkFailed writes.
	Failure string
	// Uncordon: before the slot is cleared, uncordon Node (we cordoned it).
	Uncordon bool
	// BackSince is what OpMarkBack records (zero clears it).
	BackSince time.Time
	// StageTimeout is what a stage grant carries for its agent
	// (lease.AnnotationStageTimeout, amendment 19).
	StageTimeout time.Duration
	// Rollback and Cordon (OpGrant of a reboot slot): a rollback grant
	// (lease.Terms.Rollback) and the cordon record it starts from
	// (lease.Terms.Cordon: the failed update grant's, amendment 25).
	Rollback bool
	Cordon   lease.Cordon
	// Why is a short CamelCase cause, for logs and events.
	Why string
}

// SlotRef names a slot Lease to create.
type SlotRef struct {
	Name  string
	Kind  lease.Kind
	Index int
}

// DrainStart asks the controller to drain a (cordoned) node for a grant.
type DrainStart struct {
	Node    string
	Grant   lease.ID
	Timeout time.Duration
}

// BootcNodeChange creates a BootcNode or sets its spec.
type BootcNodeChange struct {
	Name string
	Spec fleetv1.BootcNodeSpec
	// NoPlatformImage is the annotation fleetv1.AnnotationNoPlatformImage
	// to write; empty removes it.
	NoPlatformImage string
	// RolloutState and RolloutReason are the coordinator's view of the node
	// (fleetv1.AnnotationRolloutState, AnnotationRolloutReason).
	RolloutState, RolloutReason string
	// Slots names the slot Leases whose live grants the node holds once
	// the pass's writes are done (fleetv1.AnnotationSlots), sorted; its
	// agent watches those Leases by name (amendment 39).
	Slots []string
}

// Event is a Kubernetes Event to record on the pool, or on a BootcNode.
type Event struct {
	Type    string // Normal or Warning
	Reason  string
	Message string
	// BootcNode, when set, is the BootcNode the Event is about (the pool is
	// its related object).
	BootcNode string
	// Node, when set, is the Node a pool Event is about; it is recorded on
	// the Node as well (related object: the pool).
	Node string
}

// Output is every change Plan decided, in the order to make them.
type Output struct {
	CreateSlots []SlotRef
	// DeleteSlots are free surplus slots.
	DeleteSlots []string
	// Changes are slot updates: releases and revokes first, then grants.
	Changes     []SlotChange
	StartDrains []DrainStart
	StopDrains  []string

	// CreateBootcNodes and UpdateBootcNodes are in the queue order, the
	// order to write them in (membership, amendment 30).
	CreateBootcNodes []BootcNodeChange
	UpdateBootcNodes []BootcNodeChange
	DeleteBootcNodes []string

	Status fleetv1.BootcNodePoolStatus
	Events []Event
	// RequeueAfter is when the next deadline (lease expiry, reboot timeout)
	// falls; zero when none.
	RequeueAfter time.Duration
	// StagingWithoutGrant names, sorted, the nodes reporting Staging in
	// their current boot without a stage grant, counted against maxStaging
	// or lapsed (amendment 20): the caller remembers since when
	// (Input.UngrantedStagingSince) for its next passes.
	StagingWithoutGrant []string
	// FinishedSlots are the grants of the stage slots whose holders were
	// done with them as the pass found them (PhaseFinished; InputSlots
	// finds the same): for the caller's metrics, which count them as no
	// longer held, without deriving every slot's phase again. A slot
	// written in the pass carries another grant. Nil when none.
	FinishedSlots map[lease.ID]bool
}

// Why values of slot changes.
const (
	WhyStaged           = "Staged"
	WhyVerified         = "Verified"
	WhyExpired          = "Expired"
	WhyImageChanged     = "ImageChanged"
	WhyNodeDeleted      = "NodeDeleted"
	WhyLeftPool         = "LeftPool"
	WhyBootChanged      = "BootChanged"
	WhyDrained          = "Drained"
	WhyMalformed        = "Malformed"
	WhyReleasedByAgent  = "ReleasedByAgent"
	WhyStagedUnverified = "StagedUnverified"
	WhyBackOnImage      = "BackOnImage"
	WhyNotBackAnyMore   = "NotBackAnyMore"
	WhyCordon           = "Cordon"
	WhyEligible         = "Eligible"
	// WhySurplus: a finished stage slot beyond a shrunk maxStaging is
	// released, so the free slot can be deleted (amendment 31).
	WhySurplus = "Surplus"
	// WhyBooted, WhyRebooted, WhyStageGone (OpReport): a stage grant's
	// holder reports its image booted, or is in another boot than the
	// grant's (Finished); its locked stage of the image is gone in the
	// grant's boot (Staging again). WhyStaged: it reports it staged.
	WhyBooted        = "Booted"
	WhyRebooted      = "Rebooted"
	WhyStageGone     = "StageGone"
	WhyRebootTimeout = fleetv1.ReasonRebootTimeout
	// WhyStageTimedOut: a stage grant held longer than stageTimeout plus a
	// lease duration (amendment 19).
	WhyStageTimedOut = fleetv1.ReasonStageTimedOut
	// WhyHealthCheckFailed: a node did not pass its health gate within
	// health.timeout (amendment 24); the failure written is the check's
	// reason.
	WhyHealthCheckFailed = fleetv1.EventHealthCheckFailed
	// WhyRollback: a failed update grant's slot re-issued to its node as a
	// rollback grant (amendment 25).
	WhyRollback = "Rollback"
	// WhyRolledBack: a rollback grant's node is back on its previous image.
	WhyRolledBack = fleetv1.EventRolledBack
	// WhyRolledBackByHost: an update grant's node came back on another image
	// by itself (amendment 25).
	WhyRolledBackByHost = fleetv1.ReasonRolledBackByHost
	// WhyRollbackFailed: a rollback grant's node did not come back on its
	// previous image.
	WhyRollbackFailed = fleetv1.ReasonRollbackFailed
	// WhyQuarantined: a grant for a quarantined target (amendment 25).
	WhyQuarantined = "Quarantined"
)
