package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
)

const (
	// imgBad ships badUnit, which fails on every host.
	imgBad = "registry.example/fleet/os@sha256:3333333333333333333333333333333333333333333333333333333333333333"
	// badUnit is the check the bad image ships, as greenboot-style images
	// ship theirs.
	badUnit = "bad-image-check.service"
	// badUnitSays is what badUnit writes before it fails.
	badUnitSays = "bad-image-check: this image cannot serve on this host"
)

// A bad image under Debian 13's systemd 257 as PID 1, gated on the host. The
// image ships a unit, badUnit, enabled for multi-user.target, whose check
// fails: it exists only in the boots of that image (Options.ImageUnits). The
// canary reboots into it; its real systemd runs the unit, which fails, and
// goes degraded; the real agent reads SystemState and
// ListUnitsFiltered(["failed"]) over the container's system bus and reports
// them in status.host with the boot they were read in. The coordinator fails
// the gate at health.timeout (HostUnitFailed), quarantines the digest and
// grants a rollback; the agent runs `bootc rollback` and reboots through
// logind; the node comes back on the old image, running, with nothing
// failed. The pool says Degraded ImageFailedHealthCheck and the other node
// is never rebooted. Then a good image clears the quarantine and rolls both
// nodes, each passing the same gate under the same systemd.
func TestBadImageRollsBackUnderSystemd(t *testing.T) {
	SkipIfUnavailable(t)
	const pool = "e2e-bad"
	// Every image assesses its boots as images using systemd's boot
	// assessment do; the bad one also ships badUnit.
	goodUnits, badUnits := t.TempDir(), t.TempDir()
	for _, dir := range []string{goodUnits, badUnits} {
		if err := writeBootAssessment(dir); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeFailingUnit(badUnits, badUnit, badUnitSays); err != nil {
		t.Fatal(err)
	}
	f := NewFleet(t, Options{Nodes: 2, Prefix: "e2e-bad", Booted: imgOld, Pool: pool, Suite: SuiteTrixie,
		ImageUnits: map[string]string{imgOld: goodUnits, imgBad: badUnits, imgTarget: goodUnits}})
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	f.Boot()
	boot1 := map[string]BootLog{}
	for _, n := range f.Nodes {
		boot1[n.Name] = awaitAgentActive(ctx, t, n, 1)
	}

	runRollout(ctx, t, f, "e2e-bad", pool, 2, "", func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = imgBad
		p.Spec.Health = &fleetv1.HealthSpec{Timeout: &metav1.Duration{Duration: 30 * time.Second},
			Host: &fleetv1.HostHealthCheck{RequireBootComplete: true, RequiredUnits: []string{"multi-user.target"}}}
		p.Spec.Rollout.Canary = &fleetv1.CanarySpec{Nodes: ptr.To(intstr.FromInt32(1))}
	})
	canary, other := canaryOf(ctx, t, f, pool)
	t.Logf("canary %s, other %s", canary.Name, other.Name)

	// 1. The bad boot: systemd degraded, the unit failed, as the agent
	// reports it and as systemd itself says.
	bad := awaitNodeStatus(ctx, t, f, canary, "status.host of the bad boot: degraded", func(s fleetv1.BootcNodeStatus) bool {
		b := canary.Current()
		return b != nil && s.BootID == b.BootID && s.BootID != boot1[canary.Name].BootID && s.Host != nil &&
			s.Host.BootID == s.BootID && s.Host.SystemState == fleetv1.SystemDegraded
	})
	badBoot := canary.Current()
	t.Logf("%s in boot %s on %s reports host %+v", canary.Name, bad.BootID, bad.Booted.Digest, *bad.Host)
	if bad.Booted == nil || !strings.HasSuffix(imgBad, bad.Booted.Digest) {
		t.Errorf("the degraded boot reports booted %+v, want %s", bad.Booted, imgBad)
	}
	// badUnit failed, so systemd's own check failed too and boot-complete.target
	// was never reached.
	if h := bad.Host; !slices.Equal(h.FailedUnits, []string{badUnit, checkNoFailures}) || h.FailedUnitsTotal != 2 ||
		h.BootComplete != "inactive" || !slices.Equal(h.Units, []fleetv1.UnitState{{Name: "multi-user.target", ActiveState: "active"}}) {
		t.Errorf("status.host of the bad boot = %+v; want %s and %s failed, boot-complete.target inactive, multi-user.target active",
			*h, badUnit, checkNoFailures)
	}
	// The gate holds the node in this boot for health.timeout: time enough.
	if badBoot == nil || badBoot.BootID != bad.BootID {
		t.Fatalf("%s left its bad boot %s before the harness could ask its systemd", canary.Name, bad.BootID)
	}
	checkSystemd(ctx, t, badBoot, true)
	journal, err := badBoot.Exec(ctx, "journalctl", "-b", "--no-pager", "-o", "cat", "-u", badUnit)
	if err != nil || !strings.Contains(journal, badUnitSays) {
		t.Errorf("the journal of %s in the bad boot lacks %q (%v):\n%s", badUnit, badUnitSays, err, journal)
	}

	// 2. The gate fails, the digest is quarantined, the pool degraded.
	var q *fleetv1.Quarantine
	var degraded metav1.Condition
	if err := canary.Await(ctx, "the bad digest quarantined", func() (bool, error) {
		var p fleetv1.BootcNodePool
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: pool}, &p); err != nil {
			return false, nil
		}
		q = p.Status.Quarantine
		if c := meta.FindStatusCondition(p.Status.Conditions, fleetv1.PoolDegraded); c != nil {
			degraded = *c
		}
		return q != nil && degraded.Status == metav1.ConditionTrue, nil
	}); err != nil {
		t.Fatal(err)
	}
	quarantined := time.Now()
	t.Logf("quarantine %+v; Degraded %s: %s", *q, degraded.Reason, degraded.Message)
	if q.Digest != imgBad || q.SpecImage != imgBad || q.Node != canary.Name || q.Reason != fleetv1.ReasonHostUnitFailed ||
		!strings.Contains(q.Message, badUnit) {
		t.Errorf("quarantine %+v; want %s, node %s, %s naming %s", *q, imgBad, canary.Name, fleetv1.ReasonHostUnitFailed, badUnit)
	}
	if degraded.Reason != fleetv1.ReasonImageFailedHealthCheck {
		t.Errorf("Degraded reason %s, want %s", degraded.Reason, fleetv1.ReasonImageFailedHealthCheck)
	}

	// 3. Rolled back: a third boot, on the old image, running.
	back := awaitNodeStatus(ctx, t, f, canary, "back on the old image, running, in a new boot", func(s fleetv1.BootcNodeStatus) bool {
		b := canary.Current()
		return b != nil && s.BootID == b.BootID && s.BootID != bad.BootID && s.BootID != boot1[canary.Name].BootID &&
			s.Booted != nil && strings.HasSuffix(imgOld, s.Booted.Digest) && s.Host != nil && s.Host.BootID == s.BootID &&
			s.Host.SystemState == fleetv1.SystemRunning
	})
	if h := back.Host; len(h.FailedUnits) != 0 || h.FailedUnitsTotal != 0 || h.BootComplete != "active" {
		t.Errorf("status.host after the rollback = %+v; want nothing failed, boot-complete.target active", *h)
	}
	if b := canary.Current(); b == nil || b.BootID != back.BootID {
		t.Errorf("%s left boot %s before the harness could ask its systemd", canary.Name, back.BootID)
	} else {
		checkSystemd(ctx, t, b, false)
	}
	if err := canary.Await(ctx, "the slots free, nodes uncordoned", func() (bool, error) {
		return slotsFree(ctx, f, pool) && allSchedulable(ctx, f), nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("rolled back and released %s after the quarantine, %s after the test started",
		time.Since(quarantined).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	// 4. What each node went through.
	boots := canary.Boots()
	var images []string
	for _, b := range boots {
		images = append(images, b.Image)
	}
	if !slices.Equal(images, []string{imgOld, imgBad, imgOld}) {
		t.Errorf("%s booted %q; want the old image, the bad one, the old one", canary.Name, images)
	}
	for _, b := range boots[:min(2, len(boots))] {
		if b.Exit != exitReboot || b.HarnessRebooted {
			t.Errorf("%s: boot %d ended with %d (harness reboot %v); want the agent's own reboot", canary.Name, b.N, b.Exit, b.HarnessRebooted)
		}
	}
	m, err := canary.Bootc.Machine()
	if err != nil {
		t.Fatal(err)
	}
	if st := m.State(); st.Reboots != 2 || st.Booted == nil || st.Booted.Image != imgOld || st.Rollback == nil || st.Rollback.Image != imgBad {
		t.Errorf("%s: test bootc played %d reboots, booted %+v, rollback %+v; want 2, %s, %s", canary.Name, st.Reboots, st.Booted, st.Rollback, imgOld, imgBad)
	}
	if got := bootcRuns(t, canary, "rollback"); len(got) != 1 {
		t.Errorf("%s: bootc rollback ran as %q; want once", canary.Name, got)
	}
	if ob := other.Boots(); len(ob) != 1 {
		t.Errorf("%s: %d boots; a node that is not a canary must never reboot into the bad image", other.Name, len(ob))
	}
	if m, err := other.Bootc.Machine(); err != nil || m.State().Reboots != 0 {
		t.Errorf("%s: the test bootc played reboots (%v): %+v", other.Name, err, m)
	}
	if got := bootcRuns(t, other, "upgrade", "--from-downloaded"); len(got) != 0 {
		t.Errorf("%s unlocked a stage: %q", other.Name, got)
	}
	for _, ev := range []struct{ reason, says string }{
		{fleetv1.EventHealthCheckFailed, badUnit},
		{fleetv1.EventRolledBack, ""},
	} {
		notes := poolEvents(ctx, t, f, ev.reason, canary.Name)
		if !slices.ContainsFunc(notes, func(s string) bool { return strings.Contains(s, ev.says) }) {
			t.Errorf("no %s Event about %s naming %q: %q", ev.reason, canary.Name, ev.says, notes)
		}
		t.Logf("%s Events on Node %s: %q", ev.reason, canary.Name, notes)
	}

	// 5. A good image: the quarantine goes with the old spec.image, and the
	// gate passes on both nodes under the same real systemd.
	fixed := time.Now()
	setPoolImage(ctx, t, f, pool, imgTarget)
	for _, n := range f.Nodes {
		st := awaitNodeStatus(ctx, t, f, n, "on the good image, running", func(s fleetv1.BootcNodeStatus) bool {
			b := n.Current()
			return b != nil && s.BootID == b.BootID && s.Booted != nil && strings.HasSuffix(imgTarget, s.Booted.Digest) &&
				s.Host != nil && s.Host.BootID == s.BootID && s.Host.SystemState == fleetv1.SystemRunning && s.Phase == fleetv1.PhaseIdle
		})
		if st.Host.BootComplete != "active" || st.Host.FailedUnitsTotal != 0 {
			t.Errorf("%s on the good image reports host %+v; want boot-complete.target active, nothing failed", n.Name, *st.Host)
		}
		if b := n.Current(); b == nil || b.BootID != st.BootID {
			t.Errorf("%s left boot %s before the harness could ask its systemd", n.Name, st.BootID)
		} else {
			checkSystemd(ctx, t, b, false)
		}
	}
	if err := canary.Await(ctx, "the pool up to date, quarantine cleared, slots free, nodes uncordoned", func() (bool, error) {
		var p fleetv1.BootcNodePool
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: pool}, &p); err != nil {
			return false, nil
		}
		return p.Status.Updated == 2 && p.Status.Quarantine == nil && slotsFree(ctx, f, pool) && allSchedulable(ctx, f), nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("the good image rolled both nodes in %s; the test took %s", time.Since(fixed).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	// The canary of the good image went first and alone: the other node
	// went down for it only after the canary was back on it.
	var p fleetv1.BootcNodePool
	if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: pool}, &p); err != nil {
		t.Fatal(err)
	}
	if c := p.Status.Canary; c == nil || c.Target != imgTarget || len(c.Nodes) != 1 {
		t.Errorf("status.canary %+v; want one canary for %s", c, imgTarget)
	} else {
		first, second := canary, other
		if c.Nodes[0] == other.Name {
			first, second = other, canary
		}
		fb, sb := first.Boots(), second.Boots()
		if len(sb) < 2 {
			t.Fatalf("%s: boots %+v; want it rebooted into the good image", second.Name, sb)
		}
		if last, prev := fb[len(fb)-1], sb[len(sb)-2]; !prev.Down.After(last.Up) {
			t.Errorf("%s went down for the good image at %s, before its canary %s was back on it at %s", second.Name,
				prev.Down.Format(time.StampMilli), first.Name, last.Up.Format(time.StampMilli))
		}
	}
	for n, want := range map[*Node][]string{canary: {imgOld, imgBad, imgOld, imgTarget}, other: {imgOld, imgTarget}} {
		var got []string
		for _, b := range n.Boots() {
			got = append(got, b.Image)
			t.Logf("%s boot %d on %s: container up in %s, agent active %s after that", n.Name, b.N, b.Image,
				b.Up.Sub(b.Started).Round(time.Millisecond), b.AgentFirstActive.Sub(b.Up).Round(time.Millisecond))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s booted %q, want %q", n.Name, got, want)
		}
	}
	if most, at := maxDisrupted(f.Events.snapshot()); most > 1 {
		t.Errorf("%d nodes were cordoned or down at once (maxUnavailable 1), at %s", most, at)
	}
}

// setPoolImage points the pool at image.
func setPoolImage(ctx context.Context, t *testing.T, f *Fleet, pool, image string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var p fleetv1.BootcNodePool
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: pool}, &p); err != nil {
			return err
		}
		p.Spec.Image = image
		return f.Env.Client.Update(ctx, &p)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkNoFailures is systemd's own boot check (man
// systemd-boot-check-no-failures.service): it fails when any unit failed,
// and boot-complete.target requires it once enabled.
const checkNoFailures = "systemd-boot-check-no-failures.service"

// writeBootAssessment writes into dir, a directory of unit files, what an
// image using systemd's boot assessment has: checkNoFailures enabled
// (RequiredBy=boot-complete.target, the link systemctl enable makes), and
// boot-complete.target pulled into every boot by e2e-bless-boot.service,
// which stands for systemd-bless-boot.service (Requires= and After=
// boot-complete.target, DefaultDependencies=no, wanted by basic.target):
// systemd-bless-boot-generator adds that one only on a boot loader that
// counts boots, which a container has not.
func writeBootAssessment(dir string) error {
	unit := "[Unit]\nDescription=e2e: marks the boot good, as systemd-bless-boot.service does\n" +
		"DefaultDependencies=no\nRequires=boot-complete.target\nAfter=local-fs.target boot-complete.target\n" +
		"Conflicts=shutdown.target\nBefore=shutdown.target\n" +
		"[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n"
	for _, d := range []string{"basic.target.wants", "boot-complete.target.requires"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "e2e-bless-boot.service"), []byte(unit), 0o644); err != nil {
		return err
	}
	if err := os.Symlink("../e2e-bless-boot.service", filepath.Join(dir, "basic.target.wants", "e2e-bless-boot.service")); err != nil {
		return err
	}
	return os.Symlink("/usr/lib/systemd/system/"+checkNoFailures, filepath.Join(dir, "boot-complete.target.requires", checkNoFailures))
}

// writeFailingUnit writes into dir, a directory of unit files, a oneshot
// unit that says says and fails, and enables it for multi-user.target (the
// .wants/ link systemctl enable makes).
func writeFailingUnit(dir, name, says string) error {
	unit := "[Unit]\nDescription=e2e: the check a bad image ships, which fails\n" +
		"[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo \"" + says + "\" >&2; exit 1'\n" +
		"[Install]\nWantedBy=multi-user.target\n"
	if err := os.WriteFile(filepath.Join(dir, name), []byte(unit), 0o644); err != nil {
		return err
	}
	wants := filepath.Join(dir, "multi-user.target.wants")
	if err := os.MkdirAll(wants, 0o755); err != nil {
		return err
	}
	return os.Symlink("../"+name, filepath.Join(wants, name))
}

// canaryOf waits for the pool to pick its one canary and returns it and
// the other node.
func canaryOf(ctx context.Context, t *testing.T, f *Fleet, pool string) (canary, other *Node) {
	t.Helper()
	var names []string
	if err := f.Nodes[0].Await(ctx, "the pool's canary", func() (bool, error) {
		var p fleetv1.BootcNodePool
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: pool}, &p); err != nil || p.Status.Canary == nil {
			return false, nil
		}
		names = p.Status.Canary.Nodes
		return len(names) > 0, nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || len(f.Nodes) != 2 {
		t.Fatalf("canaries %q of %d nodes; want one of two", names, len(f.Nodes))
	}
	if f.Nodes[0].Name == names[0] {
		return f.Nodes[0], f.Nodes[1]
	}
	return f.Nodes[1], f.Nodes[0]
}

// checkSystemd asks the container's systemd itself how the boot went: in
// a boot of the bad image (bad) the manager is degraded, badUnit failed
// and boot-complete.target never reached; in any other the manager is
// running, boot-complete.target active, and badUnit not even loaded.
func checkSystemd(ctx context.Context, t *testing.T, b *Boot, bad bool) {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	state, complete := "running", "active"
	unit := map[string]string{"ActiveState": "inactive", "LoadState": "not-found", "Result": "success"}
	if bad {
		state, complete = "degraded", "inactive"
		unit = map[string]string{"ActiveState": "failed", "LoadState": "loaded", "Result": "exit-code"}
	}
	got, err := b.Exec(cctx, "systemctl", "show", "-P", "SystemState")
	if err != nil || strings.TrimSpace(got) != state {
		t.Errorf("%s: systemctl show -P SystemState = %q (%v), want %s", b.Machine.Name, got, err, state)
	}
	if p, err := b.Show(cctx, "boot-complete.target", "ActiveState"); err != nil || p["ActiveState"] != complete {
		t.Errorf("%s: boot-complete.target %v (%v), want ActiveState=%s", b.Machine.Name, p, err, complete)
	}
	p, err := b.Show(cctx, badUnit, "ActiveState", "LoadState", "Result")
	if err != nil {
		t.Errorf("%s: %v", b.Machine.Name, err)
		return
	}
	for k, v := range unit {
		if p[k] != v {
			t.Errorf("%s: %s %s=%s, want %s", b.Machine.Name, badUnit, k, p[k], v)
		}
	}
}

// bootcRuns lists the node's bootc invocations whose arguments hold every
// one of args.
func bootcRuns(t *testing.T, n *Node, args ...string) [][]string {
	t.Helper()
	inv, err := n.Bootc.Invocations()
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, i := range inv {
		if len(i.Args) > 0 && i.Args[0] == args[0] && !slices.Contains(i.Args, "--help") &&
			!slices.ContainsFunc(args[1:], func(a string) bool { return !slices.Contains(i.Args, a) }) {
			out = append(out, i.Args)
		}
	}
	return out
}

// slotsFree: no slot Lease of the pool is held.
func slotsFree(ctx context.Context, f *Fleet, pool string) bool {
	leases, err := f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + pool})
	if err != nil {
		return false
	}
	for i := range leases.Items {
		l := &leases.Items[i]
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && !finishedStage(ctx, f, pool, l) {
			return false
		}
	}
	return true
}

// finishedStage: l is a stage slot whose holder is done with it
// (sim.StageSlotFinished, amendment 31).
func finishedStage(ctx context.Context, f *Fleet, pool string, l *coordinationv1.Lease) bool {
	if l.Spec.HolderIdentity == nil {
		return false
	}
	var kn corev1.Node
	var bn fleetv1.BootcNode
	holder := client.ObjectKey{Name: *l.Spec.HolderIdentity}
	if f.Env.Client.Get(ctx, holder, &kn) != nil || f.Env.Client.Get(ctx, holder, &bn) != nil {
		return false
	}
	return sim.StageSlotFinished(pool, l, &kn, &bn)
}

// poolEvents are the notes of the Events with reason about node, as the
// coordinator records them (events.k8s.io, on the Node).
func poolEvents(ctx context.Context, t *testing.T, f *Fleet, reason, node string) []string {
	t.Helper()
	evs, err := f.Kube.EventsV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if e.Reason == reason && e.Regarding.Kind == "Node" && e.Regarding.Name == node {
			out = append(out, e.Note)
		}
	}
	return out
}
