package lease

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// fuzzGrant is a valid grant made of arbitrary fuzz values: each value is
// mapped onto what the protocol allows for its field, so every input
// checks a round trip.
type fuzzGrant struct {
	pool      string
	reboot    bool
	index     uint16
	uid       string
	trans     int32
	holder    string
	image     string
	boot      []byte
	soft      uint32
	second    bool // reboot: phase Reboot; stage: a stage timeout written
	failure   string
	timeout   int64
	acquired  int64
	renewed   int64
	seconds   int32
	namespace string
	cordon    uint8
	backSince int64
	cameBack  bool
}

// maxUnixSeconds is 9999-12-31T23:59:59Z: RFC 3339 has four-digit years.
const maxUnixSeconds = 253402300799

func (f fuzzGrant) grant() Grant {
	kind := KindStage
	if f.reboot {
		kind = KindReboot
	}
	pool := label(f.pool, 40)
	if p, k, _, err := ParseSlotName(SlotName(pool, kind, 0)); err != nil || p != pool || k != kind {
		pool = "p"
	}
	name := SlotName(pool, kind, int(f.index%10000))
	g := Grant{
		ID:   ID{Lease: name, UID: types.UID(strings.ToValidUTF8(f.uid, "?")), Transitions: max(1, f.trans&0x7fffffff)},
		Pool: pool, Kind: kind, Holder: label(f.holder, 253), Image: pinned(f.image),
		BootID: bootIDOf(f.boot), SoftRebootCount: f.soft, Failure: reason(f.failure),
		Acquired: unixTime(f.acquired), Renewed: unixTime(f.renewed),
		Duration:  time.Duration(1+uint32(f.seconds)%86400) * time.Second,
		Namespace: strings.ToValidUTF8(f.namespace, "?"),
		CameBack:  f.cameBack,
	}
	if f.backSince != 0 {
		g.BackSince = unixTime(f.backSince)
	}
	switch {
	case kind == KindStage && f.second:
		span := int64(MaxStageTimeout - MinStageTimeout + 1)
		g.StageTimeout = MinStageTimeout + time.Duration((f.timeout%span+span)%span)
	case kind == KindStage:
		g.StageTimeout, g.StageTimeoutProblem = DefaultStageTimeout, "annotation "+AnnotationStageTimeout+" is absent"
	case f.second:
		g.Phase = PhaseReboot
	default:
		g.Phase = PhaseDraining
	}
	if kind == KindReboot {
		g.Cordon = []Cordon{CordonPending, CordonOurs, CordonNotOurs}[f.cordon%3]
		g.Rollback = f.cordon&8 != 0
	}
	return g
}

// label maps s onto a DNS label-like name: [a-z0-9-], starting and ending
// with a letter or digit, at most n long.
func label(s string, n int) string {
	var b strings.Builder
	b.WriteByte('n')
	for _, c := range []byte(s) {
		if b.Len() >= n-1 {
			break
		}
		b.WriteByte("abcdefghijklmnopqrstuvwxyz0123456789-"[int(c)%37])
	}
	b.WriteByte('0')
	return b.String()
}

// pinned is s when it is a valid pinned reference, else one made from it.
func pinned(s string) imageref.Pinned {
	if p, err := imageref.ParsePinned(s); err == nil {
		return p
	}
	sum := sha256.Sum256([]byte(s))
	repos := []string{"quay.io/example/os", "registry.local:5000/a/b", "localhost/os"}
	return imageref.Pinned{Repository: repos[int(sum[0])%len(repos)], Digest: "sha256:" + hex.EncodeToString(sum[:])}
}

func bootIDOf(b []byte) string {
	sum := sha256.Sum256(b)
	h := hex.EncodeToString(sum[:16])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// reason maps s onto "" or a CamelCase reason.
func reason(s string) string {
	if s == "" {
		return ""
	}
	var b strings.Builder
	b.WriteByte('R')
	for _, c := range []byte(s) {
		if b.Len() >= 64 {
			break
		}
		b.WriteByte("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[int(c)%62])
	}
	return b.String()
}

// unixTime is a UTC time from 1970 to 9999 with nanoseconds.
func unixTime(n int64) time.Time {
	ns := uint64(n)
	return time.Unix(int64(ns/1e9%maxUnixSeconds), int64(ns%1e9)).UTC()
}

// stored is g as the API server gives it back: the spec's times at
// metav1.MicroTime's precision (the annotations keep nanoseconds).
func stored(g Grant) Grant {
	g.Acquired, g.Renewed = g.Acquired.Truncate(time.Microsecond), g.Renewed.Truncate(time.Microsecond)
	return g
}

// storedRoundTrip is Parse of Encode(g) after a JSON round trip, the form
// it is stored in; MicroTime decodes into local time, read here in UTC.
func storedRoundTrip(t *testing.T, g Grant) (Grant, error) {
	t.Helper()
	b, err := json.Marshal(Encode(g))
	if err != nil {
		t.Fatalf("encoding %+v: %v", g, err)
	}
	var l coordinationv1.Lease
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	got, err := Parse(&l)
	got.Acquired, got.Renewed = got.Acquired.UTC(), got.Renewed.UTC()
	return got, err
}

// FuzzEncodeParse checks the codec's round trip: Parse(Encode(g)) == g for
// every field of a valid grant (the soft-reboot count, the stage timeout,
// the cordon record, back-since and came-back included), in memory and
// through the stored JSON form at its precision.
func FuzzEncodeParse(f *testing.F) {
	f.Add("workers", true, uint16(0), "uid-1", int32(3), "node-a", img, []byte("boot"), uint32(0), true, "", int64(0),
		int64(1764417600e9), int64(1764417660e9), int32(60), Namespace, uint8(1), int64(1764417700123456789), true)
	f.Add("workers", false, uint16(7), "uid-2", int32(1), "node-b", other, []byte{1}, uint32(4294967295), true, "", int64(90*time.Minute),
		int64(1764417600123456789), int64(1764417600123456789), int32(30), Namespace, uint8(0), int64(0), false)
	f.Add("a-stage-1", true, uint16(9999), "", int32(-5), "", "quay.io/os:latest", []byte{}, uint32(2), false, "RebootTimeout", int64(-1),
		int64(-1), int64(0), int32(-1), "", uint8(2), int64(-1), true)
	f.Add("x-reboot-3", false, uint16(12), "\xff", int32(2147483647), "N.ODE", "", []byte("\x00"), uint32(1), false, "x y", int64(1),
		int64(1), int64(9223372036854775807), int32(86400), "ns", uint8(255), int64(1), false)
	f.Fuzz(func(t *testing.T, pool string, reboot bool, index uint16, uid string, trans int32, holder, image string, boot []byte,
		soft uint32, second bool, failure string, timeout, acquired, renewed int64, seconds int32, namespace string,
		cordon uint8, backSince int64, cameBack bool) {
		g := fuzzGrant{pool, reboot, index, uid, trans, holder, image, boot, soft, second, failure, timeout, acquired, renewed,
			seconds, namespace, cordon, backSince, cameBack}.grant()
		if got, err := Parse(Encode(g)); err != nil || got != g {
			t.Fatalf("Parse(Encode(g)) = %+v, %v\nwant %+v", got, err, g)
		}
		if got, err := storedRoundTrip(t, g); err != nil || got != stored(g) {
			t.Fatalf("stored round trip = %+v, %v\nwant %+v", got, err, stored(g))
		}
	})
}

// fullReboot and fullStage are grants with every field set.
var (
	fullReboot = Grant{ID: ID{Lease: "workers-reboot-2", UID: "u-1", Transitions: 5}, Pool: "workers", Kind: KindReboot,
		Holder: nodeA, Image: pinned(img), BootID: boot1, SoftRebootCount: 3, Phase: PhaseReboot, Failure: "RebootTimeout",
		Acquired: t0, Renewed: t0.Add(time.Minute), Duration: 40 * time.Second, Namespace: Namespace,
		Cordon: CordonOurs, BackSince: t0.Add(2*time.Minute + 7), CameBack: true}
	fullStage = Grant{ID: ID{Lease: "workers-stage-0", UID: "u-2", Transitions: 1}, Pool: "workers", Kind: KindStage,
		Holder: nodeA, Image: pinned(other), BootID: boot2, StageTimeout: 90 * time.Minute,
		Acquired: t0.Add(123456789), Renewed: t0.Add(123456789), Duration: time.Minute, Namespace: Namespace}
)

func TestEncodeParseRoundTrip(t *testing.T) {
	absent := fullStage
	absent.StageTimeout, absent.StageTimeoutProblem = DefaultStageTimeout, "annotation "+AnnotationStageTimeout+" is absent"
	draining := fullReboot
	draining.Phase, draining.Failure, draining.Cordon, draining.BackSince, draining.CameBack = PhaseDraining, "", CordonPending, time.Time{}, false
	cameBackOnly := fullReboot
	cameBackOnly.BackSince, cameBackOnly.Cordon = time.Time{}, CordonNotOurs
	for name, g := range map[string]Grant{
		"reboot grant with every record":                  fullReboot,
		"stage grant with its stage timeout":              fullStage,
		"stage grant without a stage timeout":             absent,
		"reboot grant just issued":                        draining,
		"reboot grant back once, not now":                 cameBackOnly,
		"rollback grant":                                  func() Grant { g := fullReboot; g.Rollback = true; return g }(),
		"soft-reboot count at its largest":                func() Grant { g := fullStage; g.SoftRebootCount = 1<<32 - 1; return g }(),
		"stage timeout at the bounds of the schema (min)": func() Grant { g := fullStage; g.StageTimeout = MinStageTimeout; return g }(),
		"stage timeout at the bounds of the schema (max)": func() Grant { g := fullStage; g.StageTimeout = MaxStageTimeout; return g }(),
	} {
		t.Run(name, func(t *testing.T) {
			if got, err := Parse(Encode(g)); err != nil || got != g {
				t.Fatalf("Parse(Encode(g)) = %+v, %v\nwant %+v", got, err, g)
			}
			if got, err := storedRoundTrip(t, g); err != nil || got != stored(g) {
				t.Fatalf("stored round trip = %+v, %v\nwant %+v", got, err, stored(g))
			}
		})
	}
}

// TestCodecChanges walks a slot through the coordinator's changes, each on
// the Lease as the previous one left it.
func TestCodecChanges(t *testing.T) {
	l := NewSlot(poolNm, KindReboot, 1)
	l.UID = "u-9"
	if _, err := Parse(l); !errors.Is(err, ErrFree) {
		t.Fatalf("new slot: %v, want free", err)
	}
	if at, err := ParseFree(l); err != nil || !at.IsZero() {
		t.Fatalf("ParseFree(new slot) = %v, %v", at, err)
	}
	terms := Terms{Kind: KindReboot, Holder: nodeA, Image: pinned(img), BootID: boot1, SoftRebootCount: 2, StageTimeout: time.Hour}
	steps := []struct {
		name   string
		change func(*coordinationv1.Lease)
		check  func(t *testing.T, g Grant, err error)
	}{
		{"issue: phase Draining, cordon pending, first grant, duration in whole seconds", func(l *coordinationv1.Lease) {
			issued := Issue(l, terms, t0, 1500*time.Millisecond)
			if got, err := Parse(l); err != nil || got != issued {
				t.Fatalf("Issue returned %+v, the Lease reads %+v, %v", issued, got, err)
			}
		}, func(t *testing.T, g Grant, err error) {
			want := Grant{ID: ID{Lease: "workers-reboot-1", UID: "u-9", Transitions: 1}, Pool: poolNm, Kind: KindReboot, Holder: nodeA,
				Image: pinned(img), BootID: boot1, SoftRebootCount: 2, Phase: PhaseDraining, Cordon: CordonPending,
				Acquired: t0, Renewed: t0, Duration: time.Second, Namespace: Namespace}
			if err != nil || g != want {
				t.Fatalf("got %+v, %v\nwant %+v", g, err, want)
			}
		}},
		{"record the cordon: not ours", func(l *coordinationv1.Lease) { RecordCordon(l, false) }, func(t *testing.T, g Grant, err error) {
			if err != nil || g.Cordon != CordonNotOurs || g.Phase != PhaseDraining {
				t.Fatalf("got %+v, %v", g, err)
			}
		}},
		{"advance: phase Reboot, the cordon recorded, renewTime now", func(l *coordinationv1.Lease) { Advance(l, true, t0.Add(time.Minute)) },
			func(t *testing.T, g Grant, err error) {
				if err != nil || g.Phase != PhaseReboot || g.Cordon != CordonOurs || !g.Renewed.Equal(t0.Add(time.Minute)) || !g.Acquired.Equal(t0) {
					t.Fatalf("got %+v, %v", g, err)
				}
			}},
		{"mark back: back-since and came-back", func(l *coordinationv1.Lease) { MarkBack(l, t0.Add(2*time.Minute)) }, func(t *testing.T, g Grant, err error) {
			if err != nil || !g.BackSince.Equal(t0.Add(2*time.Minute)) || !g.CameBack {
				t.Fatalf("got %+v, %v", g, err)
			}
		}},
		{"not back any more: back-since cleared, came-back stays", func(l *coordinationv1.Lease) { MarkBack(l, time.Time{}) }, func(t *testing.T, g Grant, err error) {
			if err != nil || !g.BackSince.IsZero() || !g.CameBack {
				t.Fatalf("got %+v, %v", g, err)
			}
		}},
		{"mark failed: the slot stays held", func(l *coordinationv1.Lease) { MarkFailed(l, "RebootTimeout") }, func(t *testing.T, g Grant, err error) {
			if err != nil || g.Failure != "RebootTimeout" || g.Holder != nodeA {
				t.Fatalf("got %+v, %v", g, err)
			}
		}},
		{"release verified: free, released-at recorded", func(l *coordinationv1.Lease) { Release(l, t0.Add(3*time.Minute)) }, func(t *testing.T, _ Grant, err error) {
			if at, ferr := ParseFree(l); !errors.Is(err, ErrFree) || ferr != nil || !at.Equal(t0.Add(3*time.Minute)) {
				t.Fatalf("Parse: %v; ParseFree: %v, %v", err, at, ferr)
			}
		}},
		{"issue again: a new grant, nothing of the last one left", func(l *coordinationv1.Lease) {
			Issue(l, Terms{Kind: KindReboot, Holder: "node-b", Image: pinned(other), BootID: boot2}, t0.Add(4*time.Minute), time.Minute)
		}, func(t *testing.T, g Grant, err error) {
			if err != nil || g.Transitions != 2 || g.Holder != "node-b" || g.Failure != "" || g.CameBack || g.Cordon != CordonPending ||
				g.SoftRebootCount != 0 || l.Annotations[AnnotationReleasedAt] != "" {
				t.Fatalf("got %+v, %v; annotations %v", g, err, l.Annotations)
			}
		}},
		{"clear (revoke): free, no released-at", func(l *coordinationv1.Lease) { Clear(l) }, func(t *testing.T, _ Grant, err error) {
			if at, ferr := ParseFree(l); !errors.Is(err, ErrFree) || ferr != nil || !at.IsZero() || *l.Spec.LeaseTransitions != 2 {
				t.Fatalf("Parse: %v; ParseFree: %v, %v; %+v", err, at, ferr, l.Spec)
			}
		}},
	}
	for _, s := range steps {
		s.change(l)
		g, err := Parse(l)
		t.Run(s.name, func(t *testing.T) { s.check(t, g, err) })
	}
}

func TestIssueStageGrant(t *testing.T) {
	for _, c := range []struct {
		name    string
		timeout time.Duration
		want    string // the annotation; "" absent
	}{
		{"the pool's stage timeout is written", 90 * time.Minute, "1h30m0s"},
		{"none given: none written, the agent uses the default", 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := NewSlot(poolNm, KindStage, 0)
			Issue(l, Terms{Kind: KindStage, Holder: nodeA, Image: pinned(img), BootID: boot1, StageTimeout: c.timeout}, t0, time.Minute)
			g, err := Parse(l)
			if err != nil || g.Phase != "" || g.Cordon != "" || l.Annotations[AnnotationStageTimeout] != c.want {
				t.Fatalf("got %+v, %v; annotations %v", g, err, l.Annotations)
			}
			if _, ok := l.Annotations[AnnotationCordonedByUs]; ok {
				t.Fatal("a stage grant carries a cordon record")
			}
		})
	}
}

func TestResetRewritesAMalformedSlotAsFree(t *testing.T) {
	l := Encode(fullReboot)
	l.Labels[LabelPool], l.Labels[LabelSlot] = "other", "stage"
	l.Annotations[AnnotationPhase] = "Sideways"
	l.Spec.LeaseTransitions = ptr.To(int32(-4))
	if _, err := Parse(l); !errors.Is(err, ErrMalformed) {
		t.Fatalf("damaged slot reads %v", err)
	}
	Reset(l)
	if _, err := Parse(l); !errors.Is(err, ErrFree) {
		t.Fatalf("reset slot reads %v, want free", err)
	}
	if _, err := ParseFree(l); err != nil || *l.Spec.LeaseTransitions != 0 || len(l.Annotations) != 0 {
		t.Fatalf("reset slot: %v; %+v; annotations %v", err, l.Spec, l.Annotations)
	}
}

// Clear removes every annotation a grant writes: whatever Encode puts on a
// Lease is in GrantAnnotations.
func TestClearLeavesNothingOfTheGrant(t *testing.T) {
	for _, g := range []Grant{fullReboot, fullStage} {
		l := Encode(g)
		MarkBack(l, t0)
		Release(l, t0)
		delete(l.Annotations, AnnotationReleasedAt)
		if len(l.Annotations) != 0 || l.Labels[LabelHolder] != "" || l.Spec.HolderIdentity != nil {
			t.Errorf("after Release, %s keeps %v", g.Lease, l.Annotations)
		}
		written := slices.Sorted(maps.Keys(Encode(g).Annotations))
		for _, a := range written {
			if !slices.Contains(GrantAnnotations(), a) {
				t.Errorf("Encode writes %s, which Clear leaves", a)
			}
		}
	}
}

func TestParseFreeFindsLeftovers(t *testing.T) {
	for _, c := range []struct {
		name string
		add  func(*coordinationv1.Lease)
	}{
		{"holder label", func(l *coordinationv1.Lease) { l.Labels[LabelHolder] = nodeA }},
		{"image", func(l *coordinationv1.Lease) { l.Annotations[AnnotationImage] = img }},
		{"phase", func(l *coordinationv1.Lease) { l.Annotations[AnnotationPhase] = "Reboot" }},
		{"soft-reboot count, even empty", func(l *coordinationv1.Lease) { l.Annotations[AnnotationSoftRebootCount] = "" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := NewSlot(poolNm, KindReboot, 0)
			l.Annotations = map[string]string{}
			c.add(l)
			if _, err := ParseFree(l); err == nil {
				t.Fatal("leftover not found")
			}
		})
	}
}

func TestCordonRecordNeverMakesTheGrantMalformed(t *testing.T) {
	for _, v := range []*string{nil, ptr.To(""), ptr.To("yes"), ptr.To("True")} {
		l := Encode(fullReboot)
		delete(l.Annotations, AnnotationCordonedByUs)
		if v != nil {
			l.Annotations[AnnotationCordonedByUs] = *v
		}
		g, err := Parse(l)
		want := fmt.Sprintf("annotation %s=%q is not true, false or pending", AnnotationCordonedByUs, ptr.Deref(v, ""))
		if err != nil || g.Cordon != "" || g.CordonProblem != want {
			t.Errorf("cordon %v: %q, %q, %v; want problem %q", v, g.Cordon, g.CordonProblem, err, want)
		}
	}
}

func TestMatches(t *testing.T) {
	id := ID{Lease: "workers-reboot-0", UID: "u-1", Transitions: 4}
	for _, c := range []struct {
		name string
		c    fleetv1.GrantInUse
		want bool
	}{
		{"the same grant", Claim(id, ""), true},
		{"the same grant, released", Claim(id, "StageFailed"), true},
		{"an earlier grant of the slot", fleetv1.GrantInUse{Lease: id.Lease, UID: id.UID, LeaseTransitions: 3}, false},
		{"the slot deleted and made again", fleetv1.GrantInUse{Lease: id.Lease, UID: "u-2", LeaseTransitions: 4}, false},
		{"another slot", fleetv1.GrantInUse{Lease: "workers-reboot-1", UID: id.UID, LeaseTransitions: 4}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Matches(c.c, id); got != c.want {
				t.Fatalf("Matches(%+v, %v) = %v", c.c, id, got)
			}
			claims := []fleetv1.GrantInUse{{Lease: "x", UID: "y", LeaseTransitions: 1}, c.c}
			if got, ok := FindClaim(claims, id); ok != c.want || (ok && got != c.c) {
				t.Fatalf("FindClaim = %+v, %v", got, ok)
			}
		})
	}
}

func TestPurposeOnlyOnRebootSlots(t *testing.T) {
	l := Encode(fullStage)
	l.Annotations[AnnotationPurpose] = PurposeRollback
	if _, err := Parse(l); !errors.Is(err, ErrMalformed) {
		t.Fatalf("stage slot with a purpose: %v, want malformed", err)
	}
	l = Encode(fullReboot)
	l.Annotations[AnnotationPurpose] = "Update"
	if _, err := Parse(l); !errors.Is(err, ErrMalformed) {
		t.Fatalf("reboot slot with purpose Update: %v, want malformed", err)
	}
	free := NewSlot("workers", KindReboot, 0)
	free.Annotations = map[string]string{AnnotationPurpose: PurposeRollback}
	if _, err := ParseFree(free); err == nil {
		t.Fatal("a free slot with a purpose left on it reads as clean")
	}
}

func TestRollbackGrantAllowsOnlyRollback(t *testing.T) {
	g := fullReboot
	g.Failure = ""
	c := Check{Node: nodeA, Image: g.Image.String(), BootID: g.BootID, SoftRebootCount: g.SoftRebootCount,
		Now: t0, LastHeartbeat: t0}
	for _, tc := range []struct {
		rollback bool
		action   Action
		ok       bool
	}{
		{false, ActionReboot, true}, {false, ActionRollback, false}, {false, ActionStage, false},
		{true, ActionRollback, true}, {true, ActionReboot, false}, {true, ActionStage, false},
	} {
		g.Rollback, c.Action = tc.rollback, tc.action
		if err := g.Allows(c); (err == nil) != tc.ok {
			t.Errorf("rollback=%v %s: %v, want allowed=%v", tc.rollback, tc.action, err, tc.ok)
		}
	}
	g.Rollback, g.Phase, c.Action = true, PhaseDraining, ActionRollback
	if err := g.Allows(c); !errors.Is(err, ErrNotReboot) {
		t.Errorf("rollback grant in phase Draining: %v, want ErrNotReboot", err)
	}
}
