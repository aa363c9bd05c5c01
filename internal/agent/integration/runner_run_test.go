package integration_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/integration"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/record"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
)

// sharedEnv is the API server this package's TestMain started (with the
// agent's RBAC and admission policies applied).
func sharedEnv() *envtest.Env { return integration.SharedEnv() }

var (
	imgV1 = "quay.io/example/os@sha256:" + strings.Repeat("1", 64)
	imgV2 = "quay.io/example/os@sha256:" + strings.Repeat("2", 64)
	imgV3 = "quay.io/example/os@sha256:" + strings.Repeat("3", 64)
)

// memBootc is the agent's real bootc CLI over an in-memory test bootc, so
// the command lines the agent runs meet bootc's own parsing, messages and
// sysroot lock.
type memBootc struct {
	*bootc.CLI
	m        *testbootc.Machine
	mem      *testbootc.Mem
	mu       sync.Mutex
	stages   []string
	applies  []bootc.SoftReboot
	canceled int
	// counting, when set, says whether a bootc status read now is counted
	// in reads.
	counting func() bool
	reads    int
}

func (b *memBootc) Status(ctx context.Context) (bootc.Status, error) {
	b.mu.Lock()
	if b.counting != nil && b.counting() {
		b.reads++
	}
	b.mu.Unlock()
	return b.CLI.Status(ctx)
}

// countReads counts the bootc status reads from when counting says so.
func (b *memBootc) countReads(counting func() bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.counting, b.reads = counting, 0
}

func (b *memBootc) statusReads() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reads
}

func newMemBootc(m *testbootc.Machine) *memBootc {
	mem := testbootc.NewMem(m)
	return &memBootc{CLI: &bootc.CLI{Runner: mem}, m: m, mem: mem}
}

// hold makes every pull wait until it is cancelled.
func (b *memBootc) hold(on bool) { b.m.Configure(func(k *testbootc.Knobs) { k.SwitchHang = on }) }

func (b *memBootc) Stage(ctx context.Context, img imageref.Pinned, caps bootc.Capabilities, opts bootc.StageOptions) error {
	b.mu.Lock()
	b.stages = append(b.stages, img.String())
	b.mu.Unlock()
	err := b.CLI.Stage(ctx, img, caps, opts)
	if ctx.Err() != nil {
		b.mu.Lock()
		b.canceled++
		b.mu.Unlock()
	}
	return err
}

func (b *memBootc) ApplyStaged(ctx context.Context, mode bootc.SoftReboot) error {
	b.mu.Lock()
	b.applies = append(b.applies, mode)
	b.mu.Unlock()
	return b.CLI.ApplyStaged(ctx, mode)
}

func (b *memBootc) counts() (stages, canceled int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.stages), b.canceled
}

// memHost counts reboot requests; the test plays the reboot on the machine.
type memHost struct {
	m       *testbootc.Machine
	mu      sync.Mutex
	reboots int
	soft    int
}

func (h *memHost) BootID() (string, error) { return h.m.BootID(), nil }
func (h *memHost) SoftRebootsCount(context.Context) (uint32, bool, error) {
	return h.m.State().SoftRebootCount, true, nil
}
func (h *memHost) Reboot(context.Context) error     { h.mu.Lock(); h.reboots++; h.mu.Unlock(); return nil }
func (h *memHost) SoftReboot(context.Context) error { h.mu.Lock(); h.soft++; h.mu.Unlock(); return nil }
func (h *memHost) count() (int, int)                { h.mu.Lock(); defer h.mu.Unlock(); return h.reboots, h.soft }

type memNotifier struct {
	mu    sync.Mutex
	lines []string
}

func (n *memNotifier) add(s string)          { n.mu.Lock(); n.lines = append(n.lines, s); n.mu.Unlock() }
func (n *memNotifier) Ready() error          { n.add("READY=1"); return nil }
func (n *memNotifier) Status(s string) error { n.add("STATUS=" + s); return nil }
func (n *memNotifier) Watchdog() error       { return nil }
func (n *memNotifier) Stopping() error       { n.add("STOPPING=1"); return nil }
func (n *memNotifier) WatchdogInterval() (time.Duration, bool) {
	return 0, false
}

// hasAll: one notification starts with prefix and contains every part.
func (n *memNotifier) hasAll(prefix string, parts ...string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
next:
	for _, l := range n.lines {
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		for _, p := range parts {
			if !strings.Contains(l, p) {
				continue next
			}
		}
		return true
	}
	return false
}

func (n *memNotifier) has(s string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, l := range n.lines {
		if l == s || strings.HasPrefix(l, s) {
			return true
		}
	}
	return false
}

type harness struct {
	t      *testing.T
	node   string
	m      *testbootc.Machine
	bootc  *memBootc
	host   *memHost
	notify *memNotifier
	k      *testcoord.Coordinator
	state  string
	stop   func() error
	log    logLines
	tweak  func(*agent.Config) // nil: the harness's Config as is
}

func start(t *testing.T, node string, settle time.Duration) *harness {
	t.Helper()
	return startWith(t, node, settle, imgV2, nil)
}

// startWith starts an agent on a machine booted on imgV1 whose BootcNode
// asks for desired, with the harness's Config changed by tweak.
func startWith(t *testing.T, node string, settle time.Duration, desired string, tweak func(*agent.Config)) *harness {
	t.Helper()
	envtest.SkipIfUnavailable(t)
	m, err := testbootc.NewBooted(imgV1)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{
		t: t, node: node, m: m,
		bootc:  newMemBootc(m),
		host:   &memHost{m: m},
		notify: &memNotifier{},
		k:      &testcoord.Coordinator{C: sharedEnv().Client, Pool: "pool-" + node},
		state:  t.TempDir(),
		tweak:  tweak,
	}
	if err := h.k.EnsureBootcNode(context.Background(), node, desired, ""); err != nil {
		t.Fatal(err)
	}
	h.run(settle)
	return h
}

func (h *harness) run(settle time.Duration) {
	// The node's own identity, confined as on a production cluster: the
	// agent's RBAC and admission policies, NodeRestriction on.
	root := envtest.RepoRoot()
	if err := envtest.Apply(context.Background(), sharedEnv().Client, filepath.Join(root, "packaging/rbac/agent.yaml"),
		filepath.Join(root, "packaging/policy/agent-policy.yaml")); err != nil {
		h.t.Fatal(err)
	}
	rc, err := sharedEnv().AddUser("system:node:"+h.node, "system:nodes")
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg := agent.Config{
		NodeName: h.node, RESTConfig: rc, StateDir: h.state,
		PollInterval: 5 * time.Second, RereadInterval: 100 * time.Millisecond,
		SettleTimeout: settle, Version: "test",
	}
	if h.tweak != nil {
		h.tweak(&cfg)
	}
	go func() {
		done <- agent.Run(ctx, cfg, agent.Deps{
			Bootc: h.bootc, Host: h.host, Notifier: h.notify,
			Log: slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{h.t}, &h.log), nil)),
		})
	}()
	var once sync.Once
	var runErr error
	h.stop = func() error { once.Do(func() { cancel(); runErr = <-done }); return runErr }
	h.t.Cleanup(func() { _ = h.stop() })
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// logLines keeps the agent's log, for waiting on what it saw.
type logLines struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// has reports whether one logged line contains every part.
func (l *logLines) has(parts ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return testcoord.HasLine(l.b.String(), parts...)
}

func (h *harness) wait(what string, ok func(fleetv1.BootcNodeStatus) bool) fleetv1.BootcNodeStatus {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := h.k.WaitStatus(ctx, h.node, ok)
	if err != nil {
		h.t.Fatalf("%s: %v", what, err)
	}
	return st
}

func (h *harness) until(what string, ok func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRunStagesAndRebootsOnlyUnderGrants(t *testing.T) {
	h := start(t, "mem-a", time.Minute)
	ctx := context.Background()
	boot1 := h.m.BootID()

	st := h.wait("Waiting without a grant", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))
	if n, _ := h.bootc.counts(); n != 0 {
		t.Fatalf("%d switches without a stage grant", n)
	}
	if st.BootID != boot1 || st.Booted == nil || st.Booted.Digest != "sha256:"+strings.Repeat("1", 64) || st.AgentVersion != "test" || st.LastReportTime == nil {
		t.Fatalf("status lacks identity or deployments: %+v", st)
	}
	if !h.notify.has("READY=1") || !h.notify.has("STATUS=Waiting: ") {
		t.Fatalf("notifications: %q", h.notify.lines)
	}

	// A stage grant from another boot is void: the agent neither uses nor
	// lists it (the coordinator hands its slot on, amendment 31).
	other, err := h.k.Grant(ctx, lease.KindStage, 1, h.node, imgV2, testbootc.NewBootID(), "")
	if err != nil {
		t.Fatal(err)
	}

	// Granted in this boot: stage, locked; finished, the grant is listed no more.
	granted, err := h.k.Grant(ctx, lease.KindStage, 0, h.node, imgV2, boot1, "")
	if err != nil {
		t.Fatal(err)
	}
	staged := h.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant))
	if s := h.m.State().Staged; s == nil || s.Image != imgV2 || !s.DownloadOnly {
		t.Fatalf("staged = %+v, want %s download-only", s, imgV2)
	}
	if n, _ := h.bootc.counts(); n != 1 {
		t.Fatalf("%d switches, want 1 (under %s only)", n, granted)
	}
	if st := staged; testcoord.Lists(other, fleetv1.ReasonGrantedInAnotherBoot)(st) || testcoord.Lists(other, "")(st) || testcoord.Lists(granted, "")(st) {
		t.Fatalf("lists %+v: neither the other boot's grant nor the finished one is listed", st.Grants)
	}
	for _, i := range []int{0, 1} {
		if err := h.k.Revoke(ctx, lease.KindStage, i); err != nil {
			t.Fatal(err)
		}
	}

	// Reboot slot while draining: no reboot.
	if _, err := h.k.Grant(ctx, lease.KindReboot, 0, h.node, imgV2, boot1, lease.PhaseDraining); err != nil {
		t.Fatal(err)
	}
	// Nothing to do, nothing to report under it (amendment 18): the agent
	// only logs that it saw it.
	h.until("the reboot grant seen in phase Draining", func() bool {
		return h.log.has(`msg="grant seen"`, "kind=reboot", "phase=Draining")
	})
	if r, _ := h.host.count(); r != 0 {
		t.Fatalf("rebooted in phase Draining")
	}
	st = h.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant))
	for _, g := range st.Grants {
		if g.Lease == lease.SlotName(h.k.Pool, lease.KindReboot, 0) {
			t.Fatalf("reboot grant listed in phase Draining: %+v", st.Grants)
		}
	}
	if err := h.k.SetPhase(ctx, 0, lease.PhaseReboot); err != nil {
		t.Fatal(err)
	}
	h.until("one reboot request", func() bool { r, _ := h.host.count(); return r == 1 })
	rec, err := record.Store{Dir: h.state}.Read()
	if err != nil || rec == nil || rec.Image != imgV2 || rec.BootID != boot1 || rec.Grant.Lease != lease.SlotName(h.k.Pool, lease.KindReboot, 0) {
		t.Fatalf("reboot record = %+v, %v", rec, err)
	}
	if s := h.m.State().Staged; s == nil || s.DownloadOnly {
		t.Fatalf("staged deployment not unlocked before the reboot: %+v", s)
	}

	// The reboot, with a status that still shows the old boot's deployments.
	newBoot := h.m.Reboot(testbootc.RebootOptions{StaleUntilSettle: true})
	h.wait("settling in the new boot", func(s fleetv1.BootcNodeStatus) bool {
		return s.BootID == newBoot && s.Reason == fleetv1.ReasonStatusSettling
	})
	// Meanwhile the coordinator re-grants the old-boot slots: still void.
	if _, err := h.k.Grant(ctx, lease.KindStage, 0, h.node, imgV2, boot1, ""); err != nil {
		t.Fatal(err)
	}
	h.wait("still settling", func(s fleetv1.BootcNodeStatus) bool { return s.Reason == fleetv1.ReasonStatusSettling })
	h.m.Settle()
	h.wait("Idle on the new image", testcoord.PhaseIs(fleetv1.PhaseIdle, fleetv1.ReasonUpToDate))
	if n, _ := h.bootc.counts(); n != 1 {
		t.Fatalf("%d switches, want exactly 1 (no re-stage after the reboot)", n)
	}
	if r, _ := h.host.count(); r != 1 {
		t.Fatalf("%d reboot requests, want 1", r)
	}
	if rec, err := (record.Store{Dir: h.state}).Read(); rec != nil || err != nil {
		t.Fatalf("record not cleared after the reboot: %+v, %v", rec, err)
	}
	if err := h.stop(); err != nil {
		t.Fatalf("Run returned %v on shutdown", err)
	}
	if !h.notify.has("STOPPING=1") {
		t.Fatalf("no STOPPING=1: %q", h.notify.lines)
	}
}

func TestRunCancelsStageOnRevokeAndImageChange(t *testing.T) {
	h := start(t, "mem-b", time.Minute)
	h.bootc.hold(true)
	ctx := context.Background()
	boot := h.m.BootID()
	if _, err := h.k.Grant(ctx, lease.KindStage, 0, h.node, imgV2, boot, ""); err != nil {
		t.Fatal(err)
	}
	h.wait("Staging", testcoord.PhaseIs(fleetv1.PhaseStaging, ""))
	if err := h.k.Revoke(ctx, lease.KindStage, 0); err != nil {
		t.Fatal(err)
	}
	h.until("the stage cancelled on revoke", func() bool { _, c := h.bootc.counts(); return c == 1 })
	h.wait("Waiting after the revoke", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))

	if _, err := h.k.Grant(ctx, lease.KindStage, 0, h.node, imgV2, boot, ""); err != nil {
		t.Fatal(err)
	}
	h.until("a second stage", func() bool { n, _ := h.bootc.counts(); return n == 2 })
	// The pool image changes: the coordinator rewrites desired and grant.
	if err := h.k.EnsureBootcNode(ctx, h.node, imgV3, ""); err != nil {
		t.Fatal(err)
	}
	h.until("the old stage cancelled on image change", func() bool { _, c := h.bootc.counts(); return c == 2 })
	if _, err := h.k.Grant(ctx, lease.KindStage, 0, h.node, imgV3, boot, ""); err != nil {
		t.Fatal(err)
	}
	h.until("a stage of the new image", func() bool { n, _ := h.bootc.counts(); return n == 3 })
	h.bootc.mu.Lock()
	last := h.bootc.stages[len(h.bootc.stages)-1]
	h.bootc.mu.Unlock()
	if last != imgV3 {
		t.Fatalf("last stage was %s, want %s", last, imgV3)
	}
}

func TestRunReportsBootedUnexpectedImageAndNeverReboots(t *testing.T) {
	h := start(t, "mem-c", 500*time.Millisecond)
	ctx := context.Background()
	boot1 := h.m.BootID()
	if _, err := h.k.Grant(ctx, lease.KindStage, 0, h.node, imgV2, boot1, ""); err != nil {
		t.Fatal(err)
	}
	h.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, ""))
	if _, err := h.k.Grant(ctx, lease.KindReboot, 0, h.node, imgV2, boot1, lease.PhaseReboot); err != nil {
		t.Fatal(err)
	}
	h.until("one reboot request", func() bool { r, _ := h.host.count(); return r == 1 })
	// Something replaced the staged deployment with a locked one: the reboot
	// does not enter the granted image.
	if err := h.m.Switch(imgV3); err != nil {
		t.Fatal(err)
	}
	newBoot := h.m.Reboot(testbootc.RebootOptions{})
	st := h.wait("BootedUnexpectedImage", func(s fleetv1.BootcNodeStatus) bool {
		return s.BootID == newBoot && s.Reason == fleetv1.ReasonBootedUnexpectedImage
	})
	if st.Phase != fleetv1.PhaseDegraded {
		t.Fatalf("phase %s, want Degraded", st.Phase)
	}
	// The verdict stays for the boot even with a fresh stage grant, which
	// the Degraded agent lets go of.
	fresh, err := h.k.Grant(ctx, lease.KindStage, 1, h.node, imgV2, newBoot, "")
	if err != nil {
		t.Fatal(err)
	}
	h.wait("the new grant listed as released", testcoord.Lists(fresh, fleetv1.ReasonBootedUnexpectedImage))
	h.wait("still Degraded", testcoord.PhaseIs(fleetv1.PhaseDegraded, fleetv1.ReasonBootedUnexpectedImage))
	if n, _ := h.bootc.counts(); n != 1 {
		t.Fatalf("%d switches, want 1: staged again after an unexpected boot", n)
	}
	if r, _ := h.host.count(); r != 1 {
		t.Fatalf("%d reboots, want 1", r)
	}
	spent, err := record.Store{Dir: h.state}.Spent()
	if err != nil || len(spent) != 1 {
		t.Fatalf("spent = %v, %v; want the reboot grant", spent, err)
	}
}

func TestRunIgnoresMalformedLeases(t *testing.T) {
	h := start(t, "mem-d", time.Minute)
	ctx := context.Background()
	now := metav1.NewMicroTime(time.Now())
	// A held stage slot whose image is a tag: malformed, so never a grant.
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: lease.Namespace, Name: lease.SlotName(h.k.Pool, lease.KindStage, 0),
			Labels:      map[string]string{lease.LabelPool: h.k.Pool, lease.LabelSlot: "stage", lease.LabelHolder: h.node},
			Annotations: map[string]string{lease.AnnotationImage: "quay.io/example/os:latest", lease.AnnotationBootID: h.m.BootID()}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(h.node), AcquireTime: &now, RenewTime: &now,
			LeaseDurationSeconds: ptr.To[int32](30), LeaseTransitions: ptr.To[int32](1)},
	}
	if err := h.k.PutLease(ctx, l); err != nil {
		t.Fatal(err)
	}
	st := h.wait("condition GrantsReadable=False", func(s fleetv1.BootcNodeStatus) bool {
		for _, c := range s.Conditions {
			if c.Type == agent.ConditionGrantsReadable && c.Status == "False" {
				return true
			}
		}
		return false
	})
	if !strings.Contains(st.Message, "malformed") {
		t.Fatalf("message %q does not mention the malformed lease", st.Message)
	}
	if st.Phase != fleetv1.PhaseWaiting {
		t.Fatalf("phase %s with only a malformed grant, want Waiting", st.Phase)
	}
	if n, _ := h.bootc.counts(); n != 0 {
		t.Fatalf("staged under a malformed grant")
	}
	if len(st.Grants) != 0 {
		t.Fatalf("the agent lists a malformed lease as a grant: %+v", st.Grants)
	}
}
