package agent_test

import (
	"context"
	"errors"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/decide"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/record"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
)

var (
	imgV1 = "quay.io/example/os@sha256:" + strings.Repeat("1", 64)
	imgV2 = "quay.io/example/os@sha256:" + strings.Repeat("2", 64)
)

// memAPI is agent.API over controller-runtime's fake client: the runner's
// tests need no API server. It models what the agent relies on: the
// server assigns a UID on create, a status merge patch changes only the
// status, and every write of the spec or a Lease wakes the agent (as its
// informers do); the agent's own status writes do not.
type memAPI struct {
	c     client.WithWatch
	node  string
	pokes chan struct{}

	mu sync.Mutex
	// refuseReads makes every consistent read of a Lease fail with 403.
	refuseReads bool
	reads       int
	writes      []fleetv1.BootcNodeStatus
}

func newMemAPI(t *testing.T, node string) *memAPI {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := fleetv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := coordinationv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	a := &memAPI{node: node, pokes: make(chan struct{}, 1)}
	wrote := func(err error) error {
		if err == nil {
			a.poke()
		}
		return err
	}
	a.c = fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&fleetv1.BootcNode{}).
		WithInterceptorFuncs(interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
				if o.GetUID() == "" {
					o.SetUID(uuid.NewUUID()) // as the API server does
				}
				return wrote(c.Create(ctx, o, opts...))
			},
			Update: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
				return wrote(c.Update(ctx, o, opts...))
			},
			Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
				return wrote(c.Delete(ctx, o, opts...))
			},
		}).Build()
	return a
}

func (a *memAPI) poke() {
	select {
	case a.pokes <- struct{}{}:
	default:
	}
}

func (a *memAPI) Start(context.Context)    {}
func (a *memAPI) Synced() bool             { return true }
func (a *memAPI) Changed() <-chan struct{} { return a.pokes }
func (a *memAPI) Host() string             { return "memory" }
func (a *memAPI) ListErrors() map[string]error {
	return map[string]error{}
}
func (a *memAPI) ClearListError(string) {}
func (a *memAPI) SlotsError() error     { return nil }

func (a *memAPI) BootcNode() *fleetv1.BootcNode {
	n := &fleetv1.BootcNode{}
	if err := a.c.Get(context.Background(), client.ObjectKey{Name: a.node}, n); err != nil {
		return nil
	}
	return n
}

func (a *memAPI) Leases() []*coordinationv1.Lease {
	var l coordinationv1.LeaseList
	if err := a.c.List(context.Background(), &l, client.InNamespace(lease.Namespace),
		client.MatchingLabels{lease.LabelHolder: a.node}); err != nil {
		return nil
	}
	out := make([]*coordinationv1.Lease, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, &l.Items[i])
	}
	return out
}

func (a *memAPI) ReadLease(ctx context.Context, name string) (*coordinationv1.Lease, error) {
	a.mu.Lock()
	a.reads++
	refuse := a.refuseReads
	a.mu.Unlock()
	if refuse {
		return nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), name, errors.New("refused by the test"))
	}
	l := &coordinationv1.Lease{}
	if err := a.c.Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: name}, l); err != nil {
		return nil, err
	}
	return l, nil
}

func (a *memAPI) PatchStatus(ctx context.Context, body []byte) error {
	n := &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: a.node}}
	if err := a.c.Status().Patch(ctx, n, client.RawPatch(types.MergePatchType, body)); err != nil {
		return err
	}
	a.mu.Lock()
	a.writes = append(a.writes, n.Status)
	a.mu.Unlock()
	return nil
}

// status is the BootcNode's status as last written.
func (a *memAPI) status() fleetv1.BootcNodeStatus {
	if n := a.BootcNode(); n != nil {
		return n.Status
	}
	return fleetv1.BootcNodeStatus{}
}

// countHost counts reboot requests; the test plays the reboot on the machine.
type countHost struct {
	m        *testbootc.Machine
	mu       sync.Mutex
	reboots  int
	softOnes int
}

func (h *countHost) BootID() (string, error) { return h.m.BootID(), nil }
func (h *countHost) SoftRebootsCount(context.Context) (uint32, bool, error) {
	return h.m.State().SoftRebootCount, true, nil
}
func (h *countHost) Reboot(context.Context) error {
	h.mu.Lock()
	h.reboots++
	h.mu.Unlock()
	return nil
}
func (h *countHost) SoftReboot(context.Context) error {
	h.mu.Lock()
	h.softOnes++
	h.mu.Unlock()
	return nil
}
func (h *countHost) count() int { h.mu.Lock(); defer h.mu.Unlock(); return h.reboots + h.softOnes }

// unit is one agent run against memAPI and an in-memory test bootc.
type unit struct {
	t     *testing.T
	api   *memAPI
	m     *testbootc.Machine
	host  *countHost
	k     *testcoord.Coordinator
	state string
	steps chan agent.Step
}

func startUnit(t *testing.T, node string) *unit {
	t.Helper()
	return startUnitWith(t, node, func(*agent.Config) {})
}

// startUnitWith is startUnit with the agent's configuration changed by set.
func startUnitWith(t *testing.T, node string, set func(*agent.Config)) *unit {
	t.Helper()
	m, err := testbootc.NewBooted(imgV1)
	if err != nil {
		t.Fatal(err)
	}
	u := &unit{t: t, api: newMemAPI(t, node), m: m, host: &countHost{m: m}, state: t.TempDir(), steps: make(chan agent.Step, 64)}
	u.k = &testcoord.Coordinator{C: u.api.c, Pool: "pool-" + node}
	if err := u.k.EnsureBootcNode(context.Background(), node, imgV2, ""); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg := agent.Config{NodeName: node, StateDir: u.state, PollInterval: 2 * time.Second,
		RereadInterval: 50 * time.Millisecond, SettleTimeout: time.Minute, WaitingHold: time.Millisecond, Version: "test"}
	set(&cfg)
	go func() {
		done <- agent.Run(ctx, cfg, agent.Deps{API: u.api, Bootc: &bootc.CLI{Runner: testbootc.NewMem(m)}, Host: u.host,
			Log:   slog.New(slog.NewTextHandler(testLog{t}, nil)),
			Trace: func(s agent.Step) { u.steps <- s }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return u
}

func (u *unit) wait(what string, ok func(fleetv1.BootcNodeStatus) bool) fleetv1.BootcNodeStatus {
	u.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := u.api.status()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			u.t.Fatalf("timed out waiting for %s; status %s/%s: %s", what, st.Phase, st.Reason, st.Message)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The runner against an in-memory API: it stages only under a stage grant
// of this boot, reboots exactly once under a reboot grant in phase Reboot,
// each disruptive step right after its grant was confirmed, and reports the
// node up to date in the new boot.
func TestRunnerStagesAndRebootsOnceUnderGrants(t *testing.T) {
	u := startUnit(t, "unit-a")
	ctx := context.Background()
	boot1 := u.m.BootID()
	u.wait("Waiting without a grant", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))
	if _, err := u.k.Grant(ctx, lease.KindStage, 0, "unit-a", imgV2, boot1, ""); err != nil {
		t.Fatal(err)
	}
	u.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant))
	if s := u.m.State().Staged; s == nil || s.Image != imgV2 || !s.DownloadOnly {
		t.Fatalf("staged = %+v, want %s download-only", s, imgV2)
	}
	if err := u.k.Revoke(ctx, lease.KindStage, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := u.k.Grant(ctx, lease.KindReboot, 0, "unit-a", imgV2, boot1, lease.PhaseReboot); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for u.host.count() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if u.host.count() != 1 {
		t.Fatalf("%d reboot requests, want 1", u.host.count())
	}
	// The reboot wrote no report of its own (amendment 37).
	u.api.mu.Lock()
	for _, w := range u.api.writes {
		if w.Phase == fleetv1.PhaseRebooting {
			t.Errorf("a report said %s/%s before the reboot: %s", w.Phase, w.Reason, w.Message)
		}
	}
	u.api.mu.Unlock()
	rec, err := record.Store{Dir: u.state}.Read()
	if err != nil || rec == nil || rec.Image != imgV2 || rec.BootID != boot1 {
		t.Fatalf("reboot record = %+v, %v", rec, err)
	}
	u.m.Reboot(testbootc.RebootOptions{})
	u.wait("Idle on the new image", testcoord.PhaseIs(fleetv1.PhaseIdle, fleetv1.ReasonUpToDate))
	if u.host.count() != 1 {
		t.Fatalf("%d reboot requests, want 1", u.host.count())
	}
	var kinds []string
	for len(u.steps) > 0 {
		kinds = append(kinds, (<-u.steps).Kind)
	}
	if strings.Join(kinds, ",") != "stage,stage-ended,apply,reboot" {
		t.Fatalf("traced steps %v, want stage, stage-ended, apply, reboot", kinds)
	}
}

// A host slow to go down after the reboot request: the agent wrote no report
// for the reboot (amendment 37), but the report its pace makes due says
// Rebooting, so the BootcNode does not go quiet on Staged.
func TestRunnerReportsARebootOnlyWhenThePaceAsks(t *testing.T) {
	u := startUnitWith(t, "unit-slow", func(c *agent.Config) { c.ActiveReportInterval = time.Second })
	u.stageThenGrantReboot("unit-slow")
	u.waitReboots(1)
	u.api.mu.Lock()
	before := len(u.api.writes)
	for _, w := range u.api.writes {
		if w.Phase == fleetv1.PhaseRebooting {
			t.Errorf("a report said %s/%s when the reboot was asked for: %s", w.Phase, w.Reason, w.Message)
		}
	}
	u.api.mu.Unlock()
	// The machine is never rebooted here: the host stays up.
	st := u.wait("the paced report", testcoord.PhaseIs(fleetv1.PhaseRebooting, fleetv1.ReasonRebooting))
	if !strings.Contains(st.Message, "waiting for the host to go down") {
		t.Errorf("paced report says %q, want the wait for the host", st.Message)
	}
	u.api.mu.Lock()
	n := len(u.api.writes) - before
	u.api.mu.Unlock()
	if n < 1 {
		t.Fatalf("no status write after the reboot request")
	}
	if r := u.host.count(); r != 1 {
		t.Fatalf("%d reboot requests, want 1", r)
	}
}

// A grant the consistent read does not show (here: the read is refused) is
// never acted on: no stage, and the APIAccess condition says why.
func TestRunnerRefusedConfirmNeverStages(t *testing.T) {
	u := startUnit(t, "unit-b")
	u.k.LeaseSeconds = 8 // the re-seen grant's first heartbeat comes within 2 s
	u.api.mu.Lock()
	u.api.refuseReads = true
	u.api.mu.Unlock()
	if _, err := u.k.Grant(context.Background(), lease.KindStage, 0, "unit-b", imgV2, u.m.BootID(), ""); err != nil {
		t.Fatal(err)
	}
	u.wait("the refusal on the BootcNode", func(s fleetv1.BootcNodeStatus) bool {
		for _, c := range s.Conditions {
			if c.Type == fleetv1.ConditionAPIAccess && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "get lease") {
				return true
			}
		}
		return false
	})
	if s := u.m.State().Staged; s != nil {
		t.Fatalf("staged %+v under a grant no read confirmed", s)
	}
	if len(u.steps) != 0 {
		t.Fatalf("a step was taken: %+v", <-u.steps)
	}
	// Once reads work again, the grant is confirmed and the stage runs.
	u.api.mu.Lock()
	u.api.refuseReads = false
	u.api.mu.Unlock()
	if _, err := u.k.Grant(context.Background(), lease.KindStage, 0, "unit-b", imgV2, u.m.BootID(), ""); err != nil {
		t.Fatal(err)
	}
	u.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant))
}

// A stage whose grant is revoked is cancelled (bootc is stopped), and the
// node waits for a slot again.
func TestRunnerCancelsStageOnRevoke(t *testing.T) {
	u := startUnit(t, "unit-c")
	u.m.Configure(func(k *testbootc.Knobs) { k.SwitchHang = true })
	if _, err := u.k.Grant(context.Background(), lease.KindStage, 0, "unit-c", imgV2, u.m.BootID(), ""); err != nil {
		t.Fatal(err)
	}
	u.wait("Staging", testcoord.PhaseIs(fleetv1.PhaseStaging, fleetv1.ReasonStaging))
	select {
	case s := <-u.steps:
		if s.Kind != decide.StepStage {
			t.Fatalf("first step %q, want stage", s.Kind)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no stage started")
	}
	if err := u.k.Revoke(context.Background(), lease.KindStage, 0); err != nil {
		t.Fatal(err)
	}
	u.wait("Waiting again", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))
	if s := u.m.State().Staged; s != nil {
		t.Fatalf("staged %+v after the cancel", s)
	}
	select {
	case s := <-u.steps:
		if s.Kind != agent.StepStageEnded || s.Outcome != agent.StageCancelled || s.Image != imgV2 {
			t.Fatalf("step after the revoke %+v, want the stage of %s ended cancelled", s, imgV2)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled stage was not traced")
	}
}

// A node whose update is rolled back: under a rollback grant for its
// rollback deployment (v1) the agent records the rollback, runs `bootc
// rollback` once, right after the grant was confirmed, reboots once more,
// and reports the node up to date on v1 in the new boot (amendment 25). A
// rollback grant for an image that is not the rollback deployment is not
// acted on.
func TestRunnerRollsBackOnceUnderARollbackGrant(t *testing.T) {
	u := startUnit(t, "unit-r")
	ctx := context.Background()
	u.stageThenGrantReboot("unit-r")
	u.waitReboots(1)
	boot2 := u.m.Reboot(testbootc.RebootOptions{})
	u.wait("Idle on v2", testcoord.PhaseIs(fleetv1.PhaseIdle, fleetv1.ReasonUpToDate))
	if rb := u.m.State().Rollback; rb == nil || rb.Image != imgV1 {
		t.Fatalf("rollback deployment %+v, want %s", rb, imgV1)
	}
	drain(u.steps)

	// A rollback grant for v3, which is not the rollback deployment: nothing.
	if err := u.k.EnsureBootcNode(ctx, "unit-r", imgV1, ""); err != nil {
		t.Fatal(err)
	}
	imgV3 := "quay.io/example/os@sha256:" + strings.Repeat("3", 64)
	if _, err := u.k.GrantRollback(ctx, 0, "unit-r", imgV3, boot2); err != nil {
		t.Fatal(err)
	}
	u.wait("RollbackImageMismatch", testcoord.PhaseIs(fleetv1.PhaseDegraded, fleetv1.ReasonRollbackImageMismatch))
	if st := u.m.State(); st.RollbackQueued || u.host.count() != 1 {
		t.Fatalf("acted on a rollback grant for another image: queued %v, %d reboots", st.RollbackQueued, u.host.count())
	}

	// The rollback grant for v1, the rollback deployment.
	if _, err := u.k.GrantRollback(ctx, 0, "unit-r", imgV1, boot2); err != nil {
		t.Fatal(err)
	}
	u.waitReboots(2)
	if st := u.m.State(); !st.RollbackQueued {
		t.Fatalf("rebooted without the rollback queued: %+v", st)
	}
	rec, err := record.Store{Dir: u.state}.Read()
	if err != nil || rec == nil || !rec.Rollback || rec.Image != imgV1 || rec.BootID != boot2 {
		t.Fatalf("reboot record = %+v, %v; want a rollback to %s in boot %s", rec, err, imgV1, boot2)
	}
	u.m.Reboot(testbootc.RebootOptions{})
	u.wait("Idle on v1", testcoord.PhaseIs(fleetv1.PhaseIdle, fleetv1.ReasonUpToDate))
	if st := u.m.State(); st.Booted == nil || st.Booted.Image != imgV1 {
		t.Fatalf("booted %+v after the rollback, want %s", st.Booted, imgV1)
	}
	if u.host.count() != 2 {
		t.Fatalf("%d reboot requests, want 2 (update, rollback)", u.host.count())
	}
	if kinds := strings.Join(drain(u.steps), ","); kinds != "rollback,reboot" {
		t.Fatalf("traced steps %s, want rollback, reboot", kinds)
	}
}

// waitReboots waits until the host was asked to reboot n times.
// stageThenGrantReboot plays the coordinator for one update of node to v2:
// a stage grant, its release once the node is Staged, a reboot grant in
// phase Reboot. It returns the boot the grants were issued in.
func (u *unit) stageThenGrantReboot(node string) string {
	u.t.Helper()
	ctx := context.Background()
	boot := u.m.BootID()
	if _, err := u.k.Grant(ctx, lease.KindStage, 0, node, imgV2, boot, ""); err != nil {
		u.t.Fatal(err)
	}
	u.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant))
	if err := u.k.Revoke(ctx, lease.KindStage, 0); err != nil {
		u.t.Fatal(err)
	}
	if _, err := u.k.Grant(ctx, lease.KindReboot, 0, node, imgV2, boot, lease.PhaseReboot); err != nil {
		u.t.Fatal(err)
	}
	return boot
}

func (u *unit) waitReboots(n int) {
	u.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for u.host.count() < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if c := u.host.count(); c != n {
		st := u.api.status()
		u.t.Fatalf("%d reboot requests, want %d; status %s/%s: %s", c, n, st.Phase, st.Reason, st.Message)
	}
}

// drain returns the kinds of the steps traced so far.
func drain(steps chan agent.Step) []string {
	var kinds []string
	for len(steps) > 0 {
		kinds = append(kinds, (<-steps).Kind)
	}
	return kinds
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
