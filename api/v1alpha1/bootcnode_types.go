package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// BootcNodeSpec is written by the coordinator only.
type BootcNodeSpec struct {
	// Pool is the BootcNodePool that manages this node.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +required
	Pool string `json:"pool"`

	// DesiredImage is the digest-pinned repo@sha256:<64 hex> the node should
	// run: the pool's targetImage, or, when that is a multi-arch index, the
	// image of the node's platform in it. Empty while the pool has no
	// resolved target, or when the index has no image for the node's
	// platform (annotation fleet.bootc.dev/no-platform-image says why).
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^$|^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]{1,5})?/)?[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*@sha256:[a-f0-9]{64}$`
	// +optional
	DesiredImage string `json:"desiredImage,omitempty"`

	// RebootPolicy is copied from the pool.
	// +kubebuilder:default=Reboot
	// +optional
	RebootPolicy RebootPolicy `json:"rebootPolicy,omitempty"`

	// RequireSignedImages is copied from the pool: stage with bootc's
	// --enforce-container-sigpolicy and reboot only into a staged deployment
	// whose signature is ContainerPolicy (docs/design.md, amendment 14).
	// +optional
	RequireSignedImages bool `json:"requireSignedImages,omitempty"`

	// Health is what the agent reports on for the pool's health gate.
	// +optional
	Health *NodeHealthSpec `json:"health,omitempty"`
}

// NodePhase is where the agent is in moving its node to the desired image.
// +kubebuilder:validation:Enum=Idle;Waiting;Staging;Staged;Rebooting;Degraded
type NodePhase string

// The phases of a node, in the order a rollout moves it through them.
const (
	// PhaseIdle: booted on the desired image, or nothing desired.
	PhaseIdle NodePhase = "Idle"
	// PhaseWaiting: an image is desired, no stage grant held yet.
	PhaseWaiting NodePhase = "Waiting"
	// PhaseStaging: downloading and staging the desired image under a grant.
	PhaseStaging NodePhase = "Staging"
	// PhaseStaged: the desired image is staged (download-only), waiting for a reboot grant.
	PhaseStaged NodePhase = "Staged"
	// PhaseRebooting: the reboot is recorded and being carried out.
	PhaseRebooting NodePhase = "Rebooting"
	// PhaseDegraded: the agent cannot proceed safely; Reason says why.
	PhaseDegraded NodePhase = "Degraded"
)

// ConditionAPIAccess is a BootcNode condition the agent keeps: False while
// the API server refuses one of its requests (a read of its grants, a confirm
// read, a status write), with the server's message, so a refusal shows on
// the node instead of only in the agent's log.
const ConditionAPIAccess = "APIAccess"

// GrantInUse is a slot grant the agent holds and reports in its status. The
// agent writes no Lease (docs/design.md, amendment 8): listing a grant here,
// in a report whose lastReportTime changed, is how it says "I hold this
// grant in boot status.bootID and I am still working on it".
type GrantInUse struct {
	// Lease is the slot Lease's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Lease string `json:"lease"`
	// UID is the slot Lease's UID.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +required
	UID types.UID `json:"uid"`
	// LeaseTransitions is the Lease's leaseTransitions when it was granted.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	// +required
	LeaseTransitions int32 `json:"leaseTransitions"`
	// Released, when set, is a CamelCase reason why the agent lets go of this
	// grant without using it (e.g. StageFailed after too many attempts); the
	// coordinator then hands the slot on without waiting for it to expire.
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^$|^[A-Z][A-Za-z0-9]*$`
	// +optional
	Released string `json:"released,omitempty"`
}

// Deployment is one bootc boot entry as the agent read it.
type Deployment struct {
	// Image is the image reference bootc tracks (as bootc reports it).
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Image string `json:"image,omitempty"`
	// Digest is the manifest digest, sha256:<64 hex>.
	// +kubebuilder:validation:Pattern=`^$|^sha256:[a-f0-9]{64}$`
	// +optional
	Digest string `json:"digest,omitempty"`
	// Version is the image's version label, if any.
	// +kubebuilder:validation:MaxLength=256
	// +optional
	Version string `json:"version,omitempty"`
	// Timestamp is the image's creation time, if known (RFC 3339 as
	// metav1.Time decodes it: pattern added by packaging/crdpatch).
	// +optional
	Timestamp *metav1.Time `json:"timestamp,omitempty"`
	// DownloadOnly marks a staged deployment that the next reboot will not apply.
	// +optional
	DownloadOnly bool `json:"downloadOnly,omitempty"`
	// SoftRebootCapable: bootc says a soft reboot can switch to this deployment.
	// +optional
	SoftRebootCapable bool `json:"softRebootCapable,omitempty"`
	// Signature is how bootc verified this deployment's image when it
	// fetched it (bootc's image.image.signature): ContainerPolicy (the
	// host's containers-policy.json, enforced), Insecure (not verified),
	// OstreeRemote, or empty when bootc did not say.
	// +kubebuilder:validation:Enum="";Insecure;ContainerPolicy;OstreeRemote
	// +optional
	Signature ImageSignature `json:"signature,omitempty"`
}

// ImageSignature is how bootc verified a deployment's image.
type ImageSignature string

// Values of ImageSignature (bootc crates/lib/src/spec.rs, ImageSignature).
const (
	SignatureUnknown         ImageSignature = ""
	SignatureInsecure        ImageSignature = "Insecure"
	SignatureContainerPolicy ImageSignature = "ContainerPolicy"
	SignatureOstreeRemote    ImageSignature = "OstreeRemote"
)

// Verified says bootc enforced the host's container signature policy when
// it fetched d, as a pool with requireSignedImages asks.
func (d *Deployment) Verified() bool { return d != nil && d.Signature == SignatureContainerPolicy }

// MaxStatusMessage bounds BootcNodeStatus.message (the CRD's maxLength).
const MaxStatusMessage = 4096

// BootcNodeStatus is written by the node's agent only.
type BootcNodeStatus struct {
	// ObservedGeneration is the spec generation the agent acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// BootID is /proc/sys/kernel/random/boot_id of the boot this status was read in.
	// +kubebuilder:validation:Pattern=`^$|^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	// +optional
	BootID string `json:"bootID,omitempty"`
	// SoftRebootCount is systemd's SoftRebootsCount in that boot (a uint32
	// on the bus). With BootID it names the boot: a soft reboot keeps the
	// kernel's boot ID and increments this count.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	// +optional
	SoftRebootCount int64 `json:"softRebootCount,omitempty"`
	// +optional
	Booted *Deployment `json:"booted,omitempty"`
	// +optional
	Staged *Deployment `json:"staged,omitempty"`
	// +optional
	Rollback *Deployment `json:"rollback,omitempty"`
	// +optional
	Phase NodePhase `json:"phase,omitempty"`
	// Reason is a CamelCase word for the phase, e.g. BootedUnexpectedImage.
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^$|^[A-Z][A-Za-z0-9]*$`
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message explains the phase to a person.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	Message string `json:"message,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// AgentVersion is the version of bootc-fleet-agent that wrote this.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	AgentVersion string `json:"agentVersion,omitempty"`
	// Host is what the agent read from systemd in the boot it names, for
	// the pool's health gate (amendment 24).
	// +optional
	Host *HostHealth `json:"host,omitempty"`
	// Grants are the grants the agent holds in this boot (see GrantInUse).
	// +listType=map
	// +listMapKey=lease
	// +kubebuilder:validation:MaxItems=16
	// +optional
	Grants []GrantInUse `json:"grants,omitempty"`
	// LastReportTime is when the agent last wrote this status, on the node's
	// clock. The coordinator never compares it with its own clock: a new
	// value is a heartbeat, timed by when the coordinator saw it.
	// metav1.MicroTime decodes only RFC 3339 with exactly six fractional
	// digits (what it encodes), so the schema takes only that: any other
	// form, stored, would make the coordinator's read of this object fail.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Format=date-time
	// +kubebuilder:validation:Pattern=`^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`
	// +optional
	LastReportTime *metav1.MicroTime `json:"lastReportTime,omitempty"`
}

// BootcNode is one managed node's desired image and reported state. It is
// named after the Node.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=bn,categories=bootc-fleet
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.pool`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Booted",type=string,JSONPath=`.status.booted.digest`
// +kubebuilder:printcolumn:name="Desired",type=string,JSONPath=`.spec.desiredImage`
// +kubebuilder:printcolumn:name="Rollout",type=string,JSONPath=`.metadata.annotations.fleet\.bootc\.dev/rollout-state`
// +kubebuilder:printcolumn:name="Why",type=string,JSONPath=`.metadata.annotations.fleet\.bootc\.dev/rollout-reason`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BootcNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec BootcNodeSpec `json:"spec"`
	// +optional
	Status BootcNodeStatus `json:"status,omitempty"`
}

// BootcNodeList is a list of BootcNode.
//
// +kubebuilder:object:root=true
type BootcNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BootcNode `json:"items"`
}

// The coordinator's view of a node in its pool's rollout, on the BootcNode
// (the status is the agent's; docs/design.md, amendment 15). Both change
// only when the node's state or the cause of its wait changes, never with a
// clock or a queue position, so they cost a write per step, not per pass.
const (
	// AnnotationRolloutState is one word: RolloutState*.
	AnnotationRolloutState = "fleet.bootc.dev/rollout-state"
	// AnnotationRolloutReason says, in words a person acts on, why the
	// node is where it is (what it waits for, what blocks it).
	AnnotationRolloutReason = "fleet.bootc.dev/rollout-reason"
)

// Values of AnnotationRolloutState.
const (
	RolloutUpdated              = "Updated"
	RolloutWaitingForStageSlot  = "WaitingForStageSlot"
	RolloutStaging              = "Staging"
	RolloutWaitingForRebootSlot = "WaitingForRebootSlot"
	RolloutDraining             = "Draining"
	RolloutRebooting            = "Rebooting"
	RolloutVerifying            = "Verifying"
	RolloutHeld                 = "Held"
	RolloutBlocked              = "Blocked"
	RolloutFailed               = "Failed"
	RolloutDegraded             = "Degraded"
	RolloutNoImage              = "NoImage"
	RolloutUnknown              = "Unknown"
)

// MaxRolloutReason bounds AnnotationRolloutReason.
const MaxRolloutReason = 512

// SetRollout writes the coordinator's view (state "" removes both).
func (bn *BootcNode) SetRollout(state, reason string) {
	if state == "" {
		delete(bn.Annotations, AnnotationRolloutState)
		delete(bn.Annotations, AnnotationRolloutReason)
		return
	}
	if bn.Annotations == nil {
		bn.Annotations = map[string]string{}
	}
	bn.Annotations[AnnotationRolloutState] = state
	bn.Annotations[AnnotationRolloutReason] = reason
}

// SetNoPlatformImage writes (or, with v empty, removes) the coordinator's
// verdict that the pool's index has no image for this node: the annotation
// AnnotationNoPlatformImage.
func (bn *BootcNode) SetNoPlatformImage(v string) {
	if v == "" {
		delete(bn.Annotations, AnnotationNoPlatformImage)
		return
	}
	if bn.Annotations == nil {
		bn.Annotations = map[string]string{}
	}
	bn.Annotations[AnnotationNoPlatformImage] = v
}
