package v1alpha1

// Reasons the agent gives with PhaseDegraded (and a few informational ones).
const (
	// ReasonUnlockedWithoutGrant: the staged deployment is unlocked but the reboot grant is gone.
	ReasonUnlockedWithoutGrant = "UnlockedWithoutGrant"
	// ReasonRebootDidNotHappen: a recorded reboot did not happen within rebootTimeout.
	ReasonRebootDidNotHappen = "RebootDidNotHappen"
	// ReasonBootedUnexpectedImage: after a recorded reboot the node booted another image.
	ReasonBootedUnexpectedImage = "BootedUnexpectedImage"
	// ReasonStatusUnavailable: bootc status could not be read or parsed.
	ReasonStatusUnavailable = "StatusUnavailable"
	// ReasonRecordUnreadable: the reboot record is torn or corrupt.
	ReasonRecordUnreadable = "RecordUnreadable"
	// ReasonStageFailed: bootc switch --download-only failed.
	ReasonStageFailed = "StageFailed"
	// ReasonStageTimedOut: a stage did not finish within the pool's
	// stageTimeout (carried on the stage grant); the agent cancelled it and
	// let go of the grant (docs/design.md, amendment 19).
	ReasonStageTimedOut = "StageTimedOut"
	// ReasonStagedDigestMismatch: the staged digest is not the granted one.
	ReasonStagedDigestMismatch = "StagedDigestMismatch"
	// ReasonRollbackImageMismatch: a rollback grant (or a recorded
	// rollback) names another image than bootc's rollback deployment; the
	// agent does not roll back (amendment 25).
	ReasonRollbackImageMismatch = "RollbackImageMismatch"
	// ReasonRollbackQueuedWithoutGrant: `bootc rollback` queued the
	// rollback deployment but the rollback grant is gone: any reboot will
	// boot it.
	ReasonRollbackQueuedWithoutGrant = "RollbackQueuedWithoutGrant"
	// ReasonInvalidDesiredImage: spec.desiredImage failed validation.
	ReasonInvalidDesiredImage = "InvalidDesiredImage"
	// ReasonRebootTimeout: set by the coordinator on the grant when the node did not come back.
	ReasonRebootTimeout = "RebootTimeout"
	// ReasonGrantedInAnotherBoot: a grant the agent lists as released because
	// it was issued in another boot (void in this one).
	ReasonGrantedInAnotherBoot = "GrantedInAnotherBoot"
	// ReasonRebootGrantUnused: a reboot grant of an earlier boot that the
	// agent lists as released because it never rebooted under it (no reboot
	// record names it and no reboot spent it): the node went down some
	// other way (power loss, a person) before the agent used the grant.
	ReasonRebootGrantUnused = "RebootGrantUnused"
	// ReasonBootcUnsupported: the installed bootc cannot stage an image
	// without applying it; the message names the version found.
	ReasonBootcUnsupported = "BootcUnsupported"
	// ReasonSignatureRejected: bootc refused to stage the desired image
	// under the host's container signature policy (the message is bootc's).
	// The agent does not try that image again in this run; the coordinator
	// counts the node as failed (haltAfterFailures).
	ReasonSignatureRejected = "SignatureRejected"
	// ReasonRegistryUnauthorized starts the message of a StageFailed whose
	// cause is the registry refusing bootc's credentials (HTTP 401/403), and
	// is the pool's ResolveFailed reason for the coordinator's own refusal.
	ReasonRegistryUnauthorized = "RegistryUnauthorized"
)

// Reasons the agent reports outside PhaseDegraded.
const (
	// ReasonUpToDate: booted on the desired image.
	ReasonUpToDate = "UpToDate"
	// ReasonNoDesiredImage: the coordinator set no desired image.
	ReasonNoDesiredImage = "NoDesiredImage"
	// ReasonWaitingForStageGrant: an image is desired, no stage grant held.
	ReasonWaitingForStageGrant = "WaitingForStageGrant"
	// ReasonStaging: downloading and staging under a stage grant.
	ReasonStaging = "Staging"
	// ReasonWaitingForRebootGrant: staged, no reboot grant held.
	ReasonWaitingForRebootGrant = "WaitingForRebootGrant"
	// ReasonRebooting: rebooting, or about to, under a reboot grant.
	ReasonRebooting = "Rebooting"
	// ReasonRollingBack: running `bootc rollback` and rebooting into the
	// rollback deployment under a rollback grant (amendment 25), or about
	// to once the grant is in phase Reboot.
	ReasonRollingBack = "RollingBack"
	// ReasonStaleStatus: the bootc status was read in an earlier boot; it
	// is read again before anything is done.
	ReasonStaleStatus = "StaleStatus"
	// ReasonStatusSettling: after a reboot, waiting for bootc's status to
	// show the new boot.
	ReasonStatusSettling = "StatusSettling"
	// ReasonRebootCompleted: back from the recorded reboot on the granted
	// image.
	ReasonRebootCompleted = "RebootCompleted"
	// ReasonCancellingStage: cancelling a stage in flight that must not
	// go on (its grant or its image is gone, a reboot came between).
	ReasonCancellingStage = "CancellingStage"
	// ReasonRenewingGrant: a reboot is recorded, but the agent's last
	// report of its grant is too old; it reports the grant again before
	// it reboots.
	ReasonRenewingGrant = "RenewingGrant"
	// ReasonProbingBootc: finding out what the installed bootc can do.
	ReasonProbingBootc = "ProbingBootc"
	// ReasonLockingStagedImage: the staged image is not locked (a stage
	// ended between its switch and its lock); it is locked under the
	// stage grant.
	ReasonLockingStagedImage = "LockingStagedImage"
	// ReasonStagedNotVerified: a reboot was recorded into a staged
	// deployment that bootc did not verify, while signed images are required.
	ReasonStagedNotVerified = "StagedNotVerified"
)

// ReasonRequestRefused is the reason of ConditionAPIAccess while the API
// server refuses one of the agent's requests (ReasonAsExpected otherwise).
const ReasonRequestRefused = "RequestRefused"

// ReasonMalformedGrant is the reason of the agent's GrantsReadable
// condition when False (True is ReasonAsExpected): a Lease labelled with
// this node does not follow the slot protocol; it is ignored, never acted
// on.
const ReasonMalformedGrant = "MalformedGrant"
