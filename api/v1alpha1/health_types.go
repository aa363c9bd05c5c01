package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The health gate, rollback, quarantine and canaries (docs/design.md,
// amendments 24-27).

// HealthSpec is the gate a node passes after each reboot of a rollout
// before its reboot slot is released: every check it names must pass at
// once, in the node's new boot. Unset: no gate (the node is done when it is
// back Ready, in a new boot, on its target, for minReadySeconds).
type HealthSpec struct {
	// Timeout is how long a node may take, from when it was first found
	// back on its target, to pass every check; then it fails with the check
	// that did not pass, and spec.rollout.onFailure applies. From 30s to 24h.
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('30s') && duration(self) <= duration('24h')",message="must be a duration from 30s to 24h, e.g. 10m"
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// Host checks what the agent read from systemd in the new boot.
	// +optional
	Host *HostHealthCheck `json:"host,omitempty"`

	// Workloads checks pods on the node.
	// +optional
	Workloads *WorkloadHealthCheck `json:"workloads,omitempty"`

	// Metrics checks a Prometheus query, before a reboot is granted and
	// before the slot is released.
	// +optional
	Metrics *MetricsHealthCheck `json:"metrics,omitempty"`
}

// MaxRequiredUnits bounds HostHealthCheck.RequiredUnits.
const MaxRequiredUnits = 16

// HostHealthCheck passes when the node's systemd manager is running (not
// starting, not degraded), every required unit is active and, with
// RequireBootComplete, boot-complete.target was reached.
type HostHealthCheck struct {
	// RequireBootComplete: boot-complete.target must be active (images that
	// use systemd's boot assessment, e.g. greenboot or systemd-bless-boot,
	// order their health checks before it).
	// +optional
	RequireBootComplete bool `json:"requireBootComplete,omitempty"`

	// AllowDegraded: a manager in state degraded (some unit failed) passes;
	// the failed units are still reported. Default false.
	// +optional
	AllowDegraded bool `json:"allowDegraded,omitempty"`

	// RequiredUnits must be active in the new boot: systemd unit names,
	// e.g. kubelet.service.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=255
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9:_.\\@-]+\.(service|socket|target|mount|path|timer|scope|slice|swap|device|automount)$`
	// +listType=set
	// +optional
	RequiredUnits []string `json:"requiredUnits,omitempty"`
}

// WorkloadHealthCheck passes when the node is Ready and every pod on it
// that PodSelector matches (in any namespace) has been Ready for
// MinReadySeconds.
type WorkloadHealthCheck struct {
	// PodSelector picks the pods that must be Ready, typically DaemonSet
	// pods. It must not be empty.
	// +kubebuilder:validation:XValidation:rule="(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",message="must select pods by at least one label or expression"
	// +required
	PodSelector metav1.LabelSelector `json:"podSelector"`

	// MinReadySeconds is how long each pod must have been Ready.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	// +optional
	MinReadySeconds int32 `json:"minReadySeconds,omitempty"`
}

// MetricsHealthCheck passes when Query, an instant query, returns no
// series whose NodeLabel is the node's name. A query that errors (or a
// server that does not answer) does not pass, named as such.
type MetricsHealthCheck struct {
	// URL is the Prometheus server's base URL (http or https), e.g.
	// https://prometheus.monitoring.svc:9090.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^https?://[^\s/?#]+(/[^\s?#]*)?$`
	// +required
	URL string `json:"url"`

	// Query is the PromQL expression, e.g.
	// ALERTS{alertstate="firing",severity="critical"}.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +required
	Query string `json:"query"`

	// NodeLabel is the label of a result series that names the node.
	// +kubebuilder:default=node
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[a-zA-Z_][a-zA-Z0-9_]*$`
	// +optional
	NodeLabel string `json:"nodeLabel,omitempty"`

	// CASecret names a Secret in the coordinator's namespace whose key
	// ca.crt holds the PEM CA bundle that verifies URL (https only).
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	CASecret string `json:"caSecret,omitempty"`

	// BearerTokenSecret names a Secret in the coordinator's namespace whose
	// key token is sent as the bearer token.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	BearerTokenSecret string `json:"bearerTokenSecret,omitempty"`
}

// FailurePolicy is what a failed node's rollout does.
// +kubebuilder:validation:Enum=Rollback;Halt
type FailurePolicy string

const (
	// OnFailureRollback rolls a node that failed its health gate back to
	// its previous image under a rollback grant, quarantines the image for
	// the pool and stops the rollout (amendment 25).
	OnFailureRollback FailurePolicy = "Rollback"
	// OnFailureHalt leaves the failed node held and halts the rollout.
	OnFailureHalt FailurePolicy = "Halt"
)

// ZoneOrder is how a rollout orders the zones of a pool.
// +kubebuilder:validation:Enum=Sequential;Any
type ZoneOrder string

const (
	// ZoneOrderSequential rolls one zone at a time
	// (topology.kubernetes.io/zone, in name order; nodes without the label
	// last): a zone finishes before the next starts.
	ZoneOrderSequential ZoneOrder = "Sequential"
	// ZoneOrderAny ignores zones.
	ZoneOrderAny ZoneOrder = "Any"
)

// LabelZone is the well-known zone label the rollout orders by.
const LabelZone = "topology.kubernetes.io/zone"

// LabelCanary on a Node (any value) makes it one of its pool's canaries.
const LabelCanary = "fleet.bootc.dev/canary"

// CanarySpec makes the canaries go first and alone: no other node of the pool
// gets a reboot grant for a target until every canary passed its gate on
// it and Soak has passed since the last of them did.
type CanarySpec struct {
	// Nodes is how many canaries (an integer >= 0 or a percentage, rounded
	// up): the nodes labelled fleet.bootc.dev/canary, else the first nodes
	// of the pool's queue order (docs/coordinator.md). 0: no canaries.
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 && self <= 2147483647 : self.matches('^([0-9]|[1-9][0-9]|100)%$')",message="must be an integer from 0 to 2147483647 or a percentage from 0% to 100%"
	// +optional
	Nodes *intstr.IntOrString `json:"nodes,omitempty"`

	// Soak is how long the rollout waits after the last canary passed.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('168h')",message="must be a duration from 0s to 168h, e.g. 30m"
	// +optional
	Soak *metav1.Duration `json:"soak,omitempty"`
}

// Quarantine is a target image that failed a node's health gate: no node
// of the pool stages or reboots into Digest while spec.image is still
// SpecImage (amendment 25).
type Quarantine struct {
	// SpecImage is spec.image as it was when Digest failed.
	// +kubebuilder:validation:MaxLength=512
	// +required
	SpecImage string `json:"specImage"`
	// Digest is the failed target, repo@sha256:<64 hex>.
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^[^\s@]+@sha256:[a-f0-9]{64}$`
	// +required
	Digest string `json:"digest"`
	// Node is the node whose gate failed.
	// +kubebuilder:validation:MaxLength=253
	// +required
	Node string `json:"node"`
	// Reason names the check that failed (e.g. HostUnitFailed).
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Z][A-Za-z0-9]*$`
	// +required
	Reason string `json:"reason"`
	// Message says what failed: the unit, the pod or the query's series.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`
	// Since is when the image was quarantined.
	// +required
	Since metav1.Time `json:"since"`
}

// CanaryStatus is how far the canaries are on the current target.
type CanaryStatus struct {
	// Target is the target image the canaries were rolled to.
	// +kubebuilder:validation:MaxLength=512
	// +required
	Target string `json:"target"`
	// Nodes are the canaries chosen for Target.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=253
	// +listType=set
	// +optional
	Nodes []string `json:"nodes,omitempty"`
	// PassedTime is when the last canary passed its gate on Target; the
	// soak runs from it. Unset: not all passed yet.
	// +optional
	PassedTime *metav1.Time `json:"passedTime,omitempty"`
}

// NodeHealthSpec is the part of the pool's gate the agent needs to know:
// which units to report on.
type NodeHealthSpec struct {
	// RequiredUnits is copied from the pool's spec.health.host.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=255
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9:_.\\@-]+\.(service|socket|target|mount|path|timer|scope|slice|swap|device|automount)$`
	// +listType=set
	// +optional
	RequiredUnits []string `json:"requiredUnits,omitempty"`
}

// SystemState is the systemd manager's SystemState property.
// +kubebuilder:validation:Enum=initializing;starting;running;degraded;maintenance;stopping;offline;unknown
type SystemState string

// The manager states systemd reports (systemctl is-system-running).
const (
	SystemInitializing SystemState = "initializing"
	SystemStarting     SystemState = "starting"
	SystemRunning      SystemState = "running"
	SystemDegraded     SystemState = "degraded"
	SystemMaintenance  SystemState = "maintenance"
	SystemStopping     SystemState = "stopping"
	SystemOffline      SystemState = "offline"
	SystemUnknown      SystemState = "unknown"
)

// MaxFailedUnits bounds HostHealth.FailedUnits.
const MaxFailedUnits = 16

// UnitState is one unit's ActiveState.
type UnitState struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +required
	Name string `json:"name"`
	// ActiveState: active, reloading, inactive, failed, activating,
	// deactivating, maintenance, refreshing; empty if the unit is not loaded.
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^$|^[a-z]+$`
	// +optional
	ActiveState string `json:"activeState,omitempty"`
}

// HostHealth is what the agent read from systemd over D-Bus, in the boot
// BootID/SoftRebootCount names (amendment 24).
type HostHealth struct {
	// BootID of the boot this was read in.
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	// +required
	BootID string `json:"bootID"`
	// SoftRebootCount of that boot.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	// +optional
	SoftRebootCount int64 `json:"softRebootCount,omitempty"`
	// SystemState is the manager's state.
	// +required
	SystemState SystemState `json:"systemState"`
	// FailedUnits are units in state failed, at most 16, sorted.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=255
	// +listType=atomic
	// +optional
	FailedUnits []string `json:"failedUnits,omitempty"`
	// FailedUnitsTotal counts all failed units (FailedUnits may be cut).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	FailedUnitsTotal int32 `json:"failedUnitsTotal,omitempty"`
	// BootComplete is boot-complete.target's ActiveState.
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^$|^[a-z]+$`
	// +optional
	BootComplete string `json:"bootComplete,omitempty"`
	// Units are the states of spec.health.requiredUnits.
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	// +optional
	Units []UnitState `json:"units,omitempty"`
}
