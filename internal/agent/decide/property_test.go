package decide

import (
	"flag"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// genObservation draws observations from a small universe (two boots, three
// images, two nodes) so that matching and mismatching fields both occur often.
func genObservation(t *rapid.T) Observation {
	images := []imageref.Pinned{imgV1, imgV2, imgV3}
	boots := []string{bootA, bootB}
	img := func(label string) imageref.Pinned { return rapid.SampledFrom(images).Draw(t, label) }
	ident := func(label string) BootIdentity {
		return BootIdentity{
			BootID:          rapid.SampledFrom(append([]string{""}, boots...)).Draw(t, label+".boot"),
			SoftRebootCount: rapid.Uint32Range(0, 1).Draw(t, label+".soft"),
		}
	}
	deployment := func(label string) *Deployment {
		if rapid.Bool().Draw(t, label+".nil") {
			return nil
		}
		return &Deployment{
			Image:             img(label + ".image"),
			DownloadOnly:      rapid.Bool().Draw(t, label+".downloadOnly"),
			SoftRebootCapable: rapid.Bool().Draw(t, label+".soft"),
		}
	}
	now := t0.Add(time.Duration(rapid.IntRange(-1000, 1000).Draw(t, "now")) * time.Second)
	o := Observation{
		Now:                 now,
		Node:                node,
		Policy:              rapid.SampledFrom([]fleetv1.RebootPolicy{fleetv1.RebootPolicyReboot, fleetv1.RebootPolicyAllowSoftReboot}).Draw(t, "policy"),
		Boot:                BootIdentity{BootID: rapid.SampledFrom(boots).Draw(t, "current.boot"), SoftRebootCount: rapid.Uint32Range(0, 1).Draw(t, "current.soft")},
		SoftRebootSupported: rapid.Bool().Draw(t, "softSupported"),
		RebootIssued:        rapid.Bool().Draw(t, "rebootIssued"),
		SettleDeadline:      t0.Add(time.Duration(rapid.IntRange(-600, 600).Draw(t, "settle")) * time.Second),
		RebootTimeout:       time.Duration(rapid.IntRange(1, 1200).Draw(t, "rebootTimeout")) * time.Second,
		Bootc: BootcSupport{Known: rapid.IntRange(0, 9).Draw(t, "bootc.unknown") != 0, CanStage: rapid.IntRange(0, 9).Draw(t, "bootc.cannotStage") != 0,
			SoftReboot: rapid.Bool().Draw(t, "bootc.softReboot"), Version: "1.16.9"},
	}
	switch rapid.IntRange(0, 9).Draw(t, "desiredKind") {
	case 0:
	case 1:
		o.Desired = Desired{Set: true, Invalid: "bad"}
	default:
		o.Desired = Desired{Set: true, Image: img("desired")}
	}
	if rapid.IntRange(0, 9).Draw(t, "statusFails") == 0 {
		o.Status.Unavailable = "failed"
	} else {
		o.Status.ReadIn = ident("status")
		if rapid.IntRange(0, 4).Draw(t, "statusFresh") > 0 {
			o.Status.ReadIn = o.Boot
		}
		o.Status.Booted = deployment("booted")
		o.Status.Staged = deployment("staged")
	}
	switch rapid.IntRange(0, 9).Draw(t, "recordKind") {
	case 1:
		o.Record.Unreadable = "corrupt"
	case 2, 3, 4:
		o.Record = RecordState{
			Present:  true,
			Grant:    lease.ID{Lease: lease.SlotName("pool", lease.KindReboot, 0), UID: uid("uid", rapid.IntRange(0, 1).Draw(t, "record.uid")), Transitions: int32(rapid.IntRange(1, 2).Draw(t, "record.tr"))},
			Image:    img("record.image"),
			Boot:     ident("record.boot"),
			Recorded: t0.Add(-time.Duration(rapid.IntRange(0, 1200).Draw(t, "record.age")) * time.Second),
			Soft:     rapid.Bool().Draw(t, "record.soft"),
		}
		if rapid.Bool().Draw(t, "record.sameBoot") {
			o.Record.Boot = o.Boot
		}
	}
	// Grants are mostly right for this node, image and boot, with each field
	// wrong now and then, so that valid and almost-valid grants both occur.
	likely := func(label string) bool { return rapid.IntRange(0, 4).Draw(t, label) > 0 }
	target := img("target")
	if o.Desired.Set && o.Desired.Invalid == "" && likely("target.desired") {
		target = o.Desired.Image
	}
	for i := range rapid.IntRange(0, 3).Draw(t, "grants") {
		kind := rapid.SampledFrom([]lease.Kind{lease.KindStage, lease.KindReboot}).Draw(t, "g.kind")
		var phase lease.Phase
		if kind == lease.KindReboot {
			phase = lease.PhaseReboot
			if !likely("g.phaseReboot") {
				phase = lease.PhaseDraining
			}
		}
		g := HeldGrant{Grant: lease.Grant{
			ID:     lease.ID{Lease: lease.SlotName("pool", kind, i%2), UID: uid("uid", rapid.IntRange(0, 1).Draw(t, "g.uid")), Transitions: int32(rapid.IntRange(1, 2).Draw(t, "g.tr"))},
			Pool:   "pool",
			Kind:   kind,
			Holder: node,
			Image:  target,
			BootID: o.Boot.BootID,
			// The boot's soft-reboot count, wrong now and then.
			SoftRebootCount: o.Boot.SoftRebootCount,
			Phase:           phase,
			Renewed:         now,
			Duration:        time.Duration(rapid.IntRange(1, 120).Draw(t, "g.duration")) * time.Second,
		}}
		if !likely("g.holderOK") {
			g.Holder = "node-b"
		}
		if !likely("g.imageOK") {
			g.Image = img("g.image")
		}
		if !likely("g.bootOK") {
			g.BootID = rapid.SampledFrom(boots).Draw(t, "g.boot")
		}
		if !likely("g.softOK") {
			g.SoftRebootCount = rapid.Uint32Range(0, 1).Draw(t, "g.soft")
		}
		if !likely("g.notFailed") {
			g.Failure = fleetv1.ReasonRebootTimeout
		}
		if likely("g.renewed") {
			g.LastHeartbeat = now.Add(-time.Duration(rapid.IntRange(-90, 150).Draw(t, "g.renewAge")) * time.Second)
		}
		o.Grants = append(o.Grants, g)
		if !likely("g.notSpent") {
			o.Spent = append(o.Spent, g.ID)
		}
	}
	if o.Status.Staged != nil && rapid.Bool().Draw(t, "staged.target") {
		o.Status.Staged.Image = target
	}
	if rapid.IntRange(0, 5).Draw(t, "inflight") == 0 {
		p := img("inflight")
		o.InFlight = &p
		// Amendment 19: the stage's start and its grant's timeout.
		o.InFlightTimeout = time.Duration(rapid.IntRange(0, 3).Draw(t, "inflight.timeoutMin")) * time.Minute
		o.InFlightStarted = t0.Add(-time.Duration(rapid.IntRange(0, 300).Draw(t, "inflight.ageSec")) * time.Second)
	}

	if rapid.IntRange(0, 4).Draw(t, "verdict") == 0 {
		o.Verdict = &Verdict{Boot: ident("verdict.boot"), Desired: img("verdict.desired"), Reason: fleetv1.ReasonBootedUnexpectedImage, Message: "v"}
	}
	if rapid.Bool().Draw(t, "stageFailure") {
		o.LastStageFailure = &StageFailure{Image: img("sf.image"), Message: "x", RetryAt: t0.Add(time.Duration(rapid.IntRange(-60, 60).Draw(t, "sf.retry")) * time.Second),
			TimedOut: rapid.IntRange(0, 3).Draw(t, "sf.timedOut") == 0}
	}
	return o
}

func uid(prefix string, i int) types.UID { return types.UID(prefix + string(rune('a'+i))) }

func allows(o Observation, g HeldGrant, act lease.Action, img imageref.Pinned) bool {
	return g.Allows(lease.Check{Node: o.Node, Action: act, Image: img.String(), BootID: o.Boot.BootID,
		SoftRebootCount: o.Boot.SoftRebootCount, Now: o.Now, LastHeartbeat: g.LastHeartbeat}) == nil
}

func isSpent(o Observation, id lease.ID) bool {
	for _, s := range o.Spent {
		if s == id {
			return true
		}
	}
	return false
}

// TestMain raises rapid's default number of checks: the decision is cheap
// and the gated actions need many draws to come up often.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("rapid.checks"); f != nil && f.Value.String() == f.DefValue {
		_ = f.Value.Set("5000")
	}
	os.Exit(m.Run())
}

// TestDecideNeverActsWithoutGrantOrOnStaleStatus checks the gating invariants
// on random observations (rapid prints the failing seed and draws).
func TestDecideNeverActsWithoutGrantOrOnStaleStatus(t *testing.T) {
	kinds := map[Kind]int{}
	defer func() { t.Logf("actions drawn: %v", kinds) }()
	rapid.Check(t, func(t *rapid.T) {
		o := genObservation(t)
		a := Decide(o)
		kinds[a.Kind]++
		if a.Phase == "" || a.Message == "" {
			t.Fatalf("action without phase or message: %+v", a)
		}
		disruptive := a.Kind == Stage || a.Kind == ApplyAndReboot || a.Kind == ClearRecord
		fresh := o.Status.Unavailable == "" && o.Boot.Known() && o.Status.ReadIn == o.Boot
		if disruptive && !fresh {
			t.Fatalf("%s on a status read in %s while the boot is %s", a.Kind, o.Status.ReadIn, o.Boot)
		}
		if disruptive && o.Record.Unreadable != "" {
			t.Fatalf("%s with an unreadable record", a.Kind)
		}
		if a.Kind == Stage && (!o.Bootc.Known || !o.Bootc.CanStage) {
			t.Fatalf("staged on a bootc that cannot stage locked (%+v): %s", o.Bootc, a)
		}
		if a.Kind == ApplyAndReboot && a.Soft && !o.Bootc.SoftReboot && o.Record.Boot != o.Boot {
			t.Fatalf("soft reboot on a bootc without --soft-reboot: %s", a)
		}
		if (a.Kind == Stage || a.Kind == ApplyAndReboot) && o.Record.Present && o.Record.Boot != o.Boot {
			t.Fatalf("%s with a record from boot %s in boot %s", a.Kind, o.Record.Boot, o.Boot)
		}
		switch a.Kind {
		case Stage:
			if o.InFlight != nil {
				t.Fatalf("stage while another stage is in flight")
			}
			if !o.Desired.Set || o.Desired.Invalid != "" || a.Image != o.Desired.Image {
				t.Fatalf("stage of %s, desired %+v", a.Image, o.Desired)
			}
			ok := false
			for _, g := range o.Grants {
				ok = ok || (g.Kind == lease.KindStage && g.BootID == o.Boot.BootID && g.SoftRebootCount == o.Boot.SoftRebootCount &&
					allows(o, g, lease.ActionStage, a.Image))
			}
			if !ok {
				t.Fatalf("stage of %s without a valid stage grant in boot %s", a.Image, o.Boot)
			}
		case ApplyAndReboot:
			if o.Status.Staged == nil || o.Status.Staged.Image != a.Image {
				t.Fatalf("reboot into %s but staged is %+v", a.Image, o.Status.Staged)
			}
			ok := false
			for _, g := range o.Grants {
				if g.ID == a.Grant && g.Kind == lease.KindReboot && g.Phase == lease.PhaseReboot && g.BootID == o.Boot.BootID &&
					g.SoftRebootCount == o.Boot.SoftRebootCount && !isSpent(o, g.ID) && allows(o, g, lease.ActionReboot, a.Image) {
					ok = true
				}
			}
			if !ok {
				t.Fatalf("reboot into %s under %s without a valid unspent reboot grant in boot %s", a.Image, a.Grant, o.Boot)
			}
			if a.Soft && !o.SoftRebootSupported && (!o.Record.Present || !o.Record.Soft) {
				t.Fatalf("soft reboot although systemd does not support it")
			}
			if o.Record.Present && o.RebootIssued {
				t.Fatalf("reboot issued twice by one process for one record")
			}
		case CancelStage:
			if o.InFlight == nil || a.Image != *o.InFlight {
				t.Fatalf("cancel of %s, in flight %v", a.Image, o.InFlight)
			}
		}
		// A stage that ran past its timeout is always cancelled (the record
		// guard cancels it too, as Degraded), and only such a stage is
		// cancelled as timed out.
		overdue := o.InFlight != nil && o.InFlightTimeout > 0 && !o.Now.Before(o.InFlightStarted.Add(o.InFlightTimeout))
		if overdue && a.Kind != CancelStage {
			t.Fatalf("stage in flight since %s past its %s timeout, but %s", o.InFlightStarted, o.InFlightTimeout, a)
		}
		if a.TimedOut != (overdue && o.Record.Unreadable == "") {
			t.Fatalf("TimedOut = %v, overdue %v: %s", a.TimedOut, overdue, a)
		}
	})
}
