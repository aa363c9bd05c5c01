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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/drain"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// One slot's grant fails (a real Conflict: its Lease changed since it was
// read) while the other slots' writes of the same round are in flight:
// half of them before their Lease Update reached the API server, half
// between the Update and the cordon that follows it. Each of them finishes
// (amendment 33): its grant written and its node cordoned with the grant's
// mark, none aborted half done, and the pass reports the failed one.
// Against a real API server; the failing write waits until every other is
// in flight, and they wait until it failed, so the order is forced, not
// timed.
func TestAFailedWriteLeavesTheWritesInFlightToFinish(t *testing.T) {
	env := envtest.Start(t)
	ctx := t.Context()
	const pool, n, bad = "inflight", 8, 0
	image := imageref.Pinned{Repository: "registry.example/os", Digest: "sha256:" + strings.Repeat("c", 64)}

	read := map[string]*coordinationv1.Lease{}
	var changes []plan.SlotChange
	for i := range n {
		node := fmt.Sprintf("inflight-n%d", i)
		if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
			t.Fatal(err)
		}
		l := lease.NewSlot(pool, lease.KindReboot, i)
		if err := env.Client.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
		read[l.Name] = l.DeepCopy()
		changes = append(changes, plan.SlotChange{Slot: l.Name, Kind: lease.KindReboot, Op: plan.OpGrant, Node: node,
			Image: image, BootID: newBootIDFor(i), Why: "Test"})
	}
	// The failing slot changed after the pass read it.
	badName := changes[bad].Slot
	changed := read[badName].DeepCopy()
	changed.Annotations = map[string]string{"test": "changed since the pass read it"}
	if err := env.Client.Update(ctx, changed); err != nil {
		t.Fatal(err)
	}

	entered := make(chan struct{}, n)
	failed := make(chan struct{})
	waitFailed := func(ctx context.Context) error {
		select {
		case <-failed:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Minute):
			return fmt.Errorf("the failing write never failed")
		}
	}
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	idx := map[string]int{}
	for i, ch := range changes {
		idx[ch.Slot] = i
	}
	cl := interceptor.NewClient(wc, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if _, ok := obj.(*coordinationv1.Lease); !ok {
				return c.Update(ctx, obj, opts...)
			}
			i := idx[obj.GetName()]
			switch {
			case i == bad:
				for range n - 1 {
					select {
					case <-entered:
					case <-time.After(time.Minute):
						return fmt.Errorf("the other writes never were all in flight")
					}
				}
				err := c.Update(ctx, obj, opts...)
				close(failed)
				return err
			case i%2 == 1: // in flight before its request went out
				entered <- struct{}{}
				if err := waitFailed(ctx); err != nil {
					return err
				}
				return c.Update(ctx, obj, opts...)
			default: // written, its cordon still to come
				err := c.Update(ctx, obj, opts...)
				entered <- struct{}{}
				if werr := waitFailed(ctx); werr != nil {
					return werr
				}
				return err
			}
		},
	})
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	r := &poolReconciler{client: cl, apiReader: wc, writes: newOwnWrites(), bootcNodes: newBootcNodeWriter(cl, newOwnWrites(), logr.Discard()),
		progress: newPoolProgress(), waiting: map[string]time.Time{}, log: logr.Discard(),
		opts: Options{LeaseDuration: time.Minute, Drainer: drain.New(cs, logr.Discard())}}
	w := &observed{leases: read, bootcNodes: map[string]*fleetv1.BootcNode{}, touched: map[string]bool{}}
	p := &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: pool}}
	_, err = r.apply(ctx, logr.Discard(), p, w, plan.Input{Now: time.Now()}, plan.Output{Changes: changes})
	if !apierrors.IsConflict(err) || !strings.Contains(err.Error(), badName) {
		t.Fatalf("apply = %v, want the Conflict of slot %s", err, badName)
	}

	for i, ch := range changes {
		var l coordinationv1.Lease
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: ch.Slot}, &l); err != nil {
			t.Fatal(err)
		}
		var node corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: ch.Node}, &node); err != nil {
			t.Fatal(err)
		}
		g, perr := lease.Parse(&l)
		if i == bad {
			if perr == nil || node.Spec.Unschedulable {
				t.Fatalf("slot %s, whose write failed, holds %+v and its node is cordoned %v; want neither", ch.Slot, g, node.Spec.Unschedulable)
			}
			continue
		}
		if perr != nil || g.Holder != ch.Node {
			t.Fatalf("slot %s (write %d, in flight when slot %s failed): grant %+v, %v; want it granted to %s", ch.Slot, i, badName, g, perr, ch.Node)
		}
		if !node.Spec.Unschedulable || node.Annotations[lease.NodeAnnotationCordonedFor] != lease.CordonMark(g.ID) {
			t.Fatalf("node %s of slot %s (write %d, in flight when slot %s failed): cordoned %v, mark %q; want cordoned for %s",
				ch.Node, ch.Slot, i, badName, node.Spec.Unschedulable, node.Annotations[lease.NodeAnnotationCordonedFor], lease.CordonMark(g.ID))
		}
	}
}

// newBootIDFor is a valid boot ID for test node i.
func newBootIDFor(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012x", i+1) }
