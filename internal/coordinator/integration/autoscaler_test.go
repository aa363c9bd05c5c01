package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// autoscalerAnnotations are the Node annotations amendment 28 is about.
var autoscalerAnnotations = []string{lease.NodeAnnotationScaleDownDisabled, lease.NodeAnnotationDoNotDisrupt, lease.NodeAnnotationAutoscalerMarks}

func autoscalerView(n *corev1.Node) map[string]string {
	out := map[string]string{}
	for _, k := range autoscalerAnnotations {
		if v, ok := n.Annotations[k]; ok {
			out[k] = v
		}
	}
	return out
}

// Through the real API server and coordinator: a watch on the pool's Nodes
// sees every Node version the coordinator cordoned (its cordoned-for mark)
// carry both autoscaler marks (they go in the cordon's own update), a node an
// administrator cordoned get them too while it holds its slot, and after the
// rollout every Node carries exactly the autoscaler annotations it had
// before: the administrator's do-not-disrupt=false and =true kept, the
// coordinator's marks and record gone.
func TestAutoscalerMarksWhileARebootSlotIsHeld(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "asmarks", 3, v0)
	before := map[string]map[string]string{
		"asmarks-n00": {lease.NodeAnnotationDoNotDisrupt: "false"},
		"asmarks-n01": {lease.NodeAnnotationDoNotDisrupt: "true"}, // and an administrator's cordon
		"asmarks-n02": {},
	}
	for name, ann := range before {
		body := fmt.Sprintf(`{"metadata":{"annotations":%s}}`, toJSON(ann))
		if name == "asmarks-n01" {
			body = fmt.Sprintf(`{"metadata":{"annotations":%s},"spec":{"unschedulable":true}}`, toJSON(ann))
		}
		if err := f.c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch(types.MergePatchType, []byte(body))); err != nil {
			t.Fatal(err)
		}
	}

	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{LabelSelector: "test-pool=" + f.label})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var (
		mu       sync.Mutex
		heldSeen = map[string]bool{} // both marks "true" seen on the node
		bad      []string
	)
	go func() {
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			marked := n.Annotations[lease.NodeAnnotationScaleDownDisabled] == "true" && n.Annotations[lease.NodeAnnotationDoNotDisrupt] == "true"
			mu.Lock()
			if marked && n.Annotations[lease.NodeAnnotationAutoscalerMarks] != "" {
				heldSeen[n.Name] = true
			}
			if _, ours := n.Annotations[lease.NodeAnnotationCordonedFor]; ours && n.Spec.Unschedulable && !marked {
				bad = append(bad, fmt.Sprintf("%s at %s: cordoned for %s without both autoscaler marks: %v", n.Name, n.ResourceVersion, n.Annotations[lease.NodeAnnotationCordonedFor], autoscalerView(n)))
			}
			mu.Unlock()
		}
	}()

	f.run(ctx, 0) // the admin's cordon is outside the budget check
	startCoordinator(t, "asmarks", nil)
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = v1.String()
		p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(2))
	})
	f.allOn(t, v1, 180*time.Second)
	eventually(t, 60*time.Second, "every reboot slot free and every Node's autoscaler annotations as before", func() (bool, string) {
		for _, l := range f.leases(ctx) {
			// A finished stage slot stays held until handed on (amendment 31).
			if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && l.Labels[lease.LabelSlot] == string(lease.KindReboot) {
				return false, l.Name + " still held"
			}
		}
		for name, want := range before {
			var n corev1.Node
			if err := f.c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
				return false, err.Error()
			}
			if got := autoscalerView(&n); !maps.Equal(got, want) {
				return false, fmt.Sprintf("%s: %v, want %v", name, got, want)
			}
		}
		return true, ""
	})
	mu.Lock()
	defer mu.Unlock()
	for name := range before {
		if !heldSeen[name] {
			t.Errorf("%s was never seen with both autoscaler marks and their record while it held its reboot slot", name)
		}
	}
	for _, b := range bad {
		t.Error(b)
	}
	var n01 corev1.Node
	if err := f.c.Get(ctx, client.ObjectKey{Name: "asmarks-n01"}, &n01); err != nil || !n01.Spec.Unschedulable {
		t.Fatalf("the administrator's cordon on asmarks-n01 is gone (err %v)", err)
	}
}

func toJSON(m map[string]string) string {
	b, _ := json.Marshal(m)
	return string(b)
}
