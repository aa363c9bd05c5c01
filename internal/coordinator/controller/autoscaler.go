package controller

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// markAutoscalers keeps the autoscaler marks of the pool's Nodes as its slots
// now are (amendment 28): a node holding one of the pool's reboot slots
// carries them, and a node holding none gets back what a hold of one of the
// pool's slots changed. The cordon and the uncordon carry them in their own
// Node update, so this writes only where those did not: a Node cordoned by
// someone else, a slot reset or handed on without an uncordon, a write lost
// before. It is level-based: what fails is done by a later pass. A record
// or mark the coordinator cannot keep is logged (once per value) and left
// as it is; any other failure is returned after every Node was tried.
func (r *poolReconciler) markAutoscalers(ctx context.Context, log logr.Logger, pool string, w *observed) error {
	holders := map[string]string{} // node -> reboot slot Lease
	for name, l := range w.leases {
		if s, ok := plan.ParseSlot(pool, l); ok && s.Kind == lease.KindReboot && s.State == plan.SlotHeld && s.Holder != "" {
			holders[s.Holder] = name
		}
	}
	w.touchedMu.Lock()
	touched := w.touched
	w.touchedMu.Unlock()
	names := make([]string, 0, len(w.nodes))
	for name := range w.nodes {
		names = append(names, name)
	}
	sort.Strings(names)
	var errs []error
	for _, name := range names {
		n := w.nodes[name]
		slot, hold := holders[name]
		_, recorded := n.Annotations[lease.NodeAnnotationAutoscalerMarks]
		switch {
		case touched[name]:
			continue // its cordon's update carried the marks
		case !hold && (!recorded || marksOf(n) != pool):
			continue // nothing of ours, or another pool's to restore
		}
		written, err := r.opts.Drainer.MarkAutoscalers(ctx, name, slot, n)
		if errors.Is(err, lease.ErrAutoscalerRecord) {
			r.reportBadMarks(log, n, err)
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if written != nil {
			r.writes.wrote(pool, kindNode, written)
		}
	}
	return errors.Join(errs...)
}

// marksOf is the pool whose reboot slot a Node's autoscaler-marks record
// names ("" when it has none or it cannot be read).
func marksOf(n *corev1.Node) string {
	s, ok := n.Annotations[lease.NodeAnnotationAutoscalerMarks]
	if !ok {
		return ""
	}
	rec, err := lease.ParseAutoscalerRecord(s)
	if err != nil {
		return ""
	}
	return rec.Pool()
}

// reportBadMarks logs a Node's unusable autoscaler marks once per value of
// its annotations, not on every pass.
func (r *poolReconciler) reportBadMarks(log logr.Logger, n *corev1.Node, err error) {
	key := fmt.Sprint(n.Name, n.Annotations[lease.NodeAnnotationAutoscalerMarks], n.Annotations[lease.NodeAnnotationDoNotDisrupt], n.Annotations[lease.NodeAnnotationScaleDownDisabled])
	r.mu.Lock()
	if r.badMarks == nil {
		r.badMarks = map[string]string{}
	}
	seen := r.badMarks[n.Name] == key
	r.badMarks[n.Name] = key
	r.mu.Unlock()
	if !seen {
		log.Info("autoscaler marks of the node left as they are: fix or remove the annotation", "node", n.Name, "annotation", lease.NodeAnnotationAutoscalerMarks, "error", err.Error())
	}
}
