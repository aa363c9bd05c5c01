package decide

import (
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

func TestClaims(t *testing.T) {
	stage, reboot := stageGrant(imgV2), rebootGrant(imgV2)
	reboot.ID.Lease = lease.SlotName("pool", lease.KindReboot, 0)
	exhausted := &StageFailure{Image: imgV2, Grant: stage.ID, Attempts: lease.MaxStageAttempts, RetryAt: t0}
	tests := []struct {
		name string
		obs  func() Observation
		act  Action
		want map[string]string // lease -> Released ("" in use); absent: not listed
	}{
		{"a held stage grant for the desired image is listed in use", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stage}
			return o
		}, Action{Phase: fleetv1.PhaseStaging}, map[string]string{stage.Lease: ""}},
		{"a grant without a heartbeat yet is listed, so it gets one", func() Observation {
			o := base()
			g := stage
			g.LastHeartbeat = time.Time{}
			o.Grants = []HeldGrant{g}
			return o
		}, Action{Phase: fleetv1.PhaseWaiting}, map[string]string{stage.Lease: ""}},
		{"a stage grant is released after MaxStageAttempts failures under it", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stage}
			o.LastStageFailure = exhausted
			return o
		}, Action{Phase: fleetv1.PhaseWaiting, Reason: fleetv1.ReasonStageFailed}, map[string]string{stage.Lease: fleetv1.ReasonStageFailed}},
		{"a stage failure still being retried keeps the grant", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stage}
			o.LastStageFailure = &StageFailure{Image: imgV2, Grant: stage.ID, Attempts: 1, RetryAt: t0.Add(time.Minute)}
			return o
		}, Action{Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonStageFailed}, map[string]string{stage.Lease: ""}},
		{"any other Degraded verdict releases a stage grant", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stage}
			return o
		}, Action{Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonUnlockedWithoutGrant}, map[string]string{stage.Lease: fleetv1.ReasonUnlockedWithoutGrant}},
		{"a failed bootc status read keeps a stage grant", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stage}
			return o
		}, Action{Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonStatusUnavailable}, map[string]string{stage.Lease: ""}},
		{"a reboot grant in phase Draining is not listed: nothing is done under it yet", func() Observation {
			o := withStaged(base(), &Deployment{Image: imgV2, DownloadOnly: true})
			g := reboot
			g.Phase = lease.PhaseDraining
			o.Grants = []HeldGrant{stage, g}
			return o
		}, Action{Phase: fleetv1.PhaseStaged}, map[string]string{}},
		{"a stage grant whose image is staged locked is finished and not listed (amendment 31)", func() Observation {
			o := withStaged(base(), &Deployment{Image: imgV2, DownloadOnly: true})
			o.Grants = []HeldGrant{stage}
			return o
		}, Action{Phase: fleetv1.PhaseStaged}, map[string]string{}},
		{"a stage grant is listed while its stage runs, though bootc shows the image staged locked", func() Observation {
			o := withStaged(base(), &Deployment{Image: imgV2, DownloadOnly: true})
			o.Grants = []HeldGrant{stage}
			img := imgV2
			o.InFlight = &img
			return o
		}, Action{Phase: fleetv1.PhaseStaging}, map[string]string{stage.Lease: ""}},
		{"a stage grant whose image is staged unlocked is listed: the agent locks it under it", func() Observation {
			o := withStaged(base(), &Deployment{Image: imgV2})
			o.Grants = []HeldGrant{stage}
			return o
		}, Action{Phase: fleetv1.PhaseStaging}, map[string]string{stage.Lease: ""}},
		{"a finished stage grant whose locked stage is gone is listed again", func() Observation {
			o := withStaged(base(), &Deployment{Image: imgV1, DownloadOnly: true})
			o.Grants = []HeldGrant{stage}
			return o
		}, Action{Phase: fleetv1.PhaseStaging}, map[string]string{stage.Lease: ""}},
		{"a stage grant staged unverified while signed images are required is listed", func() Observation {
			o := withStaged(base(), &Deployment{Image: imgV2, DownloadOnly: true, Signature: fleetv1.SignatureInsecure})
			o.RequireSigned = true
			o.Grants = []HeldGrant{stage}
			return o
		}, Action{Phase: fleetv1.PhaseStaging}, map[string]string{stage.Lease: ""}},
		{"an update's reboot grant of this boot is not listed: it needs no heartbeat (amendment 37)", func() Observation {
			o := withStaged(base(), &Deployment{Image: imgV2, DownloadOnly: true})
			o.Grants = []HeldGrant{reboot}
			return o
		}, Action{Phase: fleetv1.PhaseRebooting, Reason: fleetv1.ReasonRebooting}, map[string]string{}},
		{"a rollback grant is never released by the agent, even Degraded", func() Observation {
			o := withStaged(base(), &Deployment{Image: imgV2, DownloadOnly: true})
			g := reboot
			g.Rollback = true
			o.Grants = []HeldGrant{g}
			return o
		}, Action{Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonRebootDidNotHappen}, map[string]string{reboot.Lease: ""}},
		{"the reboot grant of the last boot that the record names is not listed (the coordinator verifies it)", func() Observation {
			g := grant(lease.KindReboot, imgV2, bootB, lease.PhaseReboot)
			o := base()
			o.Record = RecordState{Present: true, Grant: g.ID, Image: imgV2, Boot: BootIdentity{BootID: bootB}, Recorded: t0.Add(-time.Minute)}
			o.Grants = []HeldGrant{g}
			return o
		}, Action{Phase: fleetv1.PhaseIdle}, map[string]string{}},
		{"a reboot grant of the last boot a reboot spent is not listed", func() Observation {
			g := grant(lease.KindReboot, imgV2, bootB, lease.PhaseReboot)
			o := base()
			o.Spent = []lease.ID{g.ID}
			o.Grants = []HeldGrant{g}
			return o
		}, Action{Phase: fleetv1.PhaseIdle}, map[string]string{}},
		{"a reboot grant of the last boot the agent never used is listed as unused", func() Observation {
			g := grant(lease.KindReboot, imgV2, bootB, lease.PhaseReboot)
			o := base()
			o.Grants = []HeldGrant{g}
			return o
		}, Action{Phase: fleetv1.PhaseWaiting}, map[string]string{reboot.Lease: fleetv1.ReasonRebootGrantUnused}},
		{"with an unreadable record nothing is said about a reboot grant of the last boot", func() Observation {
			g := grant(lease.KindReboot, imgV2, bootB, lease.PhaseReboot)
			o := base()
			o.Record = RecordState{Unreadable: "torn"}
			o.Grants = []HeldGrant{g}
			return o
		}, Action{Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonRecordUnreadable}, map[string]string{}},
		{"a spent reboot grant is not listed", func() Observation {
			o := base()
			o.Grants = []HeldGrant{reboot}
			o.Spent = []lease.ID{reboot.ID}
			return o
		}, Action{Phase: fleetv1.PhaseStaged}, map[string]string{}},
		{"a stage grant of another boot is void and not listed: the coordinator hands it on (amendment 31)", func() Observation {
			o := base()
			o.Grants = []HeldGrant{grant(lease.KindStage, imgV2, bootB, "")}
			return o
		}, Action{Phase: fleetv1.PhaseWaiting}, map[string]string{}},
		{"a stage grant from before a soft reboot is void and not listed", func() Observation {
			o := base()
			o.Boot.SoftRebootCount, o.Status.ReadIn.SoftRebootCount = 1, 1
			o.Grants = []HeldGrant{stage}
			return o
		}, Action{Phase: fleetv1.PhaseWaiting}, map[string]string{}},
		{"the reboot grant a soft reboot was issued under is not listed after it", func() Observation {
			o := recorded(base(), idA(), t0.Add(-time.Minute))
			o.Boot.SoftRebootCount, o.Status.ReadIn.SoftRebootCount = 1, 1
			o.Grants = []HeldGrant{reboot}
			return o
		}, Action{Phase: fleetv1.PhaseRebooting, Reason: fleetv1.ReasonStatusSettling}, map[string]string{}},
		{"a grant for an image no longer desired is not listed", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV1)}
			return o
		}, Action{Phase: fleetv1.PhaseWaiting}, map[string]string{}},
		{"a grant the coordinator marked failed is not listed", func() Observation {
			o := base()
			g := reboot
			g.Failure = fleetv1.ReasonRebootTimeout
			o.Grants = []HeldGrant{g}
			return o
		}, Action{Phase: fleetv1.PhaseStaged}, map[string]string{}},
		{"another node's grant is not listed", func() Observation {
			o := base()
			g := stage
			g.Holder = "node-b"
			o.Grants = []HeldGrant{g}
			return o
		}, Action{Phase: fleetv1.PhaseWaiting}, map[string]string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]string{}
			for _, c := range Claims(tc.obs(), tc.act) {
				got[c.ID.Lease] = c.Released
			}
			if len(got) != len(tc.want) {
				t.Fatalf("Claims = %v, want %v", got, tc.want)
			}
			for l, r := range tc.want {
				if g, ok := got[l]; !ok || g != r {
					t.Fatalf("Claims = %v, want %v", got, tc.want)
				}
			}
		})
	}
}
