package drain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// shared is one API server for the package's tests; each test works in its
// own namespace and on its own Nodes.
var shared *envtest.Env

// namespaces numbers the tests' namespaces.
var namespaces atomic.Int64

func TestMain(m *testing.M) { envtest.Main(m, &shared) }

// cluster is a test's view of the API server.
type cluster struct {
	t  *testing.T
	cs kubernetes.Interface
	ns string
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	envtest.SkipIfUnavailable(t)
	if shared == nil {
		t.Fatal("API server available but not started")
	}
	cs, err := kubernetes.NewForConfig(shared.Config)
	if err != nil {
		t.Fatal(err)
	}
	// Named after the test and numbered: a namespace is never deleted
	// here (envtest runs no namespace controller), so a second run of a
	// test (-count=2) needs a new one.
	ns := strings.ToLower(strings.ReplaceAll(t.Name(), "_", "-"))
	if len(ns) > 50 {
		ns = ns[:50]
	}
	ns = fmt.Sprintf("%s-%d", strings.Trim(ns, "-"), namespaces.Add(1))
	c := &cluster{t: t, cs: cs, ns: ns}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Nor are its pods, which a later run's Node of the same name would
	// find bound to it: removed for good, as a kubelet would.
	t.Cleanup(func() {
		_ = cs.CoreV1().Pods(ns).DeleteCollection(context.Background(),
			metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{})
	})
	return c
}

func (c *cluster) ctx() context.Context { return c.t.Context() }

func (c *cluster) node(name string, unschedulable bool) {
	c.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Unschedulable: unschedulable}}
	if _, err := c.cs.CoreV1().Nodes().Create(c.ctx(), n, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = c.cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

func (c *cluster) unschedulable(name string) bool {
	c.t.Helper()
	n, err := c.cs.CoreV1().Nodes().Get(c.ctx(), name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return n.Spec.Unschedulable
}

// pod creates a running, ready pod on node; edit may change it first.
func (c *cluster) pod(name, node string, edit func(*corev1.Pod)) *corev1.Pod {
	c.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns, Labels: map[string]string{"pod": name}},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}},
		},
	}
	if edit != nil {
		edit(p)
	}
	p, err := c.cs.CoreV1().Pods(c.ns).Create(c.ctx(), p, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	// No kubelet runs: write what it would, so PodDisruptionBudgets guard
	// the pod (the Eviction API skips budgets for Pending pods).
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	p, err = c.cs.CoreV1().Pods(c.ns).UpdateStatus(c.ctx(), p, metav1.UpdateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

// podsOn returns the names of the pods of the test's namespace on node.
func (c *cluster) podsOn(node string) []string {
	c.t.Helper()
	l, err := c.cs.CoreV1().Pods(c.ns).List(c.ctx(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		c.t.Fatal(err)
	}
	var names []string
	for _, p := range l.Items {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// daemonSet creates a DaemonSet object (no controller runs, so it makes no
// pods) and returns an owner reference to it.
func (c *cluster) daemonSet(name string) metav1.OwnerReference {
	c.t.Helper()
	labels := map[string]string{"ds": name}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example/agent:1"}}},
			},
		},
	}
	ds, err := c.cs.AppsV1().DaemonSets(c.ns).Create(c.ctx(), ds, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: ptr.To(true)}
}

// pdb creates a PodDisruptionBudget over pods labelled app=<app> and writes
// its status as the disruption controller (not running here) would.
func (c *cluster) pdb(name, app string, allowed int32) {
	c.t.Helper()
	p := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
		},
	}
	if _, err := c.cs.PolicyV1().PodDisruptionBudgets(c.ns).Create(c.ctx(), p, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	c.allow(name, allowed)
}

// allow sets a budget's status to permit allowed more disruptions.
func (c *cluster) allow(name string, allowed int32) {
	c.t.Helper()
	p, err := c.cs.PolicyV1().PodDisruptionBudgets(c.ns).Get(c.ctx(), name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	p.Status = policyv1.PodDisruptionBudgetStatus{
		ObservedGeneration: p.Generation,
		DisruptionsAllowed: allowed,
		CurrentHealthy:     1 + allowed,
		DesiredHealthy:     1,
		ExpectedPods:       1 + allowed,
	}
	if _, err := c.cs.PolicyV1().PodDisruptionBudgets(c.ns).UpdateStatus(c.ctx(), p, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// kubelet plays the kubelets of the test's namespace until the test ends: a
// pod being deleted gracefully (an eviction) is removed, as a kubelet does
// once its containers stopped.
func (c *cluster) kubelet() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c.t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			l, err := c.cs.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			for _, p := range l.Items {
				if p.DeletionTimestamp != nil {
					_ = c.cs.CoreV1().Pods(c.ns).Delete(ctx, p.Name, metav1.DeleteOptions{
						GracePeriodSeconds: ptr.To[int64](0),
						Preconditions:      &metav1.Preconditions{UID: &p.UID},
					})
				}
			}
		}
	}()
}

// logLines captures log messages with their key/values.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(_, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{Verbosity: 2})
}

func (l *logLines) has(fragments ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		all := true
		for _, f := range fragments {
			all = all && strings.Contains(line, f)
		}
		if all {
			return true
		}
	}
	return false
}

func TestCordonReportsPriorStateAndUncordonRestores(t *testing.T) {
	c := newCluster(t)
	d := New(c.cs, logr.Discard())
	c.node("cordon-free", false)
	c.node("cordon-taken", true)

	const mark, other = "workers-reboot-0#3/uid-1", "workers-reboot-0#4/uid-1"
	cases := []struct {
		name        string
		node, mark  string
		wasCordoned bool
	}{
		{"schedulable node: we cordon it, marked for the grant", "cordon-free", mark, false},
		{"cordoned by someone else: reported, left as is", "cordon-taken", mark, true},
		{"cordoned for this grant already: not made by this call, so not claimed (a mark can be copied)", "cordon-free", mark, true},
		{"cordoned for another grant: not this grant's cordon", "cordon-free", other, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, err := c.cs.CoreV1().Nodes().Get(c.ctx(), tc.node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			was, written, err := d.Cordon(c.ctx(), tc.node, tc.mark, nil)
			if err != nil {
				t.Fatal(err)
			}
			if was != tc.wasCordoned {
				t.Fatalf("wasCordoned = %v, want %v", was, tc.wasCordoned)
			}
			// The Node written is returned (for the caller's cache wait);
			// nothing is returned when nothing was written.
			if wrote := !before.Spec.Unschedulable; (written != nil) != wrote || (written != nil && (!written.Spec.Unschedulable || written.ResourceVersion == before.ResourceVersion)) {
				t.Fatalf("written = %+v, want a new version only when the cordon was written (%v)", written, wrote)
			}
			if !c.unschedulable(tc.node) {
				t.Fatal("node is schedulable after Cordon")
			}
		})
	}
	t.Run("the mark is on the Node we cordoned, not on the other", func(t *testing.T) {
		for node, want := range map[string]string{"cordon-free": mark, "cordon-taken": ""} {
			n, err := c.cs.CoreV1().Nodes().Get(c.ctx(), node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := n.Annotations[lease.NodeAnnotationCordonedFor]; got != want {
				t.Fatalf("%s: %s = %q, want %q", node, lease.NodeAnnotationCordonedFor, got, want)
			}
		}
	})

	t.Run("uncordon makes the node schedulable, twice is fine", func(t *testing.T) {
		for range 2 {
			if _, err := d.Uncordon(c.ctx(), "cordon-free", nil); err != nil {
				t.Fatal(err)
			}
			if c.unschedulable("cordon-free") {
				t.Fatal("node still unschedulable after Uncordon")
			}
			n, err := c.cs.CoreV1().Nodes().Get(c.ctx(), "cordon-free", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if v, ok := n.Annotations[lease.NodeAnnotationCordonedFor]; ok {
				t.Fatalf("mark %q left on the uncordoned Node", v)
			}
		}
		if !c.unschedulable("cordon-taken") {
			t.Fatal("uncordoning one node changed another")
		}
	})
	t.Run("the cordon patch is refused on a stale resourceVersion", func(t *testing.T) {
		// Cordon relies on this to never claim a cordon someone else set
		// between its read and its write.
		n, err := c.cs.CoreV1().Nodes().Get(c.ctx(), "cordon-free", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := d.Cordon(c.ctx(), "cordon-free", mark, nil); err != nil {
			t.Fatal(err)
		}
		patch := fmt.Sprintf(`{"metadata":{"resourceVersion":%q},"spec":{"unschedulable":true}}`, n.ResourceVersion)
		_, err = c.cs.CoreV1().Nodes().Patch(c.ctx(), "cordon-free", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if !apierrors.IsConflict(err) {
			t.Fatalf("stale conditional patch = %v, want Conflict", err)
		}
		if _, err := d.Uncordon(c.ctx(), "cordon-free", nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a copy the caller saw stands in for the first read, never for the truth", func(t *testing.T) {
		get := func() *corev1.Node {
			n, err := c.cs.CoreV1().Nodes().Get(c.ctx(), "cordon-free", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		// Current copy: the cordon is written on it, marked ours.
		was, written, err := d.Cordon(c.ctx(), "cordon-free", mark, get())
		if err != nil || was || written == nil || written.Annotations[lease.NodeAnnotationCordonedFor] != mark {
			t.Fatalf("Cordon on a current copy = was %v, written %v, %v", was, written != nil, err)
		}
		if _, err := d.Uncordon(c.ctx(), "cordon-free", get()); err != nil || c.unschedulable("cordon-free") {
			t.Fatalf("Uncordon on a current copy: %v, unschedulable %v", err, c.unschedulable("cordon-free"))
		}
		// Stale copy: someone cordoned the node after it. Not claimed.
		stale := get()
		if _, err := c.cs.CoreV1().Nodes().Patch(c.ctx(), "cordon-free", types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		was, written, err = d.Cordon(c.ctx(), "cordon-free", mark, stale)
		if err != nil || !was || written != nil {
			t.Fatalf("Cordon on a stale copy = was %v, written %v, %v; want someone else's cordon, nothing written", was, written != nil, err)
		}
		if _, ok := get().Annotations[lease.NodeAnnotationCordonedFor]; ok {
			t.Fatal("marked someone else's cordon as ours")
		}
		// A copy already in the wanted state is not trusted either.
		if _, err := d.Uncordon(c.ctx(), "cordon-free", stale); err != nil || c.unschedulable("cordon-free") {
			t.Fatalf("Uncordon with a copy showing it schedulable: %v, unschedulable %v", err, c.unschedulable("cordon-free"))
		}
	})
	t.Run("missing node is NotFound", func(t *testing.T) {
		if _, _, err := d.Cordon(c.ctx(), "no-such-node", mark, nil); !apierrors.IsNotFound(err) {
			t.Fatalf("Cordon = %v, want NotFound", err)
		}
		if _, err := d.Uncordon(c.ctx(), "no-such-node", nil); !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), "no-such-node") {
			t.Fatalf("Uncordon = %v, want NotFound naming the node", err)
		}
	})
}

func TestDrainEvictsPodsAndLeavesDaemonSetAndMirrorPods(t *testing.T) {
	c := newCluster(t)
	c.kubelet()
	var logs logLines
	d := New(c.cs, logs.logger())
	c.node("drain-a", true)
	c.node("drain-other", false)

	ds := c.daemonSet("node-agent")
	c.pod("replicated", "drain-a", func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-abc", UID: "11111111-1111-1111-1111-111111111111", Controller: ptr.To(true)}}
	})
	c.pod("bare", "drain-a", nil)
	c.pod("scratch", "drain-a", func(p *corev1.Pod) {
		p.Spec.Volumes = []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	})
	c.pod("daemon", "drain-a", func(p *corev1.Pod) {
		p.Labels["ds"] = "node-agent"
		p.OwnerReferences = []metav1.OwnerReference{ds}
	})
	c.pod("static", "drain-a", func(p *corev1.Pod) {
		p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "static-hash"}
	})
	c.pod("elsewhere", "drain-other", nil)

	if err := d.Drain(c.ctx(), "drain-a", time.Minute); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if got, want := c.podsOn("drain-a"), []string{"daemon", "static"}; !slices.Equal(got, want) {
		t.Fatalf("pods left on the drained node = %v, want %v", got, want)
	}
	if got := c.podsOn("drain-other"); !slices.Equal(got, []string{"elsewhere"}) {
		t.Fatalf("pods on the other node = %v, want it untouched", got)
	}
	for _, p := range []string{"replicated", "bare", "scratch"} {
		if !logs.has(`"msg"="evicted pod"`, c.ns+"/"+p, `"node"="drain-a"`) {
			t.Errorf("no progress log for the eviction of %s; logs: %q", p, logs.lines)
		}
	}

	t.Run("drain of an empty node succeeds at once", func(t *testing.T) {
		if err := d.Drain(c.ctx(), "drain-a", time.Minute); err != nil {
			t.Fatal(err)
		}
	})
}

func TestDrainBlockedByPodDisruptionBudgetThenAllowed(t *testing.T) {
	c := newCluster(t)
	c.kubelet()
	d := New(c.cs, logr.Discard())
	d.retryDelay = 200 * time.Millisecond
	c.node("drain-pdb", true)
	c.pdb("web-pdb", "web", 0)
	c.pdb("unrelated-pdb", "db", 0)
	c.pod("web-1", "drain-pdb", func(p *corev1.Pod) { p.Labels["app"] = "web" })
	c.pod("cache", "drain-pdb", nil)

	err := d.Drain(c.ctx(), "drain-pdb", 2*time.Second)
	var be *BlockedError
	if !errors.As(err, &be) {
		t.Fatalf("Drain = %v, want *BlockedError", err)
	}
	web := c.ns + "/web-1"
	want := fmt.Sprintf("drain of drain-pdb timed out after 2s: pod %s blocked by PodDisruptionBudget %s/web-pdb", web, c.ns)
	if err.Error() != want {
		t.Fatalf("message\n%s\nwant\n%s", err, want)
	}
	if !be.TimedOut || be.Node != "drain-pdb" || !slices.Equal(be.Pods, []string{web}) || !slices.Equal(be.PDBs, []string{c.ns + "/web-pdb"}) {
		t.Fatalf("BlockedError = %+v", be)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Fatalf("a drain timeout must not look like the caller's context ending: %v", err)
	}
	if got := c.podsOn("drain-pdb"); !slices.Equal(got, []string{"web-1"}) {
		t.Fatalf("pods left = %v, want only the budgeted one (the other evicted)", got)
	}

	t.Run("caller cancellation is reported as such", func(t *testing.T) {
		ctx, cancel := context.WithCancel(c.ctx())
		time.AfterFunc(300*time.Millisecond, cancel)
		err := d.Drain(ctx, "drain-pdb", time.Minute)
		var be *BlockedError
		if !errors.As(err, &be) || !errors.Is(err, context.Canceled) || be.TimedOut {
			t.Fatalf("Drain = %v, want a BlockedError matching context.Canceled", err)
		}
		if !slices.Equal(be.PDBs, []string{c.ns + "/web-pdb"}) {
			t.Fatalf("PDBs = %v", be.PDBs)
		}
	})

	c.allow("web-pdb", 1)
	if err := d.Drain(c.ctx(), "drain-pdb", time.Minute); err != nil {
		t.Fatalf("Drain after the budget allows: %v", err)
	}
	if got := c.podsOn("drain-pdb"); len(got) != 0 {
		t.Fatalf("pods left = %v, want none", got)
	}
	// The Eviction API, not a plain delete, removed the pod: it spent the
	// budget's one allowed disruption.
	p, err := c.cs.PolicyV1().PodDisruptionBudgets(c.ns).Get(c.ctx(), "web-pdb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.DisruptionsAllowed != 0 {
		t.Fatalf("disruptionsAllowed = %d after the eviction, want 0", p.Status.DisruptionsAllowed)
	}
	if _, ok := p.Status.DisruptedPods["web-1"]; !ok {
		t.Fatalf("budget status does not record the eviction of web-1: %+v", p.Status)
	}
}

func TestDrainTimesOutOnPodThatNeverTerminates(t *testing.T) {
	c := newCluster(t) // no kubelet: evicted pods stay terminating
	d := New(c.cs, logr.Discard())
	c.node("drain-stuck", true)
	c.pod("slow", "drain-stuck", nil)

	err := d.Drain(c.ctx(), "drain-stuck", 2*time.Second)
	var be *BlockedError
	if !errors.As(err, &be) || !be.TimedOut {
		t.Fatalf("Drain = %v, want a timed-out BlockedError", err)
	}
	want := fmt.Sprintf("drain of drain-stuck timed out after 2s: pod %s/slow still terminating", c.ns)
	if err.Error() != want || len(be.PDBs) != 0 {
		t.Fatalf("message %q, PDBs %v; want %q and no budget", err, be.PDBs, want)
	}
}
