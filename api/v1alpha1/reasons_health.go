package v1alpha1

// Reasons of the health gate, rollback, quarantine and canaries
// (docs/design.md, amendments 24-27).

// Why a node failed its health gate: the failure a reboot grant is marked
// with (lease.AnnotationFailure), the Quarantine's reason, and the
// NodeHealthCheckFailed Event's message prefix. Each names the check.
const (
	// ReasonHostNotReported: the agent reported no host health read in
	// the node's new boot before health.timeout.
	ReasonHostNotReported = "HostNotReported"
	// ReasonHostNotRunning: the manager stayed initializing, starting,
	// maintenance, stopping or offline.
	ReasonHostNotRunning = "HostNotRunning"
	// ReasonHostUnitFailed: the manager is degraded; the message names the
	// failed units.
	ReasonHostUnitFailed = "HostUnitFailed"
	// ReasonHostUnitInactive: a unit of requiredUnits is not active.
	ReasonHostUnitInactive = "HostUnitInactive"
	// ReasonHostBootIncomplete: boot-complete.target is not active.
	ReasonHostBootIncomplete = "HostBootIncomplete"
	// ReasonWorkloadsNotReady: the node, or a pod the selector matches on
	// it, was not Ready for minReadySeconds.
	ReasonWorkloadsNotReady = "WorkloadsNotReady"
	// ReasonMetricsFiring: the query returned series for the node; the
	// message names them.
	ReasonMetricsFiring = "MetricsFiring"
	// ReasonMetricsQueryFailed: the query could not be run (server
	// unreachable, bad query, unreadable Secret); it counts as not healthy.
	ReasonMetricsQueryFailed = "MetricsQueryFailed"
	// ReasonRolledBackByHost: the node came back in a new boot on the image
	// it had before the update (its boot counting fell back): treated as a
	// failed gate whose rollback is done (amendment 25).
	ReasonRolledBackByHost = "RolledBackByHost"
	// ReasonRollbackFailed: a rollback grant's node did not come back on
	// its previous image; it stays held and the pool halts.
	ReasonRollbackFailed = "RollbackFailed"
)

// Pool condition reasons.
const (
	// ReasonImageFailedHealthCheck (Degraded): the target failed a node's
	// health gate and is quarantined (status.quarantine).
	ReasonImageFailedHealthCheck = "ImageFailedHealthCheck"
	// ReasonCanaryWaiting (Progressing): the canaries are being rolled or
	// soaking; no other node gets a reboot grant yet.
	ReasonCanaryWaiting = "CanaryWaiting"
)

// Events.
const (
	// EventHealthCheckFailed, on the Node and the pool: names the node and
	// the failing check.
	EventHealthCheckFailed = "HealthCheckFailed"
	// EventRollbackGranted: a node that failed its gate got a rollback grant.
	EventRollbackGranted = "RollbackGranted"
	// EventRolledBack: the node is back on its previous image; the slot is
	// released.
	EventRolledBack = "RolledBack"
	// EventRollbackFailed, on the Node, its BootcNode and the pool: a
	// rollback grant's node did not come back on its previous image. Not a
	// second HealthCheckFailed: events.k8s.io folds Events of one reason
	// about one object into a series that keeps the first note, so the
	// rollback's failure would read as the gate's.
	EventRollbackFailed = "RollbackFailed"
	// EventImageQuarantined, on the pool: its target is quarantined.
	EventImageQuarantined = "ImageQuarantined"
	// EventCanariesPassed, on the pool: every canary passed its gate.
	EventCanariesPassed = "CanariesPassed"
)
