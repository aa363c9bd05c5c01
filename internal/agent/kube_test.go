package agent

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// The view tells the loop when it has synced, even when it lists nothing:
// the loop waits for Changed before it looks at Synced again, so without a
// word at the sync the agent's first decision waited for a timer.
func TestViewPokesOnceSynced(t *testing.T) {
	e := envtest.Start(t)
	k, err := newKube(e.Config, "node-without-objects")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k.Start(ctx)
	// Nothing is listed, so no handler runs: the only word can be the sync's.
	deadline := time.After(30 * time.Second) // a bound, not a measurement
	for woke := false; !woke || !k.Synced(); {
		select {
		case <-k.Changed():
			woke = true
		case <-deadline:
			t.Fatalf("no word from the view once both informers synced (synced now: %v)", k.Synced())
		}
	}
	if k.BootcNode() != nil {
		t.Fatalf("a BootcNode for a node that has none: %+v", k.BootcNode())
	}
}

// The agent watches the slot Leases its BootcNode names, each by name
// (amendment 39), and the Leases labelled with its node only while the
// BootcNode names none (a coordinator that predates the annotation). A
// Lease the annotation names but another node holds is not its own, and a
// malformed annotation is followed not at all, with the reason said.
func TestLeaseViewFollowsTheSlotsItsBootcNodeNames(t *testing.T) {
	e := envtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const node = "view-node"
	mkLease := func(name, holder string) {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lease.Namespace,
			Labels: map[string]string{lease.LabelHolder: holder}}}
		if err := e.Client.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	mkLease("view-stage-0", node)
	mkLease("view-reboot-0", node)
	mkLease("view-reboot-1", "other-node")
	bn := &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: node, Annotations: map[string]string{fleetv1.AnnotationSlots: ""}},
		Spec: fleetv1.BootcNodeSpec{Pool: "view"}}
	if err := e.Client.Create(ctx, bn); err != nil {
		t.Fatal(err)
	}
	k, err := newKube(e.Config, node)
	if err != nil {
		t.Fatal(err)
	}
	k.Start(ctx)
	setSlots := func(v *string) {
		t.Helper()
		cur := &fleetv1.BootcNode{}
		if err := e.Client.Get(ctx, client.ObjectKey{Name: node}, cur); err != nil {
			t.Fatal(err)
		}
		old := cur.DeepCopy()
		if v == nil {
			delete(cur.Annotations, fleetv1.AnnotationSlots)
		} else {
			cur.Annotations[fleetv1.AnnotationSlots] = *v
		}
		if err := e.Client.Patch(ctx, cur, client.MergeFrom(old)); err != nil {
			t.Fatal(err)
		}
	}
	// waitView waits (a bound, not a measurement) until the view is synced
	// on the BootcNode's current annotation and shows want.
	waitView := func(annotation *string, want ...string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			got := []string{}
			for _, l := range k.Leases() {
				got = append(got, l.Name)
			}
			b := k.BootcNode()
			v, present := "", false
			if b != nil {
				v, present = b.Annotations[fleetv1.AnnotationSlots]
			}
			if k.Synced() && (annotation == nil) == !present && (annotation == nil || *annotation == v) && slices.Equal(got, want) {
				return
			}
			select {
			case <-k.Changed():
			case <-time.After(100 * time.Millisecond):
			case <-deadline:
				t.Fatalf("view shows %v (synced %v), want %v", got, k.Synced(), want)
			}
		}
	}
	str := func(s string) *string { return &s }
	waitView(str("")) // labelled with the node, but not named: not watched
	setSlots(str("view-stage-0"))
	waitView(str("view-stage-0"), "view-stage-0")
	setSlots(str("view-reboot-0,view-reboot-1"))
	waitView(str("view-reboot-0,view-reboot-1"), "view-reboot-0") // reboot-1 is another node's
	// A grant written after the name: the named informer sees it.
	l := &coordinationv1.Lease{}
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: "view-reboot-1"}, l); err != nil {
		t.Fatal(err)
	}
	l.Labels[lease.LabelHolder] = node
	if err := e.Client.Update(ctx, l); err != nil {
		t.Fatal(err)
	}
	waitView(str("view-reboot-0,view-reboot-1"), "view-reboot-0", "view-reboot-1")
	if n := len(k.slots.Informers()); n != 2 {
		t.Fatalf("%d Lease informers, want one per named Lease (2)", n)
	}
	setSlots(str("view-stage-0,../etc"))
	waitView(str("view-stage-0,../etc"))
	if err := k.SlotsError(); err == nil || !strings.Contains(err.Error(), `"../etc" is not a Lease name`) {
		t.Fatalf("SlotsError = %v", err)
	}
	setSlots(nil) // an older coordinator: every Lease labelled with the node
	waitView(nil, "view-reboot-0", "view-reboot-1", "view-stage-0")
	if err := k.SlotsError(); err != nil {
		t.Fatalf("SlotsError = %v after the annotation went", err)
	}
}
