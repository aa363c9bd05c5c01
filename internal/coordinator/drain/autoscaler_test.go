package drain

import (
	"errors"
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
)

// The autoscaler marks through a real API server: the cordon carries them in
// its own update (one new resourceVersion), a stale copy is read afresh, not
// trusted, a record the coordinator cannot read changes nothing, and a
// deleted Node is nothing to do.
func TestAutoscalerMarksGoWithTheCordon(t *testing.T) {
	c := newCluster(t)
	d := New(c.cs, logr.Discard())
	c.node("marks-free", false)
	get := func(name string) *corev1.Node {
		t.Helper()
		n, err := c.cs.CoreV1().Nodes().Get(c.ctx(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	patch := func(name, body string) {
		t.Helper()
		if _, err := c.cs.CoreV1().Nodes().Patch(c.ctx(), name, types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch("marks-free", `{"metadata":{"annotations":{"karpenter.sh/do-not-disrupt":"false"}}}`)

	t.Run("the cordon sets the marks and their record in its own update", func(t *testing.T) {
		_, written, err := d.Cordon(c.ctx(), "marks-free", "workers-reboot-1#2/uid-9", nil)
		if err != nil || written == nil {
			t.Fatalf("Cordon: written %v, %v", written != nil, err)
		}
		a := written.Annotations
		if !written.Spec.Unschedulable || a[lease.NodeAnnotationDoNotDisrupt] != "true" || a[lease.NodeAnnotationScaleDownDisabled] != "true" {
			t.Fatalf("the cordon's update: unschedulable %v, annotations %v", written.Spec.Unschedulable, a)
		}
		r, err := lease.ParseAutoscalerRecord(a[lease.NodeAnnotationAutoscalerMarks])
		if err != nil || r.Slot != "workers-reboot-1" || r.Was[lease.NodeAnnotationDoNotDisrupt] == nil || *r.Was[lease.NodeAnnotationDoNotDisrupt] != "false" {
			t.Fatalf("record %+v (%v): want slot workers-reboot-1 and do-not-disrupt was false", r, err)
		}
	})
	t.Run("holding again for the same slot writes nothing", func(t *testing.T) {
		if n, err := d.MarkAutoscalers(c.ctx(), "marks-free", "workers-reboot-1", nil); err != nil || n != nil {
			t.Fatalf("MarkAutoscalers: wrote %v, %v; want nothing", n != nil, err)
		}
	})
	t.Run("the uncordon gives the administrator's value back", func(t *testing.T) {
		stale := get("marks-free")
		patch("marks-free", `{"metadata":{"annotations":{"someone/else":"x"}}}`)
		written, err := d.Uncordon(c.ctx(), "marks-free", stale)
		if err != nil || written == nil {
			t.Fatalf("Uncordon: written %v, %v", written != nil, err)
		}
		a := written.Annotations
		if written.Spec.Unschedulable || a[lease.NodeAnnotationDoNotDisrupt] != "false" || a["someone/else"] != "x" {
			t.Fatalf("after the uncordon: unschedulable %v, annotations %v", written.Spec.Unschedulable, a)
		}
		for _, k := range []string{lease.NodeAnnotationScaleDownDisabled, lease.NodeAnnotationAutoscalerMarks} {
			if v, ok := a[k]; ok {
				t.Fatalf("%s=%q left after the uncordon", k, v)
			}
		}
	})
	t.Run("an unreadable record changes no mark, and the cordon goes on", func(t *testing.T) {
		patch("marks-free", `{"metadata":{"annotations":{"fleet.bootc.dev/autoscaler-marks":"{not json"}}}`)
		before := get("marks-free")
		if _, err := d.MarkAutoscalers(c.ctx(), "marks-free", "workers-reboot-1", nil); !errors.Is(err, lease.ErrAutoscalerRecord) {
			t.Fatalf("MarkAutoscalers = %v, want ErrAutoscalerRecord", err)
		}
		if _, err := d.MarkAutoscalers(c.ctx(), "marks-free", "", nil); !errors.Is(err, lease.ErrAutoscalerRecord) {
			t.Fatalf("MarkAutoscalers (release) = %v, want ErrAutoscalerRecord", err)
		}
		if after := get("marks-free"); after.ResourceVersion != before.ResourceVersion {
			t.Fatalf("the Node was written: %v", after.Annotations)
		}
		_, written, err := d.Cordon(c.ctx(), "marks-free", "workers-reboot-1#3/uid-9", nil)
		if err != nil || written == nil || !written.Spec.Unschedulable {
			t.Fatalf("Cordon with an unreadable record: written %v, %v", written != nil, err)
		}
		if a := written.Annotations; a[lease.NodeAnnotationDoNotDisrupt] != "false" || a[lease.NodeAnnotationAutoscalerMarks] != "{not json" {
			t.Fatalf("marks changed despite an unreadable record: %v", a)
		}
	})
	t.Run("a Node that is gone is nothing to do", func(t *testing.T) {
		if n, err := d.MarkAutoscalers(c.ctx(), "no-such-node", "workers-reboot-1", nil); err != nil || n != nil {
			t.Fatalf("MarkAutoscalers on a missing Node: %v, %v", n, err)
		}
	})
}
