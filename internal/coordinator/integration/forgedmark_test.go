package integration

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// An administrator cordoned forged-n00 before the rollout; while the node
// holds its reboot grant, the node's own identity (system:node:forged-n00,
// under the Node authorizer and NodeRestriction) writes that grant's
// cordoned-for mark on its Node. The rollout completes, and the
// administrator's cordon is still there: only the coordinator's own cordon
// call, recorded on the grant, makes a cordon its own (amendment 21).
func TestForgedCordonMarkDoesNotLiftAnAdminsCordon(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "forged", 2, v0)
	victim := "forged-n00"
	if err := f.c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: victim}},
		client.RawPatch(types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`))); err != nil {
		t.Fatal(err)
	}
	cfg, err := env.AddUser("system:node:"+victim, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	kubelet, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	forged := make(chan string, 1)
	go func() {
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		done := map[string]bool{}
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
			for _, l := range f.leases(ctx) {
				g, err := lease.Parse(&l)
				if err != nil || g.Holder != victim || g.Kind != lease.KindReboot || done[lease.CordonMark(g.ID)] {
					continue
				}
				mark := lease.CordonMark(g.ID)
				body := `{"metadata":{"annotations":{"` + lease.NodeAnnotationCordonedFor + `":"` + mark + `"}}}`
				if err := kubelet.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: victim}}, client.RawPatch(types.MergePatchType, []byte(body))); err != nil {
					t.Logf("forging the mark as the node: %v", err)
					continue
				}
				done[mark] = true
				select {
				case forged <- mark:
				default:
				}
			}
		}
	}()
	f.run(ctx, 0) // the admin's cordon is outside the budget check
	startCoordinator(t, "forged", nil)
	// The administrator's cordon keeps forged-n00 unavailable after its
	// update, which the budget counts: room for forged-n01 too.
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = v1.String()
		p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(2))
	})
	select {
	case m := <-forged:
		t.Logf("the node wrote the mark %s on its own Node", m)
	case <-time.After(120 * time.Second):
		t.Fatal("the node never held a reboot grant to forge a mark for")
	}
	f.allOn(t, v1, 180*time.Second)
	eventually(t, 60*time.Second, "both reboot slots free", func() (bool, string) {
		for _, l := range f.leases(ctx) {
			// A finished stage slot stays held until handed on (amendment 31).
			if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && l.Labels[lease.LabelSlot] == string(lease.KindReboot) {
				return false, l.Name + " still held"
			}
		}
		return true, ""
	})
	var n corev1.Node
	if err := f.c.Get(ctx, client.ObjectKey{Name: victim}, &n); err != nil {
		t.Fatal(err)
	}
	if !n.Spec.Unschedulable {
		t.Fatalf("the administrator's cordon on %s was lifted because of a mark the node wrote itself", victim)
	}
	var other corev1.Node
	if err := f.c.Get(ctx, client.ObjectKey{Name: "forged-n01"}, &other); err != nil || other.Spec.Unschedulable {
		t.Fatalf("forged-n01, cordoned by the coordinator, was not uncordoned after its update (err %v)", err)
	}
}
