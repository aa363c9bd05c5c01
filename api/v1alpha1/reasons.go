package v1alpha1

// The reasons of this API: of BootcNodePool conditions (here), of BootcNode
// status and conditions (reasons_agent.go), and of the Events the
// coordinator records. Each identifier is its prefix (Reason, Event) and
// then its value: the values are API, read by people, kubectl and alerts.

// Pool condition reasons.
const (
	ReasonRollingOut      = "RollingOut"
	ReasonAllUpdated      = "AllUpdated"
	ReasonPaused          = "Paused"
	ReasonNodeConflict    = "NodeConflict"
	ReasonNodesDegraded   = "NodesDegraded"
	ReasonFailuresReached = "FailuresReached"
	ReasonNotHalted       = "NotHalted"
	// ReasonAsExpected is the reason of a condition in its healthy state,
	// on pools (Degraded) and on BootcNodes (APIAccess, GrantsReadable).
	ReasonAsExpected           = "AsExpected"
	ReasonNoNodes              = "NoNodes"
	ReasonInvalidSpec          = "InvalidSpec"
	ReasonDrainFailed          = "DrainFailed"
	ReasonAgentsReporting      = "AgentsReporting"
	ReasonAgentsQuiet          = "AgentsQuiet"
	ReasonAgentRequestsRefused = "AgentRequestsRefused"
	// ReasonStagingWithoutGrant (AgentsReporting): a node reported phase
	// Staging without a stage grant for longer than stageTimeout plus a
	// lease duration; its share of maxStaging lapsed (amendment 20).
	ReasonStagingWithoutGrant = "StagingWithoutGrant"
	// PlatformImages reasons.
	ReasonSingleManifest   = "SingleManifest"
	ReasonPlatformsMatched = "PlatformsMatched"
	ReasonPlatformMissing  = "PlatformMissing"
	ReasonNotInspected     = "NotInspected"
	// NodeSelectorRestricted reasons.
	ReasonSelfSettableLabels = "SelfSettableLabels"
	ReasonRestrictedLabels   = "RestrictedLabels"
	// MaintenanceWindow reasons.
	ReasonWindowOpen    = "WindowOpen"
	ReasonWindowClosed  = "WindowClosed"
	ReasonInvalidWindow = "InvalidWindow"
	// ObjectsReadable reason, and the reason of the Warning Event naming
	// an object the coordinator cannot decode.
	ReasonUndecodableObject = "UndecodableObject"
)

// Why a pool's spec.image could not be resolved to a digest: the pool is
// Degraded, reason ResolveFailed, and its message starts with one of these
// (as does the PlatformImages NotInspected message).
const (
	// ReasonResolveFailed: the condition's reason, and the cause of any
	// failure not named below.
	ReasonResolveFailed = "ResolveFailed"
	// ReasonInvalidImageReference: spec.image is no reference bootc-fleet
	// accepts; no request was made.
	ReasonInvalidImageReference = "InvalidImageReference"
	// ReasonImageNotFound: the registry has no such repository or tag.
	ReasonImageNotFound = "ImageNotFound"
	// ReasonRegistryTLSFailure: the TLS connection failed, or the registry
	// speaks plain HTTP and is not listed as insecure.
	ReasonRegistryTLSFailure = "RegistryTLSFailure"
	// ReasonRegistryUnreachable: no usable answer from the registry
	// (network failure, timeout, rate limit or server error).
	ReasonRegistryUnreachable = "RegistryUnreachable"
	// ReasonRegistryBadResponse: the registry answered with something
	// unusable.
	ReasonRegistryBadResponse = "RegistryBadResponse"
	// ReasonImagePullSecretInvalid: the credentials the pool names
	// (spec.imagePullSecret, or the coordinator's auth file) cannot be used.
	ReasonImagePullSecretInvalid = "ImagePullSecretInvalid"
	// ReasonRegistryUnauthorized (reasons_agent.go) is also one of these.
)

// Why a node has no image in its pool's multi-arch index (the reason of
// AnnotationNoPlatformImage).
const (
	// ReasonPlatformNotInIndex: the index has no image for the node's platform.
	ReasonPlatformNotInIndex = "PlatformNotInIndex"
	// ReasonPlatformAmbiguous: the index has several images for the node's
	// platform that cannot be told apart (e.g. arm64 and arm64/v8).
	ReasonPlatformAmbiguous = "PlatformAmbiguous"
	// ReasonNodePlatformUnknown: the Node reports no usable
	// status.nodeInfo.operatingSystem or architecture.
	ReasonNodePlatformUnknown = "NodePlatformUnknown"
)

// Reasons of the Events the coordinator records on pools, BootcNodes and
// Nodes. ReasonUndecodableObject and the ReasonPlatform* reasons above are
// Event reasons too.
const (
	EventRebootGranted   = "RebootGranted"
	EventDrained         = "Drained"
	EventDrainFailed     = "DrainFailed"
	EventNodeUpdated     = "NodeUpdated"
	EventStaged          = "Staged"
	EventGrantRevoked    = "GrantRevoked"
	EventGrantReleased   = "GrantReleased"
	EventNodeBack        = "NodeBack"
	EventNodeFellOver    = "NodeFellOver"
	EventRebootTimeout   = "RebootTimeout"
	EventImageChanged    = "ImageChanged"
	EventResolveFailed   = "ResolveFailed"
	EventHalted          = "Halted"
	EventNodeConflict    = "NodeConflict"
	EventSlotMalformed   = "SlotMalformed"
	EventRolloutComplete = "RolloutComplete"
	EventCordonRestored  = "CordonRestored"
	// EventCordonLeft: a node is left cordoned at release because only the
	// Node's mark, not the grant, says the cordon was the coordinator's.
	EventCordonLeft = "CordonLeft"
	// EventStagedNotVerified: a reboot grant in phase Reboot was revoked
	// because its node's stage is not verified and signed images are now
	// required (amendment 21).
	EventStagedNotVerified = "StagedNotVerified"
	// EventPlatformImageFound, on a BootcNode: its pool's index now has an
	// image for its platform (while it has none, the Event's reason is the
	// ReasonPlatform* of the case).
	EventPlatformImageFound = "PlatformImageFound"
)
