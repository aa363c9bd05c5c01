package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// cachedSnapshot is a deep copy of every object a pass reads from the cache,
// by kind/name, with the resourceVersion it was copied at.
type cachedSnapshot map[string]client.Object

func snapshotCache(ctx context.Context, t *testing.T, r *poolReconciler) cachedSnapshot {
	t.Helper()
	s := cachedSnapshot{}
	nodes, err := r.cachedNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		s["Node/"+n.Name] = n.DeepCopy()
	}
	bns, err := r.cachedBootcNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, bn := range bns {
		s["BootcNode/"+bn.Name] = bn.DeepCopy()
	}
	// Leases are listed without a deep copy: the list's items share their
	// maps and pointers with the cached objects.
	var leases coordinationv1.LeaseList
	if err := r.client.List(ctx, &leases, client.InNamespace(lease.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		t.Fatal(err)
	}
	for i := range leases.Items {
		s["Lease/"+leases.Items[i].Name] = leases.Items[i].DeepCopy()
	}
	return s
}

// changedInPlace names the objects the cache holds at the resourceVersion
// they had in before but with other content: changed by someone in this
// process, since the informer replaces an object it is told changed.
func changedInPlace(before, after cachedSnapshot) []string {
	var out []string
	for k, a := range after {
		b, ok := before[k]
		if ok && b.GetResourceVersion() == a.GetResourceVersion() && !equality.Semantic.DeepEqual(a, b) {
			out = append(out, k)
		}
	}
	return out
}

// A pass reads the informers' own objects (cachedreads.go); this runs
// passes against a real API server, from a pool's first pass to grants,
// BootcNode patches, a cordon and a drain, and checks after each that
// every object the cache held before it is, at the same resourceVersion,
// as it was.
func TestPassLeavesCachedObjectsAsTheyWere(t *testing.T) {
	env := envtest.Start(t)
	ctx := t.Context()
	c := env.Client
	target := "registry.example/os@sha256:" + strings.Repeat("1", 64)
	old := "registry.example/os@sha256:" + strings.Repeat("0", 64)
	const nodes = 6
	for i := range nodes {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cached-%d", i), Labels: map[string]string{"pool": "cached"},
			Annotations: map[string]string{"other.example/note": "kept out of the cache"}}}
		if err := c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		n.Status.NodeInfo.BootID = fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		if err := c.Status().Update(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	pool := &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: "cached"}, Spec: fleetv1.BootcNodePoolSpec{
		Image: target, NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "cached"}},
		Rollout: fleetv1.RolloutSpec{MaxUnavailable: ptr.To(intstr.FromInt32(2))}}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}

	opts := Options{Name: "cached", LeaseDuration: time.Minute}
	opts.defaults()
	undecodable := newUndecodables(logr.Discard())
	mopts, err := managerOptions(env.Config, opts, logr.Discard(), undecodable)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(env.Config, mopts)
	if err != nil {
		t.Fatal(err)
	}
	if err := opts.realParts(env.Config, logr.Discard()); err != nil {
		t.Fatal(err)
	}
	r, err := newPoolReconciler(mgr, opts, logr.Discard(), undecodable)
	if err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() { stop(); <-done })
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("the cache did not sync")
	}

	cordoned := false
	deadline := time.Now().Add(2 * time.Minute)
	for pass := 0; !cordoned; pass++ {
		if time.Now().After(deadline) {
			t.Fatalf("no cordon after %d passes", pass)
		}
		before := snapshotCache(ctx, t, r)
		if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: "cached"}}); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		after := snapshotCache(ctx, t, r)
		if changed := changedInPlace(before, after); len(changed) > 0 {
			t.Fatalf("pass %d changed cached objects in place: %v", pass, changed)
		}
		for k, o := range after {
			if n, ok := o.(*corev1.Node); ok && n.Spec.Unschedulable {
				cordoned = true
			}
			if _, ok := o.GetAnnotations()["other.example/note"]; ok {
				t.Fatalf("%s: the cache kept another's annotation", k)
			}
		}
		// Each node's agent reports booted on the old image and, once its
		// BootcNode asks for the target, staged on it: ready for a reboot grant.
		reportStaged(ctx, t, c, old, target)
		time.Sleep(200 * time.Millisecond) // pacing only: a pass that finds nothing new changes nothing
	}
}

func reportStaged(ctx context.Context, t *testing.T, c client.Client, old, target string) {
	t.Helper()
	var bns fleetv1.BootcNodeList
	if err := c.List(ctx, &bns); err != nil {
		t.Fatal(err)
	}
	for i := range bns.Items {
		bn := &bns.Items[i]
		var n corev1.Node
		if err := c.Get(ctx, client.ObjectKey{Name: bn.Name}, &n); err != nil {
			t.Fatal(err)
		}
		repo, digest, _ := strings.Cut(old, "@")
		st := fleetv1.BootcNodeStatus{ObservedGeneration: bn.Generation, BootID: n.Status.NodeInfo.BootID, Phase: fleetv1.PhaseIdle,
			Booted:         &fleetv1.Deployment{Image: old, Digest: digest},
			LastReportTime: &metav1.MicroTime{Time: time.Now()}}
		if bn.Spec.DesiredImage == target {
			_, tdigest, _ := strings.Cut(target, "@")
			st.Staged, st.Phase = &fleetv1.Deployment{Image: repo + "@" + tdigest, Digest: tdigest, DownloadOnly: true}, fleetv1.PhaseStaged
		}
		bn.Status = st
		if err := c.Status().Update(ctx, bn); err != nil && !strings.Contains(err.Error(), "modified") {
			t.Fatal(err)
		}
	}
}
