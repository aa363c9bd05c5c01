package lease

import (
	"errors"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const (
	img    = "quay.io/example/os@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	other  = "quay.io/example/os@sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	boot1  = "6b7e6b3c-0c1d-4a8e-9c57-3c1f0d1e2a3b"
	boot2  = "11111111-2222-4333-8444-555555555555"
	nodeA  = "node-a"
	poolNm = "workers"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func heldLease(kind Kind, phase Phase) *coordinationv1.Lease {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      SlotName(poolNm, kind, 0),
			Namespace: Namespace,
			UID:       "uid-1",
			Labels:    map[string]string{LabelPool: poolNm, LabelSlot: string(kind), LabelHolder: nodeA},
			Annotations: map[string]string{
				AnnotationImage:  img,
				AnnotationBootID: boot1,
			},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(nodeA),
			LeaseDurationSeconds: ptr.To(int32(60)),
			AcquireTime:          &metav1.MicroTime{Time: t0},
			RenewTime:            &metav1.MicroTime{Time: t0},
			LeaseTransitions:     ptr.To(int32(3)),
		},
	}
	if phase != "" {
		l.Annotations[AnnotationPhase] = string(phase)
	}
	return l
}

func TestSlotName(t *testing.T) {
	for _, c := range []struct {
		pool string
		kind Kind
		i    int
	}{{"p", KindReboot, 0}, {"a-stage-1", KindStage, 12}, {"x-reboot-3", KindReboot, 9}} {
		name := SlotName(c.pool, c.kind, c.i)
		pool, kind, i, err := ParseSlotName(name)
		if err != nil || pool != c.pool || kind != c.kind || i != c.i {
			t.Errorf("ParseSlotName(%q) = %q %q %d %v", name, pool, kind, i, err)
		}
	}
	for _, bad := range []string{"p-reboot-", "p-reboot-01", "-reboot-1", "p-other-1", "p-stage-x", "p-stage-99999"} {
		if _, _, _, err := ParseSlotName(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseSlotName(%q) = %v, want ErrMalformed", bad, err)
		}
	}
}

func TestParse(t *testing.T) {
	cases := []struct {
		name    string
		mutate  func(l *coordinationv1.Lease)
		kind    Kind
		phase   Phase
		wantErr error
	}{
		{"stage grant", nil, KindStage, "", nil},
		{"reboot draining", nil, KindReboot, PhaseDraining, nil},
		{"reboot phase", nil, KindReboot, PhaseReboot, nil},
		{"free slot", func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil }, KindStage, "", ErrFree},
		{"empty holder", func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To("") }, KindStage, "", ErrFree},
		{"reboot without phase", nil, KindReboot, "", ErrMalformed},
		{"stage with phase", nil, KindStage, PhaseReboot, ErrMalformed},
		{"unknown phase", func(l *coordinationv1.Lease) { l.Annotations[AnnotationPhase] = "reboot" }, KindReboot, PhaseReboot, ErrMalformed},
		{"tag image", func(l *coordinationv1.Lease) { l.Annotations[AnnotationImage] = "quay.io/os:latest" }, KindStage, "", ErrMalformed},
		{"shell in image", func(l *coordinationv1.Lease) { l.Annotations[AnnotationImage] = img + ";reboot" }, KindStage, "", ErrMalformed},
		{"missing image", func(l *coordinationv1.Lease) { delete(l.Annotations, AnnotationImage) }, KindStage, "", ErrMalformed},
		{"bad boot id", func(l *coordinationv1.Lease) { l.Annotations[AnnotationBootID] = "not-a-boot" }, KindStage, "", ErrMalformed},
		{"uppercase boot id", func(l *coordinationv1.Lease) { l.Annotations[AnnotationBootID] = strings.ToUpper(boot1) }, KindStage, "", ErrMalformed},
		{"holder label mismatch", func(l *coordinationv1.Lease) { l.Labels[LabelHolder] = "node-b" }, KindStage, "", ErrMalformed},
		{"slot label mismatch", func(l *coordinationv1.Lease) { l.Labels[LabelSlot] = "reboot" }, KindStage, "", ErrMalformed},
		{"pool label mismatch", func(l *coordinationv1.Lease) { l.Labels[LabelPool] = "other" }, KindStage, "", ErrMalformed},
		{"bad holder", func(l *coordinationv1.Lease) {
			l.Spec.HolderIdentity = ptr.To("Node A")
			l.Labels[LabelHolder] = "Node A"
		}, KindStage, "", ErrMalformed},
		{"no duration", func(l *coordinationv1.Lease) { l.Spec.LeaseDurationSeconds = nil }, KindStage, "", ErrMalformed},
		{"negative duration", func(l *coordinationv1.Lease) { l.Spec.LeaseDurationSeconds = ptr.To(int32(-1)) }, KindStage, "", ErrMalformed},
		{"no renew time", func(l *coordinationv1.Lease) { l.Spec.RenewTime = nil }, KindStage, "", ErrMalformed},
		{"zero transitions", func(l *coordinationv1.Lease) { l.Spec.LeaseTransitions = ptr.To(int32(0)) }, KindStage, "", ErrMalformed},
		{"bad failure", func(l *coordinationv1.Lease) { l.Annotations[AnnotationFailure] = "x y" }, KindReboot, PhaseReboot, ErrMalformed},
		{"bad name", func(l *coordinationv1.Lease) { l.Name = "whatever" }, KindStage, "", ErrMalformed},
		{"soft-reboot count present", func(l *coordinationv1.Lease) { l.Annotations[AnnotationSoftRebootCount] = "0" }, KindReboot, PhaseReboot, nil},
		{"empty soft-reboot count", func(l *coordinationv1.Lease) { l.Annotations[AnnotationSoftRebootCount] = "" }, KindStage, "", ErrMalformed},
		{"negative soft-reboot count", func(l *coordinationv1.Lease) { l.Annotations[AnnotationSoftRebootCount] = "-1" }, KindStage, "", ErrMalformed},
		{"signed soft-reboot count", func(l *coordinationv1.Lease) { l.Annotations[AnnotationSoftRebootCount] = "+1" }, KindStage, "", ErrMalformed},
		{"soft-reboot count with leading zero", func(l *coordinationv1.Lease) { l.Annotations[AnnotationSoftRebootCount] = "01" }, KindStage, "", ErrMalformed},
		{"soft-reboot count with space", func(l *coordinationv1.Lease) { l.Annotations[AnnotationSoftRebootCount] = " 1" }, KindStage, "", ErrMalformed},
		{"soft-reboot count in hex", func(l *coordinationv1.Lease) { l.Annotations[AnnotationSoftRebootCount] = "0x1" }, KindStage, "", ErrMalformed},
		{"soft-reboot count beyond uint32", func(l *coordinationv1.Lease) { l.Annotations[AnnotationSoftRebootCount] = "4294967296" }, KindStage, "", ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := heldLease(c.kind, c.phase)
			if c.mutate != nil {
				c.mutate(l)
			}
			g, err := Parse(l)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("Parse = %v, want %v", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if g.Holder != nodeA || g.Image.String() != img || g.BootID != boot1 || g.Kind != c.kind || g.Phase != c.phase ||
				g.Transitions != 3 || g.Duration != time.Minute || g.UID != "uid-1" || g.Pool != poolNm {
				t.Fatalf("Parse = %+v", g)
			}
		})
	}
}

func TestParseSoftRebootCount(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint32
		ok   bool
	}{
		{"0", 0, true}, {"1", 1, true}, {"42", 42, true}, {"4294967295", 4294967295, true},
		{"", 0, false}, {"00", 0, false}, {"007", 0, false}, {"-0", 0, false}, {"+3", 0, false},
		{"1e3", 0, false}, {"3 ", 0, false}, {"\n3", 0, false}, {"4294967296", 0, false}, {"99999999999", 0, false}, {"١", 0, false},
	} {
		got, err := ParseSoftRebootCount(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseSoftRebootCount(%q) = %d, %v; want %d, ok=%v", c.in, got, err, c.want, c.ok)
		}
		if c.ok && FormatSoftRebootCount(got) != c.in {
			t.Errorf("FormatSoftRebootCount(%d) = %q, want %q", got, FormatSoftRebootCount(got), c.in)
		}
	}
	l := heldLease(KindReboot, PhaseReboot)
	if g := mustParse(t, l); g.SoftRebootCount != 0 {
		t.Errorf("absent annotation: count %d, want 0", g.SoftRebootCount)
	}
	l.Annotations[AnnotationSoftRebootCount] = "7"
	if g := mustParse(t, l); g.SoftRebootCount != 7 {
		t.Errorf("count %d, want 7", g.SoftRebootCount)
	}
}

func TestAllows(t *testing.T) {
	stage := mustParse(t, heldLease(KindStage, ""))
	draining := mustParse(t, heldLease(KindReboot, PhaseDraining))
	reboot := mustParse(t, heldLease(KindReboot, PhaseReboot))
	failed := heldLease(KindReboot, PhaseReboot)
	failed.Annotations[AnnotationFailure] = "RebootTimeout"
	failedGrant := mustParse(t, failed)
	softened := heldLease(KindReboot, PhaseReboot)
	softened.Annotations[AnnotationSoftRebootCount] = "2"
	rebootAfterTwoSoft := mustParse(t, softened)
	rollback := reboot
	rollback.Rollback = true

	ok := Check{Node: nodeA, Image: img, BootID: boot1, Now: t0.Add(10 * time.Second), LastHeartbeat: t0}
	with := func(f func(c *Check)) Check { c := ok; f(&c); return c }
	cases := []struct {
		name  string
		grant Grant
		check Check
		want  error
	}{
		{"stage allowed", stage, with(func(c *Check) { c.Action = ActionStage }), nil},
		{"reboot allowed", reboot, with(func(c *Check) { c.Action = ActionReboot }), nil},
		{"stage grant cannot reboot", stage, with(func(c *Check) { c.Action = ActionReboot }), ErrWrongKind},
		{"reboot grant cannot stage", reboot, with(func(c *Check) { c.Action = ActionStage }), ErrWrongKind},
		{"unknown action", reboot, with(func(c *Check) { c.Action = "apply" }), ErrWrongKind},
		{"draining cannot reboot", draining, with(func(c *Check) { c.Action = ActionReboot }), ErrNotReboot},
		{"other node", reboot, with(func(c *Check) { c.Action = ActionReboot; c.Node = "node-b" }), ErrNotHolder},
		{"other image", stage, with(func(c *Check) { c.Action = ActionStage; c.Image = other }), ErrWrongImage},
		{"other boot", reboot, with(func(c *Check) { c.Action = ActionReboot; c.BootID = boot2 }), ErrWrongBoot},
		// A soft reboot keeps the boot ID; the count names the boot.
		{"same boot ID after a soft reboot", reboot, with(func(c *Check) { c.Action = ActionReboot; c.SoftRebootCount = 1 }), ErrWrongBoot},
		{"grant of the boot with two soft reboots", rebootAfterTwoSoft, with(func(c *Check) { c.Action = ActionReboot; c.SoftRebootCount = 2 }), nil},
		{"grant of an earlier soft boot", rebootAfterTwoSoft, with(func(c *Check) { c.Action = ActionReboot; c.SoftRebootCount = 3 }), ErrWrongBoot},
		{"grant of a later soft boot", rebootAfterTwoSoft, with(func(c *Check) { c.Action = ActionReboot; c.SoftRebootCount = 1 }), ErrWrongBoot},
		{"failed grant", failedGrant, with(func(c *Check) { c.Action = ActionReboot }), ErrFailedMarked},
		{"no heartbeat accepted yet", stage, with(func(c *Check) { c.Action = ActionStage; c.LastHeartbeat = time.Time{} }), ErrExpired},
		{"heartbeat too old", stage, with(func(c *Check) { c.Action = ActionStage; c.Now = t0.Add(time.Minute) }), ErrExpired},
		// The agent stops a third of a lease before the coordinator could expire it.
		{"heartbeat just inside two thirds of the lease", stage, with(func(c *Check) { c.Action = ActionStage; c.Now = t0.Add(40*time.Second - time.Millisecond) }), nil},
		{"heartbeat at two thirds of the lease", stage, with(func(c *Check) { c.Action = ActionStage; c.Now = t0.Add(40 * time.Second) }), ErrExpired},
		{"heartbeat in the far future", stage, with(func(c *Check) { c.Action = ActionStage; c.Now = t0.Add(-2 * time.Minute) }), ErrExpired},
		// An update's reboot in phase Reboot needs no heartbeat (amendment 37);
		// a rollback still does.
		{"reboot before any heartbeat", reboot, with(func(c *Check) { c.Action = ActionReboot; c.LastHeartbeat = time.Time{} }), nil},
		{"reboot a day after the grant", reboot, with(func(c *Check) { c.Action = ActionReboot; c.Now = t0.Add(24 * time.Hour) }), nil},
		{"rollback before any heartbeat", rollback, with(func(c *Check) { c.Action = ActionRollback; c.LastHeartbeat = time.Time{} }), ErrExpired},
		{"rollback with an old heartbeat", rollback, with(func(c *Check) { c.Action = ActionRollback; c.Now = t0.Add(time.Minute) }), ErrExpired},
		{"rollback with a live heartbeat", rollback, with(func(c *Check) { c.Action = ActionRollback }), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.grant.Allows(c.check)
			if c.want == nil && err != nil {
				t.Fatalf("Allows = %v, want nil", err)
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("Allows = %v, want %v", err, c.want)
			}
		})
	}
}

func mustParse(t *testing.T, l *coordinationv1.Lease) Grant {
	t.Helper()
	g, err := Parse(l)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// A stage grant carries the pool's stageTimeout (amendment 19); a missing or
// invalid value never makes the grant malformed, it means the default and
// says why.
func TestParseStageTimeout(t *testing.T) {
	cases := []struct {
		name    string
		value   *string
		want    time.Duration
		problem bool
	}{
		{"absent", nil, DefaultStageTimeout, true},
		{"valid", ptr.To("90m0s"), 90 * time.Minute, false},
		{"lower bound", ptr.To("1m"), time.Minute, false},
		{"upper bound", ptr.To("24h"), 24 * time.Hour, false},
		{"too short", ptr.To("59s"), DefaultStageTimeout, true},
		{"too long", ptr.To("24h0m1s"), DefaultStageTimeout, true},
		{"negative", ptr.To("-1h"), DefaultStageTimeout, true},
		{"garbage", ptr.To("1h; reboot"), DefaultStageTimeout, true},
		{"empty", ptr.To(""), DefaultStageTimeout, true},
		{"huge", ptr.To(strings.Repeat("9", 100) + "h"), DefaultStageTimeout, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := heldLease(KindStage, "")
			if c.value != nil {
				l.Annotations[AnnotationStageTimeout] = *c.value
			}
			g, err := Parse(l)
			if err != nil {
				t.Fatalf("Parse: %v (a stage timeout must never make a grant malformed)", err)
			}
			if g.StageTimeout != c.want || (g.StageTimeoutProblem != "") != c.problem {
				t.Fatalf("StageTimeout = %s, problem %q; want %s, problem %v", g.StageTimeout, g.StageTimeoutProblem, c.want, c.problem)
			}
		})
	}
	if g, err := Parse(heldLease(KindReboot, PhaseReboot)); err != nil || g.StageTimeout != 0 || g.StageTimeoutProblem != "" {
		t.Fatalf("a reboot grant has no stage timeout: %s %q %v", g.StageTimeout, g.StageTimeoutProblem, err)
	}
	if got, err := ParseStageTimeout(FormatStageTimeout(DefaultStageTimeout)); err != nil || got != DefaultStageTimeout {
		t.Fatalf("round trip: %s %v", got, err)
	}
}
