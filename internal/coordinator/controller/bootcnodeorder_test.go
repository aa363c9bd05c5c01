package controller

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

const (
	orderImageA = "registry.example/os@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	orderImageB = "registry.example/os@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// orderEnv is a real API server with a pool and a client that counts its
// BootcNode POSTs.
type orderEnv struct {
	c     client.Client
	pool  *fleetv1.BootcNodePool
	posts atomic.Int32
}

func startOrderEnv(t *testing.T) *orderEnv {
	t.Helper()
	env := envtest.Start(t)
	e := &orderEnv{}
	base, err := client.NewWithWatch(env.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	e.c = interceptor.NewClient(base, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*fleetv1.BootcNode); ok {
				e.posts.Add(1)
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	e.pool = &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: "order"}, Spec: fleetv1.BootcNodePoolSpec{
		Image: "registry.example/os:1", NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "order"}}}}
	if err := e.c.Create(t.Context(), e.pool); err != nil {
		t.Fatal(err)
	}
	return e
}

func orderChange(name, image, state string) plan.BootcNodeChange {
	return plan.BootcNodeChange{Name: name, Spec: fleetv1.BootcNodeSpec{Pool: "order", DesiredImage: image, RebootPolicy: fleetv1.RebootPolicyReboot},
		RolloutState: state, RolloutReason: "test"}
}

// byVersion lists the BootcNodes in the order of their last write.
func byVersion(t *testing.T, c client.Client) []string {
	t.Helper()
	var bns fleetv1.BootcNodeList
	if err := c.List(t.Context(), &bns); err != nil {
		t.Fatal(err)
	}
	sort.Slice(bns.Items, func(i, j int) bool {
		a, _ := strconv.ParseUint(bns.Items[i].ResourceVersion, 10, 64)
		b, _ := strconv.ParseUint(bns.Items[j].ResourceVersion, 10, 64)
		return a < b
	})
	var out []string
	for _, bn := range bns.Items {
		out = append(out, bn.Name)
	}
	return out
}

// The writer writes a pass's spec changes in the order the pass set them
// (the plan's queue order), whatever their names, and a node set again at
// the same priority keeps its place; changes of the annotations alone come
// after. Against a real API server, with one worker, so the order of the
// writes is the order of the resourceVersions they got.
func TestBootcNodeWriterWritesInTheOrderSet(t *testing.T) {
	e := startOrderEnv(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	names := []string{"n-07", "n-02", "n-11", "n-00", "n-05", "n-09", "n-01", "n-10", "n-03", "n-08", "n-04", "n-06"}
	r := &poolReconciler{client: e.c, writes: newOwnWrites(), bootcNodes: newBootcNodeWriter(e.c, newOwnWrites(), logr.Discard())}
	var creates []plan.BootcNodeChange
	for _, n := range slices.Sorted(slices.Values(names)) {
		creates = append(creates, orderChange(n, orderImageA, fleetv1.RolloutUpdated))
	}
	w := &observed{bootcNodes: map[string]*fleetv1.BootcNode{}}
	if err := r.applyBootcNodes(ctx, logr.Discard(), e.pool, w, plan.Output{CreateBootcNodes: creates}); err != nil {
		t.Fatal(err)
	}

	b := newBootcNodeWriter(e.c, newOwnWrites(), logr.Discard())
	b.workers = 1
	// Notes first, and ready before the spec changes are queued: they
	// still go last.
	b.set("order", orderChange("n-06", orderImageA, fleetv1.RolloutWaitingForRebootSlot), true, "")
	b.set("order", orderChange("n-04", orderImageA, fleetv1.RolloutWaitingForRebootSlot), true, "")
	for _, n := range names[:10] {
		b.set("order", orderChange(n, orderImageB, fleetv1.RolloutStaging), false, "")
	}
	// A later pass sets the first again, with newer words: same place.
	b.set("order", orderChange(names[0], orderImageB, fleetv1.RolloutWaitingForStageSlot), false, "")
	go func() { _ = b.Start(ctx) }()

	want := append(append([]string{}, names[:10]...), "n-06", "n-04")
	deadline := time.Now().Add(time.Minute)
	for {
		got := byVersion(t, e.c)
		if slices.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("written in the order %v, want %v", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var bn fleetv1.BootcNode
	if err := e.c.Get(ctx, client.ObjectKey{Name: names[0]}, &bn); err != nil {
		t.Fatal(err)
	}
	if bn.Spec.DesiredImage != orderImageB || bn.Annotations[fleetv1.AnnotationRolloutState] != fleetv1.RolloutWaitingForStageSlot {
		t.Fatalf("%s: desired %s, state %s: want the newest wish", names[0], bn.Spec.DesiredImage, bn.Annotations[fleetv1.AnnotationRolloutState])
	}
}

// A pass planned before the cache showed the BootcNodes the pass before
// created does not POST them again; once the cache shows them, or once
// createdFor passed without it, they are forgotten, and a node the cache
// still does not show then is created again (it may have been deleted).
func TestBootcNodesCreatedOnceWhileTheCacheLags(t *testing.T) {
	e := startOrderEnv(t)
	ctx := t.Context()
	r := &poolReconciler{client: e.c, writes: newOwnWrites(), bootcNodes: newBootcNodeWriter(e.c, newOwnWrites(), logr.Discard())}
	var creates []plan.BootcNodeChange
	for i := range 20 {
		creates = append(creates, orderChange(fmt.Sprintf("c-%02d", i), orderImageA, fleetv1.RolloutWaitingForStageSlot))
	}
	out := plan.Output{CreateBootcNodes: creates}
	if err := r.applyBootcNodes(ctx, logr.Discard(), e.pool, &observed{bootcNodes: map[string]*fleetv1.BootcNode{}}, out); err != nil {
		t.Fatal(err)
	}
	if n := e.posts.Load(); n != 20 {
		t.Fatalf("%d POSTs, want 20", n)
	}
	// The next pass's cache shows none of them yet: no POST.
	if err := r.applyBootcNodes(ctx, logr.Discard(), e.pool, &observed{bootcNodes: map[string]*fleetv1.BootcNode{}}, out); err != nil {
		t.Fatal(err)
	}
	if n := e.posts.Load(); n != 20 {
		t.Fatalf("%d POSTs after a pass on a lagging cache, want still 20", n)
	}
	// The cache shows c-00 and c-01: forgotten. Then c-00 was deleted by
	// someone: the next pass creates it again at once.
	var seen fleetv1.BootcNode
	if err := e.c.Get(ctx, client.ObjectKey{Name: "c-00"}, &seen); err != nil {
		t.Fatal(err)
	}
	cached := map[string]*fleetv1.BootcNode{"c-00": &seen, "c-01": &seen}
	if err := r.applyBootcNodes(ctx, logr.Discard(), e.pool, &observed{bootcNodes: cached}, plan.Output{}); err != nil {
		t.Fatal(err)
	}
	if r.bootcNodes.createdUnseen("c-00") || r.bootcNodes.createdUnseen("c-01") || !r.bootcNodes.createdUnseen("c-02") {
		t.Fatal("the creations the cache showed are not the ones forgotten")
	}
	if err := e.c.Delete(ctx, &seen); err != nil {
		t.Fatal(err)
	}
	if err := r.applyBootcNodes(ctx, logr.Discard(), e.pool, &observed{bootcNodes: map[string]*fleetv1.BootcNode{}}, plan.Output{CreateBootcNodes: creates[:1]}); err != nil {
		t.Fatal(err)
	}
	if n := e.posts.Load(); n != 21 {
		t.Fatalf("%d POSTs, want 21: c-00, seen and then deleted, is created again", n)
	}
	// createdFor after the creations, those never seen are forgotten too.
	r.bootcNodes.pruneCreated(func(string) bool { return false }, time.Now().Add(createdFor))
	for _, c := range creates {
		if r.bootcNodes.createdUnseen(c.Name) {
			t.Fatalf("%s is still taken to exist createdFor after its creation", c.Name)
		}
	}
}
