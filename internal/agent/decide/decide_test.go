package decide

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

const (
	node  = "node-a"
	bootA = "11111111-1111-1111-1111-111111111111"
	bootB = "22222222-2222-2222-2222-222222222222"
)

var (
	t0    = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	imgV1 = pin("quay.io/example/os", "1")
	imgV2 = pin("quay.io/example/os", "2")
	imgV3 = pin("quay.io/example/os", "3")
)

func pin(repo, fill string) imageref.Pinned {
	p, err := imageref.ParsePinned(repo + "@sha256:" + strings.Repeat(fill, 64))
	if err != nil {
		panic(err)
	}
	return p
}

func dep(img imageref.Pinned) *Deployment { return &Deployment{Image: img, DownloadOnly: true} }

func idA() BootIdentity { return BootIdentity{BootID: bootA} }

// base: booted v1 in boot A, v2 desired, nothing staged, no grants.
func base() Observation {
	return Observation{
		Now:            t0,
		Node:           node,
		Desired:        Desired{Image: imgV2, Set: true},
		Policy:         fleetv1.RebootPolicyReboot,
		Status:         Status{ReadIn: idA(), Booted: &Deployment{Image: imgV1}},
		Boot:           idA(),
		RebootTimeout:  15 * time.Minute,
		SettleDeadline: t0.Add(-time.Second),
		Bootc:          BootcSupport{Known: true, Version: "1.16.9", CanStage: true, SoftReboot: true},
	}
}

// heardAt is g with its last accepted heartbeat at (zero: none yet).
func heardAt(g HeldGrant, at time.Time) HeldGrant { g.LastHeartbeat = at; return g }

// holding is o holding exactly gs.
func holding(o Observation, gs ...HeldGrant) Observation { o.Grants = gs; return o }

func grant(kind lease.Kind, img imageref.Pinned, boot string, phase lease.Phase) HeldGrant {
	name := lease.SlotName("pool", kind, 0)
	return HeldGrant{
		Grant: lease.Grant{
			ID:       lease.ID{Lease: name, UID: types.UID("uid-" + string(kind)), Transitions: 3},
			Pool:     "pool",
			Kind:     kind,
			Holder:   node,
			Image:    img,
			BootID:   boot,
			Phase:    phase,
			Acquired: t0.Add(-time.Minute), Renewed: t0.Add(-10 * time.Second),
			Duration: time.Minute, Namespace: lease.Namespace,
		},
		LastHeartbeat: t0.Add(-10 * time.Second),
	}
}

func stageGrant(img imageref.Pinned) HeldGrant { return grant(lease.KindStage, img, bootA, "") }
func rebootGrant(img imageref.Pinned) HeldGrant {
	return grant(lease.KindReboot, img, bootA, lease.PhaseReboot)
}

func withStaged(o Observation, d *Deployment) Observation { o.Status.Staged = d; return o }

func recorded(o Observation, boot BootIdentity, at time.Time) Observation {
	g := rebootGrant(imgV2)
	o.Record = RecordState{Present: true, Grant: g.ID, Image: imgV2, Boot: boot, Recorded: at}
	return o
}

func TestDecide(t *testing.T) {
	inflight := func(p imageref.Pinned) *imageref.Pinned { return &p }
	type want struct {
		kind   Kind
		phase  fleetv1.NodePhase
		reason string
		image  imageref.Pinned
		soft   bool
		record bool
		spent  bool
		keep   bool
	}
	tests := []struct {
		name string
		obs  func() Observation
		want want
	}{
		// Guards.
		{"unreadable record blocks everything and reports RecordUnreadable", func() Observation {
			o := base()
			o.Record.Unreadable = "checksum mismatch"
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseDegraded, reason: fleetv1.ReasonRecordUnreadable}},
		{"unreadable record cancels an in-flight stage", func() Observation {
			o := base()
			o.Record.Unreadable = "torn"
			o.InFlight = inflight(imgV2)
			return o
		}, want{kind: CancelStage, phase: fleetv1.PhaseDegraded, reason: fleetv1.ReasonRecordUnreadable, image: imgV2}},
		{"status that failed is re-read and reported StatusUnavailable", func() Observation {
			o := base()
			o.Status = Status{Unavailable: "exit status 1"}
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}, want{kind: RereadLater, phase: fleetv1.PhaseDegraded, reason: fleetv1.ReasonStatusUnavailable}},
		{"status read in an earlier boot is never acted on (I5)", func() Observation {
			o := base()
			o.Status.ReadIn = BootIdentity{BootID: bootB}
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}, want{kind: RereadLater, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonStaleStatus}},
		{"status read before a soft reboot is never acted on", func() Observation {
			o := withStaged(base(), dep(imgV2))
			o.Boot.SoftRebootCount = 1
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: RereadLater, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonStaleStatus}},
		{"status whose boot changed during the read is never acted on", func() Observation {
			o := base()
			o.Status.ReadIn = BootIdentity{}
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}, want{kind: RereadLater, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonStaleStatus}},

		// Rule 1: record, same boot.
		{"rule 1: record in this boot with the grant still valid reboots again", func() Observation {
			o := recorded(withStaged(base(), &Deployment{Image: imgV2}), idA(), t0.Add(-time.Minute))
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: ApplyAndReboot, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonRebooting, image: imgV2}},
		{"rule 1: record with a soft reboot reissues a soft reboot", func() Observation {
			o := recorded(withStaged(base(), &Deployment{Image: imgV2}), idA(), t0.Add(-time.Minute))
			o.Record.Soft = true
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: ApplyAndReboot, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonRebooting, image: imgV2, soft: true}},
		{"rule 1: reboot already issued by this process is not issued again", func() Observation {
			o := recorded(withStaged(base(), &Deployment{Image: imgV2}), idA(), t0.Add(-time.Minute))
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			o.RebootIssued = true
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonRebooting}},
		{"rule 1: revoked grant drops the record and does nothing disruptive", func() Observation {
			return recorded(withStaged(base(), dep(imgV2)), idA(), t0.Add(-time.Minute))
		}, want{kind: ClearRecord, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 1: grant recreated under the same name (new UID) does not match the record", func() Observation {
			o := recorded(withStaged(base(), dep(imgV2)), idA(), t0.Add(-time.Minute))
			g := rebootGrant(imgV2)
			g.UID = "another-uid"
			o.Grants = []HeldGrant{g}
			return o
		}, want{kind: ClearRecord, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 1: revoked grant after unlock reports UnlockedWithoutGrant", func() Observation {
			return recorded(withStaged(base(), &Deployment{Image: imgV2}), idA(), t0.Add(-time.Minute))
		}, want{kind: ClearRecord, phase: fleetv1.PhaseDegraded, reason: fleetv1.ReasonUnlockedWithoutGrant}},
		{"rule 1: grant back in Draining counts as revoked", func() Observation {
			o := recorded(withStaged(base(), dep(imgV2)), idA(), t0.Add(-time.Minute))
			o.Grants = []HeldGrant{grant(lease.KindReboot, imgV2, bootA, lease.PhaseDraining)}
			return o
		}, want{kind: ClearRecord, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 1: a recorded reboot goes on whatever its grant's last heartbeat (amendment 37)", func() Observation {
			o := recorded(withStaged(base(), dep(imgV2)), idA(), t0.Add(-time.Minute))
			g := rebootGrant(imgV2)
			g.LastHeartbeat = t0.Add(-2 * time.Minute)
			o.Grants = []HeldGrant{g}
			return o
		}, want{kind: ApplyAndReboot, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonRebooting, image: imgV2}},
		{"rule 1: after rebootTimeout without a reboot reports RebootDidNotHappen", func() Observation {
			o := recorded(withStaged(base(), dep(imgV2)), idA(), t0.Add(-16*time.Minute))
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseDegraded, reason: fleetv1.ReasonRebootDidNotHappen}},
		{"rule 1: an in-flight stage is cancelled first", func() Observation {
			o := recorded(withStaged(base(), dep(imgV2)), idA(), t0.Add(-time.Minute))
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			o.InFlight = inflight(imgV3)
			return o
		}, want{kind: CancelStage, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonCancellingStage, image: imgV3}},

		// Rule 2: record, boot changed.
		{"rule 2: booted the recorded image clears the record and marks the grant spent", func() Observation {
			o := recorded(base(), BootIdentity{BootID: bootB}, t0.Add(-time.Minute))
			o.Status.Booted = &Deployment{Image: imgV2}
			return o
		}, want{kind: ClearRecord, phase: fleetv1.PhaseIdle, reason: fleetv1.ReasonRebootCompleted, spent: true}},
		{"rule 2: stale pre-reboot status with grants never stages or reboots before the settle deadline", func() Observation {
			o := recorded(withStaged(base(), dep(imgV2)), BootIdentity{BootID: bootB}, t0.Add(-time.Minute))
			o.SettleDeadline = t0.Add(time.Minute)
			o.Grants = []HeldGrant{stageGrant(imgV2), rebootGrant(imgV2)}
			return o
		}, want{kind: RereadLater, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonStatusSettling}},
		{"rule 2: stale pre-reboot status after the settle deadline is BootedUnexpectedImage", func() Observation {
			o := recorded(withStaged(base(), dep(imgV2)), BootIdentity{BootID: bootB}, t0.Add(-time.Minute))
			o.Grants = []HeldGrant{stageGrant(imgV2), rebootGrant(imgV2)}
			return o
		}, want{kind: ClearRecord, phase: fleetv1.PhaseDegraded, reason: fleetv1.ReasonBootedUnexpectedImage, spent: true, keep: true}},
		{"rule 2: a soft reboot changes the identity without changing the boot ID", func() Observation {
			o := recorded(withStaged(base(), dep(imgV2)), idA(), t0.Add(-time.Minute))
			o.Boot.SoftRebootCount, o.Status.ReadIn.SoftRebootCount = 1, 1
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: ClearRecord, phase: fleetv1.PhaseDegraded, reason: fleetv1.ReasonBootedUnexpectedImage, spent: true, keep: true}},
		{"rule 2: a soft reboot into the recorded image clears the record and marks the grant spent", func() Observation {
			o := recorded(base(), idA(), t0.Add(-time.Minute))
			o.Boot.SoftRebootCount, o.Status.ReadIn.SoftRebootCount = 1, 1
			o.Status.Booted = &Deployment{Image: imgV2}
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: ClearRecord, phase: fleetv1.PhaseIdle, reason: fleetv1.ReasonRebootCompleted, spent: true}},
		{"rule 2: never stages even when the desired image changed meanwhile", func() Observation {
			o := recorded(base(), BootIdentity{BootID: bootB}, t0.Add(-time.Minute))
			o.Desired.Image = imgV3
			o.Grants = []HeldGrant{stageGrant(imgV3)}
			o.SettleDeadline = t0.Add(time.Second)
			return o
		}, want{kind: RereadLater, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonStatusSettling}},

		// Invalid desired image.
		{"invalid desired image is Degraded with no action", func() Observation {
			o := base()
			o.Desired = Desired{Set: true, Invalid: "not pinned"}
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseDegraded, reason: fleetv1.ReasonInvalidDesiredImage}},

		// Rule 3.
		{"rule 3: no desired image is Idle", func() Observation {
			o := base()
			o.Desired = Desired{}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseIdle, reason: fleetv1.ReasonNoDesiredImage}},
		{"rule 3: booted the desired image is Idle", func() Observation {
			o := base()
			o.Desired.Image = imgV1
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseIdle, reason: fleetv1.ReasonUpToDate}},
		{"rule 3: Idle cancels an in-flight stage", func() Observation {
			o := base()
			o.Desired.Image = imgV1
			o.InFlight = inflight(imgV2)
			return o
		}, want{kind: CancelStage, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonCancellingStage, image: imgV2}},
		{"rule 3: same digest from another repository is not the desired image", func() Observation {
			o := base()
			o.Desired.Image = pin("mirror.example/os", "1")
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonWaitingForStageGrant}},

		// Verdict kept for the boot.
		{"a kept verdict stays Degraded and does not stage", func() Observation {
			o := base()
			o.Verdict = &Verdict{Boot: idA(), Desired: imgV2, Reason: fleetv1.ReasonBootedUnexpectedImage, Message: "x"}
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseDegraded, reason: fleetv1.ReasonBootedUnexpectedImage}},
		{"a verdict for another desired image no longer applies", func() Observation {
			o := base()
			o.Verdict = &Verdict{Boot: idA(), Desired: imgV3, Reason: fleetv1.ReasonBootedUnexpectedImage}
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}, want{kind: Stage, phase: fleetv1.PhaseStaging, reason: fleetv1.ReasonStaging, image: imgV2}},

		// Rule 4.
		{"rule 4: staged without a reboot grant is Staged", func() Observation {
			return withStaged(base(), dep(imgV2))
		}, want{kind: Nothing, phase: fleetv1.PhaseStaged, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 4: reboot grant in Draining does not reboot", func() Observation {
			o := withStaged(base(), dep(imgV2))
			o.Grants = []HeldGrant{grant(lease.KindReboot, imgV2, bootA, lease.PhaseDraining)}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseStaged, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 4: valid reboot grant writes the record, applies and reboots", func() Observation {
			o := withStaged(base(), dep(imgV2))
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: ApplyAndReboot, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonRebooting, image: imgV2, record: true}},
		{"rule 4: reboot grant issued in another boot is void", func() Observation {
			o := withStaged(base(), dep(imgV2))
			o.Grants = []HeldGrant{grant(lease.KindReboot, imgV2, bootB, lease.PhaseReboot)}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseStaged, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 4: reboot grant of this boot ID from before a soft reboot is void", func() Observation {
			o := withStaged(base(), dep(imgV2))
			o.Boot.SoftRebootCount, o.Status.ReadIn.SoftRebootCount = 1, 1
			o.Grants = []HeldGrant{rebootGrant(imgV2)} // issued at soft-reboot count 0
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseStaged, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 4: reboot grant issued after a soft reboot is used in that boot", func() Observation {
			o := withStaged(base(), dep(imgV2))
			o.Boot.SoftRebootCount, o.Status.ReadIn.SoftRebootCount = 1, 1
			g := rebootGrant(imgV2)
			g.SoftRebootCount = 1
			o.Grants = []HeldGrant{g}
			return o
		}, want{kind: ApplyAndReboot, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonRebooting, image: imgV2, record: true}},
		{"rule 4: a Draining grant from before a soft reboot is not reported as draining", func() Observation {
			o := withStaged(base(), dep(imgV2))
			o.Boot.SoftRebootCount, o.Status.ReadIn.SoftRebootCount = 2, 2
			g := grant(lease.KindReboot, imgV2, bootA, lease.PhaseDraining)
			g.SoftRebootCount = 1
			o.Grants = []HeldGrant{g}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseStaged, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 4: reboot grant for another image is void", func() Observation {
			o := withStaged(base(), dep(imgV2))
			o.Grants = []HeldGrant{rebootGrant(imgV3)}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseStaged, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 4: reboot grant held by another node is void", func() Observation {
			o := withStaged(base(), dep(imgV2))
			g := rebootGrant(imgV2)
			g.Holder = "node-b"
			o.Grants = []HeldGrant{g}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseStaged, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 4: a stage grant does not allow a reboot", func() Observation {
			o := withStaged(base(), dep(imgV2))
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseStaged, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 4: a reboot grant needs no heartbeat: the coordinator never expires one (amendment 37)", func() Observation {
			o := withStaged(base(), dep(imgV2))
			g := rebootGrant(imgV2)
			g.LastHeartbeat = t0.Add(-time.Hour)
			o.Grants = []HeldGrant{g}
			return o
		}, want{kind: ApplyAndReboot, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonRebooting, image: imgV2, record: true}},
		{"rule 4: reboot grant marked failed is void", func() Observation {
			o := withStaged(base(), dep(imgV2))
			g := rebootGrant(imgV2)
			g.Failure = fleetv1.ReasonRebootTimeout
			o.Grants = []HeldGrant{g}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseStaged, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 4: a spent grant is not spent again in a new boot", func() Observation {
			o := withStaged(base(), dep(imgV2))
			g := rebootGrant(imgV2)
			o.Grants = []HeldGrant{g}
			o.Spent = []lease.ID{g.ID}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseStaged, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 4: soft reboot when the policy, bootc and systemd all allow it", func() Observation {
			o := withStaged(base(), &Deployment{Image: imgV2, DownloadOnly: true, SoftRebootCapable: true})
			o.Policy, o.SoftRebootSupported = fleetv1.RebootPolicyAllowSoftReboot, true
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: ApplyAndReboot, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonRebooting, image: imgV2, soft: true, record: true}},
		{"rule 4: no soft reboot when systemd lacks SoftRebootsCount", func() Observation {
			o := withStaged(base(), &Deployment{Image: imgV2, DownloadOnly: true, SoftRebootCapable: true})
			o.Policy = fleetv1.RebootPolicyAllowSoftReboot
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: ApplyAndReboot, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonRebooting, image: imgV2, record: true}},
		{"rule 4: no soft reboot when the staged deployment is not capable", func() Observation {
			o := withStaged(base(), dep(imgV2))
			o.Policy, o.SoftRebootSupported = fleetv1.RebootPolicyAllowSoftReboot, true
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: ApplyAndReboot, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonRebooting, image: imgV2, record: true}},
		{"rule 4: no soft reboot under policy Reboot", func() Observation {
			o := withStaged(base(), &Deployment{Image: imgV2, DownloadOnly: true, SoftRebootCapable: true})
			o.SoftRebootSupported = true
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: ApplyAndReboot, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonRebooting, image: imgV2, record: true}},
		{"rule 4: unlocked staged deployment without a grant is UnlockedWithoutGrant", func() Observation {
			return withStaged(base(), &Deployment{Image: imgV2})
		}, want{kind: Nothing, phase: fleetv1.PhaseDegraded, reason: fleetv1.ReasonUnlockedWithoutGrant}},
		{"rule 4: stage of the desired image still finishing is waited for", func() Observation {
			o := withStaged(base(), dep(imgV2))
			o.InFlight = inflight(imgV2)
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseStaging, reason: fleetv1.ReasonStaging}},

		// Rule 5.
		{"rule 5: no stage without a grant", func() Observation {
			return base()
		}, want{kind: Nothing, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonWaitingForStageGrant}},
		{"rule 5: valid stage grant stages the desired image", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}, want{kind: Stage, phase: fleetv1.PhaseStaging, reason: fleetv1.ReasonStaging, image: imgV2}},
		{"rule 5: stage grant issued in another boot is void", func() Observation {
			o := base()
			o.Grants = []HeldGrant{grant(lease.KindStage, imgV2, bootB, "")}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonWaitingForStageGrant}},
		{"rule 5: stage grant from before a soft reboot is void", func() Observation {
			o := base()
			o.Boot.SoftRebootCount, o.Status.ReadIn.SoftRebootCount = 1, 1
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonWaitingForStageGrant}},
		{"rule 5: stage grant for another image does not stage", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV3)}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonWaitingForStageGrant}},
		{"rule 5: a reboot grant does not allow a stage", func() Observation {
			o := base()
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonWaitingForStageGrant}},
		{"rule 5: in-flight stage of the desired image continues", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			o.InFlight = inflight(imgV2)
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseStaging, reason: fleetv1.ReasonStaging}},
		{"rule 5: revoked stage grant cancels the stage", func() Observation {
			o := base()
			o.InFlight = inflight(imgV2)
			return o
		}, want{kind: CancelStage, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonCancellingStage, image: imgV2}},
		{"rule 5: image change cancels the stage of the old image first", func() Observation {
			o := base()
			o.Desired.Image = imgV3
			o.Grants = []HeldGrant{stageGrant(imgV3)}
			o.InFlight = inflight(imgV2)
			return o
		}, want{kind: CancelStage, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonCancellingStage, image: imgV2}},
		{"rule 5: staged other image plus stage grant stages the desired one", func() Observation {
			o := withStaged(base(), dep(imgV3))
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}, want{kind: Stage, phase: fleetv1.PhaseStaging, reason: fleetv1.ReasonStaging, image: imgV2}},
		{"rule 5: a failed stage waits until its retry time", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			o.LastStageFailure = &StageFailure{Image: imgV2, Grant: stageGrant(imgV2).ID, Attempts: 1, Message: "pull failed", RetryAt: t0.Add(time.Minute)}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseDegraded, reason: fleetv1.ReasonStageFailed}},
		{"rule 5: a failed stage is retried after its retry time", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			o.LastStageFailure = &StageFailure{Image: imgV2, Grant: stageGrant(imgV2).ID, Attempts: lease.MaxStageAttempts - 1, Message: "pull failed", RetryAt: t0}
			return o
		}, want{kind: Stage, phase: fleetv1.PhaseStaging, reason: fleetv1.ReasonStaging, image: imgV2}},
		{"rule 5: after MaxStageAttempts failures under one grant the agent stops trying it", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			o.LastStageFailure = &StageFailure{Image: imgV2, Grant: stageGrant(imgV2).ID, Attempts: lease.MaxStageAttempts, Message: "pull failed", RetryAt: t0}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonStageFailed}},
		{"rule 5: a new stage grant starts with fresh attempts and no delay", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			old := stageGrant(imgV2).ID
			old.Transitions--
			o.LastStageFailure = &StageFailure{Image: imgV2, Grant: old, Attempts: lease.MaxStageAttempts, Message: "pull failed", RetryAt: t0.Add(time.Hour)}
			return o
		}, want{kind: Stage, phase: fleetv1.PhaseStaging, reason: fleetv1.ReasonStaging, image: imgV2}},
		{"rule 5: without a grant, a node whose stage failed says so (the coordinator queues it last)", func() Observation {
			o := base()
			o.LastStageFailure = &StageFailure{Image: imgV2, Grant: stageGrant(imgV2).ID, Attempts: lease.MaxStageAttempts, Message: "pull failed", RetryAt: t0}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonStageFailed}},
		{"rule 5: a failure of another image is forgotten", func() Observation {
			o := base()
			o.LastStageFailure = &StageFailure{Image: imgV1, Grant: stageGrant(imgV1).ID, Attempts: lease.MaxStageAttempts, Message: "pull failed", RetryAt: t0}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonWaitingForStageGrant}},
		{"rule 5: with a grant, a bootc not probed yet is probed before staging", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			o.Bootc = BootcSupport{Problem: "bootc probe failed: exit status 1"}
			return o
		}, want{kind: RereadLater, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonProbingBootc}},
		{"rule 5: a bootc that cannot stage locked makes the node Degraded and runs nothing", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			o.Bootc = BootcSupport{Known: true, Version: "1.11.0", Problem: "bootc 1.11.0 has no `upgrade --download-only`"}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseDegraded, reason: fleetv1.ReasonBootcUnsupported}},
		{"rule 4: an unlocked staged desired image under a stage grant is locked (a stage cut between switch and lock)", func() Observation {
			o := base()
			o.Status.Staged = &Deployment{Image: imgV2}
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}, want{kind: Stage, phase: fleetv1.PhaseStaging, reason: fleetv1.ReasonLockingStagedImage, image: imgV2}},
		{"rule 4: an unlocked staged desired image without any grant is reported, not locked", func() Observation {
			o := base()
			o.Status.Staged = &Deployment{Image: imgV2}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseDegraded, reason: fleetv1.ReasonUnlockedWithoutGrant}},
		{"rule 4: a bootc without --soft-reboot reboots fully under AllowSoftReboot", func() Observation {
			o := base()
			o.Policy = fleetv1.RebootPolicyAllowSoftReboot
			o.SoftRebootSupported = true
			o.Bootc.SoftReboot = false
			o.Status.Staged = &Deployment{Image: imgV2, DownloadOnly: true, SoftRebootCapable: true}
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}, want{kind: ApplyAndReboot, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonRebooting, image: imgV2, record: true}},
		{"rule 5: a stage grant without an accepted heartbeat is not used yet, but reported as the stage it starts", func() Observation {
			return holding(base(), heardAt(stageGrant(imgV2), time.Time{}))
		}, want{kind: Nothing, phase: fleetv1.PhaseStaging, reason: fleetv1.ReasonStaging}},
		{"rule 5: a stage grant whose heartbeats lapsed waits, not staging", func() Observation {
			return holding(base(), heardAt(stageGrant(imgV2), t0.Add(-2*time.Minute)))
		}, want{kind: Nothing, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonWaitingForStageGrant}},
		{"rule 5: a new stage grant for another boot is not reported as staging", func() Observation {
			return holding(base(), heardAt(grant(lease.KindStage, imgV2, bootB, ""), time.Time{}))
		}, want{kind: Nothing, phase: fleetv1.PhaseWaiting, reason: fleetv1.ReasonWaitingForStageGrant}},
		{"rule 4: a reboot grant in phase Reboot seen for the first time is used at once (amendment 37)", func() Observation {
			return holding(withStaged(base(), dep(imgV2)), heardAt(rebootGrant(imgV2), time.Time{}))
		}, want{kind: ApplyAndReboot, phase: fleetv1.PhaseRebooting, reason: fleetv1.ReasonRebooting, image: imgV2, record: true}},
		{"rule 4: a new reboot grant in phase Draining changes nothing", func() Observation {
			return holding(withStaged(base(), dep(imgV2)), heardAt(grant(lease.KindReboot, imgV2, bootA, lease.PhaseDraining), time.Time{}))
		}, want{kind: Nothing, phase: fleetv1.PhaseStaged, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 4: a new reboot grant for another boot is not reported as rebooting", func() Observation {
			return holding(withStaged(base(), dep(imgV2)), heardAt(grant(lease.KindReboot, imgV2, bootB, lease.PhaseReboot), time.Time{}))
		}, want{kind: Nothing, phase: fleetv1.PhaseStaged, reason: fleetv1.ReasonWaitingForRebootGrant}},
		{"rule 4: a new reboot grant a reboot already spent is not reported as rebooting", func() Observation {
			o := holding(withStaged(base(), dep(imgV2)), heardAt(rebootGrant(imgV2), time.Time{}))
			o.Spent = []lease.ID{o.Grants[0].ID}
			return o
		}, want{kind: Nothing, phase: fleetv1.PhaseStaged, reason: fleetv1.ReasonWaitingForRebootGrant}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(tc.obs())
			w := tc.want
			if got.Kind != w.kind || got.Phase != w.phase || got.Reason != w.reason || got.Image != w.image ||
				got.Soft != w.soft || got.WriteRecord != w.record || got.MarkSpent != w.spent || got.Keep != w.keep {
				t.Fatalf("Decide = %+v\nwant %+v", got, w)
			}
			if got.Message == "" {
				t.Fatalf("action without a message: %+v", got)
			}
		})
	}
}

func TestSoftAfterUnlock(t *testing.T) {
	soft := Action{Kind: ApplyAndReboot, Soft: true, Image: imgV2}
	capable := &Deployment{Image: imgV2, SoftRebootCapable: true}
	tests := []struct {
		name   string
		a      Action
		staged *Deployment
		want   bool
	}{
		{"soft when bootc still says capable after unlocking (it prepared /run/nextroot)", soft, capable, true},
		{"full when the decision was a full reboot", Action{Kind: ApplyAndReboot, Image: imgV2}, capable, false},
		{"full when bootc no longer says capable (auto prepared nothing)", soft, &Deployment{Image: imgV2}, false},
		{"full when the staged deployment is still locked", soft, &Deployment{Image: imgV2, DownloadOnly: true, SoftRebootCapable: true}, false},
		{"full when nothing is staged", soft, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, why := SoftAfterUnlock(tc.a, tc.staged)
			if got != tc.want || why == "" {
				t.Fatalf("SoftAfterUnlock = %v (%q), want %v", got, why, tc.want)
			}
		})
	}
}

func TestShortDigestInMessages(t *testing.T) {
	got := short(imgV2)
	if got != "quay.io/example/os@sha256:222222222222…" {
		t.Fatalf("short = %q", got)
	}
}

// A new grant is reported as the step it starts, with the very message that
// step reports once the grant is usable, so the step writes nothing more
// (amendments 17 and 18). Likewise a reboot grant in phase Draining leaves
// the report as it was without one.
func TestNewGrantReportIsTheStepsReport(t *testing.T) {
	pairs := []struct {
		name        string
		before, now Observation
	}{
		{"stage", holding(base(), heardAt(stageGrant(imgV2), time.Time{})), holding(base(), stageGrant(imgV2))},
		{"reboot", holding(withStaged(base(), dep(imgV2)), heardAt(rebootGrant(imgV2), time.Time{})), holding(withStaged(base(), dep(imgV2)), rebootGrant(imgV2))},
		{"drain", holding(withStaged(base(), dep(imgV2)), grant(lease.KindReboot, imgV2, bootA, lease.PhaseDraining)), withStaged(base(), dep(imgV2))},
	}
	for _, p := range pairs {
		b, n := Decide(p.before), Decide(p.now)
		if b.Phase != n.Phase || b.Reason != n.Reason || b.Message != n.Message {
			t.Errorf("%s: reported %s/%s %q, then %s/%s %q", p.name, b.Phase, b.Reason, b.Message, n.Phase, n.Reason, n.Message)
		}
	}
}
