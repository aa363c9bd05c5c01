package decide

// What the decision reads (Observation and the types it is made of) and
// what it returns (Action); decide.go holds the rules.

import (
	"fmt"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// BootIdentity names one boot: a soft reboot keeps the kernel's boot ID but
// increments systemd's SoftRebootsCount, so both are needed.
type BootIdentity struct {
	BootID          string
	SoftRebootCount uint32
}

func (b BootIdentity) String() string {
	return fmt.Sprintf("%s/%d", b.BootID, b.SoftRebootCount)
}

// Known reports whether the identity was read at all.
func (b BootIdentity) Known() bool { return b.BootID != "" }

// Desired is BootcNode.spec.desiredImage as the agent read it.
type Desired struct {
	// Image is the validated image; meaningful only when Set and Invalid == "".
	Image imageref.Pinned
	// Set is false when spec.desiredImage is empty (or the BootcNode is absent).
	Set bool
	// Invalid holds the validation error when spec.desiredImage is set but
	// not a digest-pinned reference.
	Invalid string
}

// Deployment is one bootc boot entry reduced to what the decision needs.
type Deployment struct {
	// Image is the entry's image as repo@sha256; zero when bootc reported an
	// entry without a usable image and digest.
	Image             imageref.Pinned
	DownloadOnly      bool
	SoftRebootCapable bool
	// Signature is how bootc verified the image when it fetched it.
	Signature fleetv1.ImageSignature
}

// verified: bootc enforced the host's container signature policy when it
// fetched d (fleetv1.Deployment.Verified).
func (d *Deployment) verified() bool {
	return d != nil && d.Signature == fleetv1.SignatureContainerPolicy
}

// Is reports whether the deployment runs exactly img.
func (d *Deployment) Is(img imageref.Pinned) bool {
	return d != nil && d.Image.Digest != "" && d.Image == img
}

// Status is a bootc status read, with the boot it was read in.
type Status struct {
	// ReadIn is the boot identity the status was read in (unchanged before
	// and after the read); zero if it changed during the read.
	ReadIn BootIdentity
	Booted *Deployment
	Staged *Deployment
	// Rollback is bootc's rollback deployment; RollbackQueued: bootc
	// queued it for the next boot (`bootc rollback` ran).
	Rollback       *Deployment
	RollbackQueued bool
	// Unavailable holds the error when bootc status could not be read.
	Unavailable string
}

// RecordState is the persisted reboot record.
type RecordState struct {
	Present bool
	// Unreadable is set (with Present false) when the record file exists but
	// is torn or corrupt: the agent does not know whether it rebooted.
	Unreadable string
	Grant      lease.ID
	Image      imageref.Pinned
	Boot       BootIdentity
	Recorded   time.Time
	Soft       bool
	// Rollback: the record is of a rollback (amendment 25).
	Rollback bool
}

// HeldGrant is a parsed grant for this node with the time the agent sent its
// last accepted status report that listed it (docs/design.md, amendment 8).
type HeldGrant struct {
	lease.Grant
	LastHeartbeat time.Time
}

// StageFailure is the last failed stage, so a failing download is retried
// with a delay instead of at once, and given up after lease.MaxStageAttempts
// under one grant.
type StageFailure struct {
	Image imageref.Pinned
	// Grant is the stage grant the attempts ran under; Attempts counts the
	// consecutive failures under it.
	Grant    lease.ID
	Attempts int
	Message  string
	RetryAt  time.Time
	// TimedOut: the stage ran past the grant's stage timeout and was
	// cancelled (amendment 19). Such a grant is not tried again: the
	// coordinator bounds the whole grant by the same timeout (plus a
	// margin), so another attempt under it could not get its full time.
	TimedOut bool
	// Class is fleetv1.ReasonRegistryUnauthorized when the registry
	// refused bootc's credentials, else "".
	Class string
}

// Rejection is a stage bootc refused under the host's container signature
// policy. A policy decision is deterministic, so the agent does not try
// that image again while it runs (docs/design.md, amendment 14).
type Rejection struct {
	Image imageref.Pinned
	// Message is bootc's error line.
	Message string
}

// exhausted: the stage under grant id failed too often to try again.
func (f *StageFailure) exhausted(id lease.ID) bool {
	return f != nil && f.Grant == id && (f.Attempts >= lease.MaxStageAttempts || f.TimedOut)
}

// reason is the reason reported for the failure: StageTimedOut or StageFailed.
func (f *StageFailure) reason() string {
	if f.TimedOut {
		return fleetv1.ReasonStageTimedOut
	}
	return fleetv1.ReasonStageFailed
}

// Verdict is a Degraded result the agent keeps for the rest of a boot (for
// the same desired image) after it cleared the reboot record that led to it.
type Verdict struct {
	Boot    BootIdentity
	Desired imageref.Pinned
	Reason  string
	Message string
}

// of: the verdict was given in boot b (it holds for the rest of that boot).
func (v *Verdict) of(b BootIdentity) bool { return v != nil && v.Boot == b }

// holdsFor: the rejection is of the desired image d (it holds until the
// desired image changes).
func (r *Rejection) holdsFor(d Desired) bool {
	return r != nil && d.Set && d.Invalid == "" && d.Image == r.Image
}

// Heartbeated reports whether the agent's reports list g while it works
// under it, and so keep it alive: every stage grant, and a rollback grant
// from phase Reboot on. The coordinator never expires a reboot grant by
// heartbeats: in phase Drain the agent has nothing to do under one
// (amendment 18), and an update's reboot in phase Reboot needs no heartbeat
// (amendment 37, lease.NeedsHeartbeat).
func Heartbeated(g lease.Grant) bool {
	return g.Kind != lease.KindReboot || (g.Rollback && g.Phase == lease.PhaseReboot)
}

// Unannounced reports whether a is an update's reboot under way: decided
// under a valid grant (rules 1 and 4), or asked for and waiting for the
// host to go down. The agent writes no report for it; one its pace makes
// due says it (amendment 37). The coordinator's rollout-state already says
// Rebooting, and the next thing anyone sees is the node back in a new boot.
func Unannounced(a Action) bool {
	return a.Phase == fleetv1.PhaseRebooting && a.Reason == fleetv1.ReasonRebooting
}

// BootcSupport is what the agent learned in this boot about the installed
// bootc (its version and --help), probed once per boot.
type BootcSupport struct {
	// Known: the probe answered in this boot.
	Known bool
	// Version is the version bootc printed.
	Version string
	// CanStage: bootc can stage an image locked (download-only).
	CanStage bool
	// SoftReboot: bootc can prepare a soft reboot (--soft-reboot).
	SoftReboot bool
	// Problem says why the probe failed (Known false) or why bootc cannot
	// stage (CanStage false).
	Problem string
}

// Observation is everything the decision reads.
type Observation struct {
	Now  time.Time
	Node string

	Desired Desired
	Policy  fleetv1.RebootPolicy
	Status  Status
	// Boot is the current boot identity.
	Boot BootIdentity
	// SoftRebootSupported: systemd exposes SoftRebootsCount (v254+).
	SoftRebootSupported bool
	// Bootc is what the installed bootc supports.
	Bootc BootcSupport

	Record RecordState
	// RebootIssued: this process already asked the host to reboot for the
	// present record; wait for it instead of asking again.
	RebootIssued bool
	// SettleDeadline bounds how long a status that disagrees with the record
	// after a reboot is re-read before the agent gives its verdict.
	SettleDeadline time.Time
	RebootTimeout  time.Duration

	// Grants are every grant held by this node, as parsed from the Leases
	// labelled with its name. Decide checks each with lease.Grant.Allows.
	Grants []HeldGrant
	// Spent are reboot grants already used by a reboot in an earlier boot.
	Spent []lease.ID

	// InFlight is the image of the stage running now, if any.
	InFlight *imageref.Pinned
	// InFlightStarted is when the in-flight stage started (the agent's
	// clock), and InFlightTimeout the stage timeout of the grant it runs
	// under (amendment 19; zero: unbounded).
	InFlightStarted time.Time
	InFlightTimeout time.Duration
	// LastStageFailure is the most recent failed stage, if any.
	LastStageFailure *StageFailure
	// Verdict is a Degraded result kept for this boot, if any.
	Verdict *Verdict

	// RequireSigned is BootcNode spec.requireSignedImages: stage with
	// bootc's signature enforcement, and count a staged deployment as
	// staged only when bootc verified it that way.
	RequireSigned bool
	// Rejected is the last stage the signature policy refused, if any.
	Rejected *Rejection
}

// Kind is the kind of action.
type Kind string

const (
	// Nothing means: report Phase/Reason/Message and wait for the next change.
	Nothing Kind = "Nothing"
	// RereadLater means: the observation is not trustworthy yet; read again soon.
	RereadLater Kind = "RereadLater"
	// Stage means: run bootc switch --download-only Image.
	Stage Kind = "Stage"
	// CancelStage means: stop the in-flight stage.
	CancelStage Kind = "CancelStage"
	// ApplyAndReboot means: (write the record when WriteRecord,) unlock the staged
	// deployment and reboot (soft when Soft) under Grant.
	ApplyAndReboot Kind = "ApplyAndReboot"
	// ClearRecord means: remove the reboot record (marking its grant spent when
	// MarkSpent), then report.
	ClearRecord Kind = "ClearRecord"
	// Rollback means: (write the record when WriteRecord,) run `bootc
	// rollback` and reboot (soft when Soft) into Image, the rollback
	// deployment, under the rollback grant Grant (amendment 25).
	Rollback Kind = "Rollback"
)

// Action is the one thing to do next, with the status to report.
type Action struct {
	Kind    Kind
	Phase   fleetv1.NodePhase
	Reason  string
	Message string

	Image       imageref.Pinned // Stage, ApplyAndReboot, Rollback
	Grant       lease.ID        // Stage, ApplyAndReboot, Rollback: the grant it runs under
	Enforce     bool            // Stage: with bootc's --enforce-container-sigpolicy
	Soft        bool            // ApplyAndReboot, Rollback
	WriteRecord bool            // ApplyAndReboot, Rollback: first use of the grant
	MarkSpent   bool            // ClearRecord: the record's grant was used by a reboot
	// TimedOut (CancelStage): the stage ran past its timeout; the caller
	// counts it as a failed stage that lets go of its grant
	// (StageFailure.TimedOut).
	TimedOut bool
	// Keep asks the caller to keep this Degraded result as a Verdict for the
	// rest of the boot (ClearRecord).
	Keep bool
}

func (a Action) String() string {
	s := string(a.Kind) + " " + string(a.Phase)
	if a.Reason != "" {
		s += "/" + a.Reason
	}
	return s + ": " + a.Message
}
