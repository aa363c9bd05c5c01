package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// RebootPolicy says how a node may restart into a staged image.
// +kubebuilder:validation:Enum=Reboot;AllowSoftReboot
type RebootPolicy string

const (
	// RebootPolicyReboot always reboots the machine.
	RebootPolicyReboot RebootPolicy = "Reboot"
	// RebootPolicyAllowSoftReboot soft-reboots (userspace only) when bootc
	// reports the staged deployment as soft-reboot capable.
	RebootPolicyAllowSoftReboot RebootPolicy = "AllowSoftReboot"
)

// RolloutSpec bounds how fast a pool changes.
type RolloutSpec struct {
	// MaxUnavailable is how many nodes of the pool may be disrupted at once:
	// an integer >= 1 or a percentage 1%-100% of the pool (rounded up, never
	// below 1). Nodes NotReady or cordoned for other reasons count against it.
	// The integer form is an int32 in Go (intstr): the rule bounds it there,
	// since the API server enforces no range on an int-or-string.
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 && self <= 2147483647 : self.matches('^([1-9][0-9]?|100)%$')",message="must be an integer from 1 to 2147483647 or a percentage from 1% to 100%"
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// MaxStaging is how many nodes may download and stage an image at once:
	// an integer >= 1 or a percentage 1%-100% (rounded up, never below 1).
	// +kubebuilder:default="25%"
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 && self <= 2147483647 : self.matches('^([1-9][0-9]?|100)%$')",message="must be an integer from 1 to 2147483647 or a percentage from 1% to 100%"
	// +optional
	MaxStaging *intstr.IntOrString `json:"maxStaging,omitempty"`

	// Paused stops new grants of either kind; work already granted finishes.
	// +optional
	Paused bool `json:"paused,omitempty"`

	// DrainTimeout bounds one drain attempt; a drain that times out is
	// reported and retried, never followed by a reboot.
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="must be a duration greater than 0, e.g. 10m"
	// +optional
	DrainTimeout *metav1.Duration `json:"drainTimeout,omitempty"`

	// RebootTimeout is how long a node may take to come back Ready, in a new
	// boot, on the target image before it counts as failed.
	// +kubebuilder:default="15m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="must be a duration greater than 0, e.g. 15m"
	// +optional
	RebootTimeout *metav1.Duration `json:"rebootTimeout,omitempty"`

	// StageTimeout bounds one stage: the agent cancels a download that has
	// not finished this long after it started and gives the slot on, and
	// the coordinator revokes a stage grant held this long plus one lease
	// duration (docs/design.md, amendment 19). From 1m to 24h.
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('24h')",message="must be a duration from 1m to 24h, e.g. 1h"
	// +optional
	StageTimeout *metav1.Duration `json:"stageTimeout,omitempty"`

	// HaltAfterFailures halts the rollout (no new reboot grants) once this
	// many nodes failed to come back on the target image.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	// +optional
	HaltAfterFailures *int32 `json:"haltAfterFailures,omitempty"`

	// Windows are when new reboot grants may be given; none means any time.
	// Work granted inside a window finishes after it closes. Staging may
	// run at any time unless StageOnlyInWindow.
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	Windows []MaintenanceWindow `json:"windows,omitempty"`

	// StageOnlyInWindow: no new stage grants outside Windows either.
	// +optional
	StageOnlyInWindow bool `json:"stageOnlyInWindow,omitempty"`

	// MinReadySeconds is how long a node must stay Ready, back on the
	// target image in a new boot, before its reboot slot is released: a
	// node that comes up and falls over keeps its slot, so the rollout
	// does not move on past it.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	// +optional
	MinReadySeconds int32 `json:"minReadySeconds,omitempty"`

	// PauseBetweenBatches makes reboots go in batches: a new batch of up to
	// maxUnavailable nodes starts only when every node of the previous one
	// is back (no reboot slot held) and this long has passed since the last
	// of them came back. Unset or 0: each freed slot is granted again at
	// once.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s')",message="must be a duration of 0 or more, e.g. 10m"
	// +optional
	PauseBetweenBatches *metav1.Duration `json:"pauseBetweenBatches,omitempty"`

	// OnFailure is what a node failing its health gate does: Rollback
	// (default) rolls it back to its previous image under a rollback grant
	// and quarantines the image; Halt leaves it held and halts the rollout.
	// +kubebuilder:default=Rollback
	// +optional
	OnFailure FailurePolicy `json:"onFailure,omitempty"`

	// Canary: canary nodes go first and alone (amendment 26).
	// +optional
	Canary *CanarySpec `json:"canary,omitempty"`

	// ZoneOrder: Sequential (default) rolls one zone
	// (topology.kubernetes.io/zone) after another; Any ignores zones.
	// +kubebuilder:default=Sequential
	// +optional
	ZoneOrder ZoneOrder `json:"zoneOrder,omitempty"`
}

// Weekday is a day of the week, as Go's time.Weekday names it.
// +kubebuilder:validation:Enum=Monday;Tuesday;Wednesday;Thursday;Friday;Saturday;Sunday
type Weekday string

// MaintenanceWindow opens on each of Days at Start, local time in TimeZone,
// for Duration (elapsed time: a window across a DST change lasts Duration).
type MaintenanceWindow struct {
	// Days the window opens on; empty means every day.
	// +kubebuilder:validation:MaxItems=7
	// +listType=set
	// +optional
	Days []Weekday `json:"days,omitempty"`
	// Start is the local opening time, HH:MM (24-hour). On a day a DST
	// change skips that time, the window opens at the same offset past the
	// change (Go's time.Date normalization: 02:30 in a skipped hour opens
	// at 03:30).
	// +kubebuilder:validation:Pattern=`^([01][0-9]|2[0-3]):[0-5][0-9]$`
	// +required
	Start string `json:"start"`
	// Duration is how long the window stays open: more than 0, at most 7 days.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s') && duration(self) <= duration('168h')",message="must be a duration greater than 0 and at most 168h, e.g. 4h"
	// +required
	Duration metav1.Duration `json:"duration"`
	// TimeZone is an IANA time zone name, e.g. Europe/Berlin (default UTC).
	// An unknown name keeps the window closed and is named on the pool.
	// "Local" (Go's name for the process's own zone) is refused.
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*$`
	// +kubebuilder:validation:XValidation:rule="self != 'Local'",message="Local is the reader's own time zone, not an IANA name; name the zone, e.g. Europe/Berlin or UTC"
	// +optional
	TimeZone string `json:"timeZone,omitempty"`
}

// BootcNodePoolSpec is what the operator asks of a set of nodes.
type BootcNodePoolSpec struct {
	// NodeSelector selects the pool's nodes. It must not be empty: an empty
	// selector would take in every node of the cluster.
	// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="must select nodes by at least one label or expression"
	// +required
	NodeSelector metav1.LabelSelector `json:"nodeSelector"`

	// Image is the OS image: registry/repo:tag (resolved to a digest and
	// re-resolved periodically) or registry/repo@sha256:<64 hex>. The
	// registry host is required (a first component with a dot or a port, or
	// localhost).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.contains('/') && (self.split('/')[0].contains('.') || self.split('/')[0].contains(':') || self.split('/')[0] == 'localhost')",message="must name its registry host, e.g. quay.io/fedora/fedora-bootc:42 (bootc and the coordinator complete short names differently)"
	// +kubebuilder:validation:Pattern=`^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]{1,5})?/)?[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}(?:@sha256:[a-f0-9]{64})?|@sha256:[a-f0-9]{64})$`
	// +required
	Image string `json:"image"`

	// Rollout bounds the pace of the rollout.
	// +kubebuilder:default={}
	// +optional
	Rollout RolloutSpec `json:"rollout,omitempty"`

	// RebootPolicy is Reboot (default) or AllowSoftReboot.
	// +kubebuilder:default=Reboot
	// +optional
	RebootPolicy RebootPolicy `json:"rebootPolicy,omitempty"`

	// ImagePullSecret names a Secret of type kubernetes.io/dockerconfigjson
	// in the coordinator's namespace (bootc-fleet-system) whose credentials
	// the coordinator uses to resolve Image. Nodes pull with their own
	// credentials (/etc/ostree/auth.json or /run/ostree/auth.json on the
	// host; docs/image.md), never with this Secret.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	ImagePullSecret string `json:"imagePullSecret,omitempty"`

	// RequireSignedImages makes every node stage with bootc's
	// --enforce-container-sigpolicy, so the host's
	// /etc/containers/policy.json decides which images may be staged (and
	// bootc refuses a policy whose default is insecureAcceptAnything). A node
	// reboots only into a staged deployment bootc verified that way; a
	// rejected image is a failure that counts toward haltAfterFailures.
	// +optional
	RequireSignedImages bool `json:"requireSignedImages,omitempty"`

	// Health is the gate a node passes after each reboot before its slot is
	// released (amendment 24). Unset: no gate.
	// +optional
	Health *HealthSpec `json:"health,omitempty"`
}

// Pool condition types.
const (
	// PoolProgressing is True while nodes are being moved to the target.
	PoolProgressing = "Progressing"
	// PoolUpToDate is True when every node runs the target image.
	PoolUpToDate = "UpToDate"
	// PoolDegraded is True when some node, or the pool itself, needs attention.
	PoolDegraded = "Degraded"
	// PoolHalted is True when failures reached haltAfterFailures.
	PoolHalted = "Halted"
	// PoolAgentsReporting is False while some node with rollout work has an
	// agent that went quiet or whose API requests are refused.
	PoolAgentsReporting = "AgentsReporting"
	// PoolPlatformImages says how nodes get their image from the target: a
	// single manifest for all, or, for a multi-arch index, each node its
	// platform's image. False names the nodes the index has no image for.
	PoolPlatformImages = "PlatformImages"
	// PoolNodeSelectorRestricted is False when spec.nodeSelector keys on a
	// label a kubelet may set on its own Node (NodeRestriction allows it), so
	// a node could join or leave the pool by relabelling itself; the message
	// names the keys. Keys under node-restriction.kubernetes.io/ (and other
	// labels a kubelet may not set) make it True.
	PoolNodeSelectorRestricted = "NodeSelectorRestricted"
	// PoolMaintenanceWindow (only with spec.rollout.windows) is True while a
	// window is open, False while all are closed; the message says when the
	// open one closes or the next one opens.
	PoolMaintenanceWindow = "MaintenanceWindow"
	// PoolObjectsReadable is present only while the coordinator sets aside
	// an object of the pool (the pool itself or a BootcNode) that its typed
	// scheme cannot decode: False, reason UndecodableObject, the message
	// names each object and the decode error (docs/design.md, amendment 22).
	PoolObjectsReadable = "ObjectsReadable"
)

// AnnotationHold on a Node holds it out of rollouts: it gets no new grant
// (what it holds finishes), is counted in status.held and is no failure.
// The value, if any, is shown as the reason.
const AnnotationHold = "fleet.bootc.dev/hold"

// AnnotationNoPlatformImage is written by the coordinator on a BootcNode
// whose pool's target is a multi-arch index with no usable image for the
// node's platform: "<Reason>: <message>", Reason one of PlatformNotInIndex,
// PlatformAmbiguous or NodePlatformUnknown. Such a node gets no
// desiredImage and no grants. BootcNode status is the agent's, so the
// coordinator's verdict goes here (docs/design.md, amendment 12).
const AnnotationNoPlatformImage = "fleet.bootc.dev/no-platform-image"

// BootcNodePoolStatus is what the coordinator observed and decided.
type BootcNodePoolStatus struct {
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// TargetImage is the resolved repo@sha256:... of spec.image. For a
	// single manifest every node converges to it; for a multi-arch index
	// (manifest list) it is the index digest, and each node converges to its
	// platform's image in that index (its BootcNode's spec.desiredImage).
	// +optional
	TargetImage string `json:"targetImage,omitempty"`
	// ResolvedTime is when TargetImage was last resolved from spec.image.
	// Like every metav1.Time, its schema takes only the RFC 3339 form Go
	// decodes (pattern added by packaging/crdpatch).
	// +optional
	ResolvedTime *metav1.Time `json:"resolvedTime,omitempty"`

	// Nodes is the number of nodes in the pool.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	Nodes int32 `json:"nodes"`
	// Updated counts nodes booted on their target image (for a multi-arch
	// index: their platform's image).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	Updated int32 `json:"updated"`
	// Staging counts nodes downloading the target image.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	Staging int32 `json:"staging"`
	// Staged counts nodes with the target staged, waiting to reboot.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	Staged int32 `json:"staged"`
	// Rebooting counts nodes holding a reboot slot (draining or rebooting).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	Rebooting int32 `json:"rebooting"`
	// Degraded counts nodes that need attention.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	Degraded int32 `json:"degraded"`
	// Waiting counts nodes waiting for a slot.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	Waiting int32 `json:"waiting"`
	// Failures counts nodes that failed to come back on the target image.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	Failures int32 `json:"failures,omitempty"`
	// Quiet counts nodes with rollout work whose agent has not reported for
	// a while (condition AgentsReporting names them).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	Quiet int32 `json:"quiet,omitempty"`
	// Held counts nodes annotated fleet.bootc.dev/hold (also counted in
	// their bucket above); they get no new grants.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	Held int32 `json:"held,omitempty"`

	// Quarantine is the target that failed a node's health gate, while
	// spec.image still names it (amendment 25).
	// +optional
	Quarantine *Quarantine `json:"quarantine,omitempty"`
	// Canary is how far the canaries are on the current target.
	// +optional
	Canary *CanaryStatus `json:"canary,omitempty"`

	// Conditions: Progressing, UpToDate, Degraded, Halted, AgentsReporting,
	// PlatformImages.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// BootcNodePool rolls one OS image out to the nodes its selector picks.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=bnp,categories=bootc-fleet
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 50",message="metadata.name must be at most 50 characters (it names the pool's slot Leases and labels)"
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.image`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes`
// +kubebuilder:printcolumn:name="Updated",type=integer,JSONPath=`.status.updated`
// +kubebuilder:printcolumn:name="Staging",type=integer,JSONPath=`.status.staging`
// +kubebuilder:printcolumn:name="Rebooting",type=integer,JSONPath=`.status.rebooting`
// +kubebuilder:printcolumn:name="Degraded",type=integer,JSONPath=`.status.degraded`
// +kubebuilder:printcolumn:name="Quiet",type=integer,JSONPath=`.status.quiet`
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=`.status.targetImage`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BootcNodePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec BootcNodePoolSpec `json:"spec"`
	// +optional
	Status BootcNodePoolStatus `json:"status,omitempty"`
}

// BootcNodePoolList is a list of BootcNodePool.
//
// +kubebuilder:object:root=true
type BootcNodePoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BootcNodePool `json:"items"`
}
