package lease

import (
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
)

// FuzzParse feeds hostile names, labels and annotations to Parse. It must
// never panic, and whatever it accepts must satisfy every rule of the
// protocol: an invalid lease never reads as a valid grant.
func FuzzParse(f *testing.F) {
	f.Add("workers-reboot-0", "workers", "reboot", "node-a", "node-a", img, boot1, "Reboot", "", "", int32(60), int32(1))
	f.Add("workers-stage-3", "workers", "stage", "node-a", "node-a", img, boot1, "", "", "3", int32(30), int32(7))
	f.Add("w-reboot-1", "w", "reboot", "n", "n", img+"\n", boot1, "Draining", "RebootTimeout", "01", int32(0), int32(-1))
	f.Add("a-stage-b-reboot-1", "a-stage-b", "reboot", "x", "x", "q.io/os:1", "", "Reboot", "", "-1", int32(1), int32(1))
	f.Add("workers-reboot-0", "workers", "reboot", "node-a", "node-a", img, boot1, "Reboot", "", "4294967296", int32(60), int32(1))
	f.Fuzz(func(t *testing.T, name, poolLabel, slotLabel, holder, holderLabel, image, bootID, phase, failure, softCount string, dur, transitions int32) {
		l := heldLease(KindStage, "")
		l.Name = name
		l.Labels = map[string]string{LabelPool: poolLabel, LabelSlot: slotLabel, LabelHolder: holderLabel}
		l.Annotations = map[string]string{AnnotationImage: image, AnnotationBootID: bootID, AnnotationPhase: phase, AnnotationFailure: failure}
		if softCount != "" { // "" stands for an absent annotation
			l.Annotations[AnnotationSoftRebootCount] = softCount
		}
		l.Spec.HolderIdentity = ptr.To(holder)
		l.Spec.LeaseDurationSeconds = ptr.To(dur)
		l.Spec.LeaseTransitions = ptr.To(transitions)
		l.Spec.RenewTime = &metav1.MicroTime{Time: t0}

		g, err := Parse(l)
		if err != nil {
			if !errors.Is(err, ErrFree) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse error %v wraps neither ErrFree nor ErrMalformed", err)
			}
			if errors.Is(err, ErrFree) && holder != "" {
				t.Fatalf("held lease (holder %q) read as free", holder)
			}
			return
		}
		// Accepted: every field must be protocol-valid.
		if _, perr := imageref.ParsePinned(g.Image.String()); perr != nil || g.Image.String() != image {
			t.Fatalf("accepted image %q", image)
		}
		if !ValidBootID(g.BootID) || g.Holder != holder || holder == "" || holderLabel != holder {
			t.Fatalf("accepted grant %+v", g)
		}
		if SlotName(g.Pool, g.Kind, mustIndex(t, name)) != name || poolLabel != g.Pool || slotLabel != string(g.Kind) {
			t.Fatalf("accepted name %q as pool %q kind %q", name, g.Pool, g.Kind)
		}
		if (g.Kind == KindStage) != (g.Phase == "") || dur <= 0 || transitions < 1 {
			t.Fatalf("accepted kind %q phase %q dur %d transitions %d", g.Kind, g.Phase, dur, transitions)
		}
		// The count has one spelling: what was accepted reads back as written.
		if (softCount == "" && g.SoftRebootCount != 0) || (softCount != "" && FormatSoftRebootCount(g.SoftRebootCount) != softCount) {
			t.Fatalf("accepted soft-reboot count %q as %d", softCount, g.SoftRebootCount)
		}
		// The grant allows a reboot only for exactly its own node, image and boot.
		c := Check{Node: holder, Action: ActionReboot, Image: image, BootID: bootID, SoftRebootCount: g.SoftRebootCount, Now: t0, LastHeartbeat: t0}
		if err := g.Allows(c); err == nil && (g.Kind != KindReboot || g.Phase != PhaseReboot || g.Failure != "") {
			t.Fatalf("reboot allowed by %+v", g)
		}
		c.BootID = boot2
		if g.BootID != boot2 && g.Allows(c) == nil {
			t.Fatalf("grant of boot %s allowed in boot %s", g.BootID, boot2)
		}
		// Same boot ID after a soft reboot: another boot.
		c.BootID, c.SoftRebootCount = bootID, g.SoftRebootCount+1
		if g.Allows(c) == nil {
			t.Fatalf("grant of boot %s/%d allowed after a soft reboot (%d)", g.BootID, g.SoftRebootCount, c.SoftRebootCount)
		}
		// A heartbeat a lease duration old allows no rollback or stage; a
		// reboot needs none (amendment 37).
		c.SoftRebootCount = g.SoftRebootCount
		fresh := g.Allows(c) == nil
		c.Now = t0.Add(g.Duration)
		if old := g.Allows(c) == nil; old != fresh {
			t.Fatalf("reboot allowed %v with an old heartbeat, %v with a fresh one", old, fresh)
		}
		for _, a := range []Action{ActionStage, ActionRollback} {
			if c.Action = a; g.Allows(c) == nil {
				t.Fatalf("expired grant allowed %s", a)
			}
		}
	})
}

func mustIndex(t *testing.T, name string) int {
	_, _, i, err := ParseSlotName(name)
	if err != nil {
		t.Fatal(err)
	}
	return i
}
