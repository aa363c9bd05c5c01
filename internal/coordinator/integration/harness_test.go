// Package integration runs the coordinator in-process against a real
// kube-apiserver + etcd (tests/envtest). Test code plays the kubelets (Node
// Ready and boot ID, finishing pod deletions) and the agents (BootcNode
// status, staging and rebooting only under valid grants, as the design says).
package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

var env *envtest.Env

func TestMain(m *testing.M) {
	if ok, why := envtest.Available(); !ok {
		if os.Getenv("BOOTC_FLEET_REQUIRE_ENVTEST") == "1" {
			fmt.Fprintln(os.Stderr, "API server required but unavailable:", why)
			os.Exit(1)
		}
		fmt.Println("skipping internal/coordinator/integration: no API server:", why)
		os.Exit(0)
	}
	var err error
	if env, err = envtest.StartShared(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	env.Stop()
	os.Exit(code)
}

const tick = 40 * time.Millisecond

func digestOf(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

func pinned(repo string, c byte) imageref.Pinned {
	return imageref.Pinned{Repository: repo, Digest: digestOf(c)}
}

// newBootID returns a fresh valid boot ID.
func newBootID(node string, boot int) string {
	h := uint32(2166136261)
	for _, c := range node {
		h = (h ^ uint32(c)) * 16777619
	}
	return fmt.Sprintf("%08x-0000-4000-8000-%012x", h, boot)
}

// startCoordinator runs a coordinator in-process until the test ends (or
// stop is called).
func startCoordinator(t *testing.T, name string, mutate func(*controller.Options)) (stop func()) {
	t.Helper()
	return startCoordinatorAs(t, env.Config, name, mutate)
}

// startCoordinatorAs runs a coordinator with the identity cfg carries.
func startCoordinatorAs(t *testing.T, cfg *rest.Config, name string, mutate func(*controller.Options)) (stop func()) {
	t.Helper()
	opts := controller.Options{
		Name:                 name,
		RequeueInterval:      time.Second,
		ResolveInterval:      300 * time.Millisecond,
		ResolveRetryInterval: 300 * time.Millisecond,
		LeaseDuration:        time.Minute,
	}
	if mutate != nil {
		mutate(&opts)
	}
	c, err := controller.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("coordinator %s: %v", name, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// fleet is a pool's worth of fake nodes: kubelets and agents.
type fleet struct {
	t       *testing.T
	c       client.Client
	pool    string
	label   string
	initial imageref.Pinned

	mu    sync.Mutex
	nodes map[string]*fakeNode
	// observed, for the invariant checks
	maxReboot, maxCordoned int
	rebootGrants           map[string]map[string]bool // node -> grant IDs seen in phase Reboot or Draining
	grantImages            map[string]map[string]bool // node -> images of every grant it held
	violations             []string
	// peel plays bootc on a multi-arch index: told to switch to an index
	// digest (key), a node stages its architecture's image in it.
	peel map[string]map[string]imageref.Pinned
	// host, when set, plays the agent's host report (status.host) from
	// what the node runs; withRollback makes the agents report their
	// rollback deployment and roll back under a rollback grant.
	host         func(fn *fakeNode) *fleetv1.HostHealth
	withRollback bool
}

type fakeNode struct {
	name    string
	arch    string // Node.status.nodeInfo.architecture (with os linux), if set
	boot    int
	booted  imageref.Pinned
	staged  imageref.Pinned
	ready   bool
	back    time.Time // while rebooting: when it comes back
	stuck   bool      // a reboot never comes back
	offline bool      // the agent does not run
	reboots int
	spent   map[lease.ID]bool
	// rollback is what bootc would roll back to (the image booted before
	// the last update); rollingBack: the reboot under way is a rollback;
	// rollbackFails: that reboot comes back on the same image.
	rollback      imageref.Pinned
	rollingBack   bool
	rollbackFails bool
}

func (n *fakeNode) bootID() string { return newBootID(n.name, n.boot) }

func newFleet(t *testing.T, pool string, n int, initial imageref.Pinned) *fleet {
	t.Helper()
	f := &fleet{t: t, c: env.Client, pool: pool, label: "pool-" + pool, initial: initial,
		nodes: map[string]*fakeNode{}, rebootGrants: map[string]map[string]bool{}, grantImages: map[string]map[string]bool{}}
	ctx := context.Background()
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%s-n%02d", pool, i)
		fn := &fakeNode{name: name, boot: 1, booted: initial, ready: true, spent: map[lease.ID]bool{}}
		f.nodes[name] = fn
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"test-pool": f.label}}}
		if err := f.c.Create(ctx, node); err != nil {
			t.Fatal(err)
		}
		f.writeNodeStatus(ctx, fn)
	}
	return f
}

func (f *fleet) writeNodeStatus(ctx context.Context, fn *fakeNode) {
	for {
		var node corev1.Node
		if err := f.c.Get(ctx, client.ObjectKey{Name: fn.name}, &node); err != nil {
			return
		}
		st := corev1.ConditionTrue
		if !fn.ready {
			st = corev1.ConditionFalse
		}
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st, Reason: "FakeKubelet", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		node.Status.NodeInfo.BootID = fn.bootID()
		if fn.arch != "" {
			node.Status.NodeInfo.OperatingSystem, node.Status.NodeInfo.Architecture = "linux", fn.arch
		}
		err := f.c.Status().Update(ctx, &node)
		if err == nil || !apierrors.IsConflict(err) {
			return
		}
	}
}

func (f *fleet) createPool(mutate func(*fleetv1.BootcNodePool)) *fleetv1.BootcNodePool {
	p := &fleetv1.BootcNodePool{
		ObjectMeta: metav1.ObjectMeta{Name: f.pool},
		Spec: fleetv1.BootcNodePoolSpec{
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"test-pool": f.label}},
			Rollout: fleetv1.RolloutSpec{
				MaxUnavailable: ptr.To(intstr.FromInt32(1)),
				MaxStaging:     ptr.To(intstr.FromString("100%")),
				DrainTimeout:   &metav1.Duration{Duration: 5 * time.Second},
				RebootTimeout:  &metav1.Duration{Duration: time.Minute},
			},
		},
	}
	mutate(p)
	if err := f.c.Create(context.Background(), p); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = f.c.Delete(context.Background(), p) })
	return p
}

// run plays kubelets and agents and checks the budget until ctx ends.
func (f *fleet) run(ctx context.Context, maxUnavailable int) {
	go func() {
		tk := time.NewTicker(tick)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
			f.check(ctx, maxUnavailable)
			f.mu.Lock()
			names := make([]string, 0, len(f.nodes))
			for name := range f.nodes {
				names = append(names, name)
			}
			f.mu.Unlock()
			sort.Strings(names)
			for _, name := range names {
				f.step(ctx, name)
			}
		}
	}()
}

func (f *fleet) leases(ctx context.Context) []coordinationv1.Lease {
	var ls coordinationv1.LeaseList
	if err := f.c.List(ctx, &ls, client.InNamespace(lease.Namespace), client.MatchingLabels{lease.LabelPool: f.pool}); err != nil {
		return nil
	}
	return ls.Items
}

// check records one observed instant: reboot slots held and nodes cordoned.
func (f *fleet) check(ctx context.Context, maxUnavailable int) {
	held := 0
	ls := f.leases(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range ls {
		g, err := lease.Parse(&ls[i])
		if err == nil {
			if f.grantImages[g.Holder] == nil {
				f.grantImages[g.Holder] = map[string]bool{}
			}
			f.grantImages[g.Holder][g.Image.String()] = true
		}
		if err != nil || g.Kind != lease.KindReboot {
			continue
		}
		held++
		if f.rebootGrants[g.Holder] == nil {
			f.rebootGrants[g.Holder] = map[string]bool{}
		}
		f.rebootGrants[g.Holder][g.ID.String()+"/"+string(g.UID)] = true
	}
	var nodes corev1.NodeList
	if err := f.c.List(ctx, &nodes, client.MatchingLabels{"test-pool": f.label}); err != nil {
		return
	}
	cordoned := 0
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable {
			cordoned++
		}
	}
	f.maxReboot, f.maxCordoned = max(f.maxReboot, held), max(f.maxCordoned, cordoned)
	if maxUnavailable > 0 && (held > maxUnavailable || cordoned > maxUnavailable) {
		f.violations = append(f.violations, fmt.Sprintf("%s: %d reboot slots held, %d nodes cordoned > maxUnavailable %d", time.Now().Format(time.StampMilli), held, cordoned, maxUnavailable))
	}
}

// step plays one node's kubelet and agent for one tick.
func (f *fleet) step(ctx context.Context, name string) {
	f.mu.Lock()
	fn := f.nodes[name]
	var stuck, offline bool
	if fn != nil {
		stuck, offline = fn.stuck, fn.offline // tests set them under f.mu
	}
	f.mu.Unlock()
	if fn == nil {
		return
	}
	f.finishPodDeletions(ctx, name)
	if !fn.back.IsZero() {
		if stuck || time.Now().Before(fn.back) {
			return
		}
		// The machine comes back: a new boot, on what was staged. Fields
		// change under f.mu (the test reads them); only this goroutine
		// writes them, so it reads them without the lock.
		f.mu.Lock()
		fn.back = time.Time{}
		fn.boot++
		switch {
		case fn.rollingBack:
			// bootc rollback swapped the pair, unless the host failed it.
			if !fn.rollbackFails {
				fn.booted, fn.rollback = fn.rollback, fn.booted
			}
			fn.rollingBack = false
		case fn.staged.Digest != "":
			fn.rollback = fn.booted
			fn.booted, fn.staged = fn.staged, imageref.Pinned{}
		}
		fn.ready = true
		f.mu.Unlock()
		f.writeNodeStatus(ctx, fn)
	}
	if offline {
		return
	}
	var bn fleetv1.BootcNode
	if err := f.c.Get(ctx, client.ObjectKey{Name: name}, &bn); err != nil {
		return
	}
	phase := fleetv1.PhaseWaiting
	desired, derr := imageref.ParsePinned(bn.Spec.DesiredImage)
	grants := f.grants(ctx, name)
	check := func(a lease.Action, g lease.Grant) bool {
		// The fake's heartbeat is its last report (it reports on every change
		// and at least every 15s).
		hb := g.Acquired
		if bn.Status.LastReportTime != nil {
			hb = bn.Status.LastReportTime.Time
		}
		return g.Allows(lease.Check{Node: name, Action: a, Image: desired.String(), BootID: fn.bootID(), Now: time.Now(), LastHeartbeat: hb}) == nil
	}
	if f.rollBack(ctx, &bn, fn, grants, check) {
		return
	}
	switch {
	case derr != nil || desired == fn.booted:
		phase = fleetv1.PhaseIdle
	case desired == fn.staged:
		phase = fleetv1.PhaseStaged
		for _, g := range grants {
			if g.Kind == lease.KindReboot && check(lease.ActionReboot, g) && !fn.spent[g.ID] {
				f.mu.Lock()
				fn.spent[g.ID] = true
				fn.reboots++
				fn.ready = false
				fn.back = time.Now().Add(300 * time.Millisecond)
				f.mu.Unlock()
				f.report(ctx, &bn, fn, fleetv1.PhaseRebooting)
				f.writeNodeStatus(ctx, fn)
				return
			}
		}
	default:
		for _, g := range grants {
			if g.Kind == lease.KindStage && check(lease.ActionStage, g) {
				f.mu.Lock()
				fn.staged = desired
				if img, ok := f.peel[desired.Digest][fn.arch]; ok {
					fn.staged = img // bootc reports the platform image, never the index
				}
				f.mu.Unlock()
				phase = fleetv1.PhaseStaged
			}
		}
	}
	f.report(ctx, &bn, fn, phase)
}

// rollBack plays the agent under a valid rollback grant (amendment 25):
// bootc rollback, then a reboot into the rollback deployment, once per
// grant. It reports whether the node went down.
func (f *fleet) rollBack(ctx context.Context, bn *fleetv1.BootcNode, fn *fakeNode, grants []lease.Grant, check func(lease.Action, lease.Grant) bool) bool {
	for _, g := range grants {
		if g.Kind != lease.KindReboot || !g.Rollback || fn.spent[g.ID] || fn.rollback.Digest == "" || g.Image != fn.rollback || !check(lease.ActionRollback, g) {
			continue
		}
		f.mu.Lock()
		fn.spent[g.ID] = true
		fn.reboots++
		fn.ready = false
		fn.rollingBack = true
		fn.back = time.Now().Add(300 * time.Millisecond)
		f.mu.Unlock()
		f.report(ctx, bn, fn, fleetv1.PhaseRebooting)
		f.writeNodeStatus(ctx, fn)
		return true
	}
	return false
}

func (f *fleet) grants(ctx context.Context, node string) []lease.Grant {
	var ls coordinationv1.LeaseList
	if err := f.c.List(ctx, &ls, client.InNamespace(lease.Namespace), client.MatchingLabels{lease.LabelHolder: node}); err != nil {
		return nil
	}
	var out []lease.Grant
	for i := range ls.Items {
		if g, err := lease.Parse(&ls.Items[i]); err == nil {
			out = append(out, g)
		}
	}
	return out
}

func deployment(p imageref.Pinned, downloadOnly bool) *fleetv1.Deployment {
	if p.Digest == "" {
		return nil
	}
	return &fleetv1.Deployment{Image: p.String(), Digest: p.Digest, DownloadOnly: downloadOnly}
}

func (f *fleet) report(ctx context.Context, bn *fleetv1.BootcNode, fn *fakeNode, phase fleetv1.NodePhase) {
	st := fleetv1.BootcNodeStatus{
		ObservedGeneration: bn.Generation,
		BootID:             fn.bootID(),
		Booted:             deployment(fn.booted, false),
		Staged:             deployment(fn.staged, true),
		Phase:              phase,
		LastReportTime:     &metav1.MicroTime{Time: time.Now()},
	}
	if f.withRollback {
		st.Rollback = deployment(fn.rollback, false)
	}
	if f.host != nil {
		st.Host = f.host(fn)
	}
	// Like the agent: list the grants held in this boot; a report is a
	// heartbeat, sent at least 4 times per lease duration.
	for _, g := range f.grants(ctx, fn.name) {
		if g.BootID == st.BootID {
			st.Grants = append(st.Grants, fleetv1.GrantInUse{Lease: g.Lease, UID: g.UID, LeaseTransitions: g.Transitions})
		}
	}
	sort.Slice(st.Grants, func(i, j int) bool { return st.Grants[i].Lease < st.Grants[j].Lease })
	last := bn.Status.LastReportTime
	if equalStatus(st, bn.Status) && last != nil && time.Since(last.Time) < 15*time.Second {
		return
	}
	bn.Status = st
	if err := f.c.Status().Update(ctx, bn); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		f.t.Logf("agent %s: %v", fn.name, err)
	}
}

func equalStatus(a, b fleetv1.BootcNodeStatus) bool {
	d := func(x *fleetv1.Deployment) string {
		if x == nil {
			return ""
		}
		return fmt.Sprint(x.Digest, x.DownloadOnly)
	}
	return a.BootID == b.BootID && a.Phase == b.Phase && d(a.Booted) == d(b.Booted) && d(a.Staged) == d(b.Staged) &&
		a.ObservedGeneration == b.ObservedGeneration && fmt.Sprint(a.Grants) == fmt.Sprint(b.Grants) &&
		d(a.Rollback) == d(b.Rollback) && fmt.Sprint(a.Host) == fmt.Sprint(b.Host)
}

// finishPodDeletions plays the kubelet: pods being deleted on the node go away.
func (f *fleet) finishPodDeletions(ctx context.Context, node string) {
	var pods corev1.PodList
	if err := f.c.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node}); err != nil {
		return
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil {
			_ = f.c.Delete(ctx, p, client.GracePeriodSeconds(0))
		}
	}
}

func (f *fleet) node(name string) *fakeNode {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodes[name]
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s: %s", what, last)
}

func (f *fleet) getPool() *fleetv1.BootcNodePool {
	var p fleetv1.BootcNodePool
	if err := f.c.Get(context.Background(), client.ObjectKey{Name: f.pool}, &p); err != nil {
		f.t.Fatal(err)
	}
	return &p
}

func (f *fleet) condition(typ string) metav1.Condition {
	c := meta.FindStatusCondition(f.getPool().Status.Conditions, typ)
	if c == nil {
		return metav1.Condition{}
	}
	return *c
}

// allOn waits until every node of the fleet booted img.
func (f *fleet) allOn(t *testing.T, img imageref.Pinned, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "every node booted on "+img.String(), func() (bool, string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		var behind []string
		for name, n := range f.nodes {
			if n.booted != img {
				behind = append(behind, name)
			}
		}
		sort.Strings(behind)
		return len(behind) == 0, fmt.Sprintf("not yet: %v; pool status %+v", behind, f.getPool().Status)
	})
}

// events returns the pool's Events with reason.
func events(t *testing.T, pool, reason string) []string {
	t.Helper()
	var evs eventsv1.EventList
	if err := env.Client.List(context.Background(), &evs); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		// The pool's own Events, and those about its nodes (recorded on
		// the Node with the pool as related object; Warnings also on the
		// pool): each note once.
		onPool := e.Regarding.Name == pool && e.Regarding.Kind == "BootcNodePool"
		onNode := e.Regarding.Kind == "Node" && e.Related != nil && e.Related.Name == pool && e.Related.Kind == "BootcNodePool"
		if (onPool || onNode) && e.Reason == reason && !slices.Contains(out, e.Note) {
			out = append(out, e.Note)
		}
	}
	return out
}

func (f *fleet) assertBudgetHeld(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.violations) > 0 {
		t.Fatalf("budget exceeded at %d observed instants, first: %s", len(f.violations), f.violations[0])
	}
}

// assertOneRebootEach: every node rebooted exactly once, under one grant.
func (f *fleet) assertRebootsEach(t *testing.T, want int) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, n := range f.nodes {
		if n.reboots != want {
			t.Errorf("node %s rebooted %d times, want %d", name, n.reboots, want)
		}
		if got := len(f.rebootGrants[name]); got != want {
			t.Errorf("node %s got %d reboot grants %v, want %d", name, got, f.rebootGrants[name], want)
		}
	}
}

func isConflict(err error) bool { return apierrors.IsConflict(err) }

func allEvents(t *testing.T, pool string) []string {
	var evs eventsv1.EventList
	if err := env.Client.List(context.Background(), &evs); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if e.Regarding.Name == pool {
			out = append(out, e.Reason+": "+e.Note)
		}
	}
	return out
}

func clientKey(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }
