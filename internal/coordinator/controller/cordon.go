package controller

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// cordon cordons the node of the Draining grant l, marking the Node with the
// grant in the same update, records on the grant whose cordon it is (at
// once when it is someone else's, amendment 21; with the advance to phase
// Reboot when this call made it, amendment 29), and starts its drain: an
// admin's cordon made a moment before the grant stays the admin's.
func (r *poolReconciler) cordon(ctx context.Context, log logr.Logger, pool string, w *observed, l *coordinationv1.Lease, c plan.SlotChange) error {
	g, err := lease.Parse(l)
	if err != nil {
		return fmt.Errorf("cordoning for slot %s: %w", c.Slot, err)
	}
	was, node, err := r.opts.Drainer.Cordon(ctx, c.Node, lease.CordonMark(g.ID), r.cachedNode(ctx, c.Node))
	if err != nil {
		return fmt.Errorf("cordoning node %s: %w", c.Node, err)
	}
	if node != nil {
		r.writes.wrote(pool, kindNode, node)
		w.touch(c.Node)
	}
	// Someone else's cordon is recorded on the grant at once (amendments
	// 21, 23): from then on only this record says whose cordon it is, and
	// a mark copied onto the Node counts for nothing. A cordon this call
	// made on a grant that says pending is recorded by the advance to
	// phase Reboot, one Lease write less (amendment 29): until then the
	// grant's own mark, written in the cordon's update, says it is ours, as
	// it does for a coordinator stopped before the record. A grant that
	// records someone else's cordon and is cordoned again by us says so now.
	recorded, err := r.recordCordon(ctx, pool, l, g, c, was, node != nil)
	if err != nil {
		return err
	}
	switch {
	case recorded && was:
		log.Info("node was cordoned already, not by this grant's cordon; recorded so: it stays cordoned after the reboot", "node", c.Node, "slot", c.Slot)
	case was:
		log.V(1).Info("node was cordoned already by an earlier call for this grant (its mark is on the Node); the cordon stays ours", "node", c.Node, "slot", c.Slot)
	}
	if c.DrainTimeout > 0 && r.drains.startOnce(pool, c.Node, g.ID, c.DrainTimeout) {
		log.V(1).Info("drain started", "node", c.Node, "grant", g.ID.String(), "timeout", c.DrainTimeout.String())
	}
	return nil
}

// recordCordon records on grant l the answer of its cordon call when it is
// someone else's cordon (was), or ours on a grant that recorded another
// answer; ours on a pending grant waits for the advance (amendment 29). A
// Node found cordoned already on a pending grant is read afresh: cordoned
// with this very grant's mark, the cordon is ours, made by an earlier call
// whose answer this pass did not see (another pass, another coordinator
// during a failover), and stays pending, as amendment 23 reads it.
func (r *poolReconciler) recordCordon(ctx context.Context, pool string, l *coordinationv1.Lease, g lease.Grant, c plan.SlotChange, was, wrote bool) (recorded bool, err error) {
	pending := g.Cordon == lease.CordonPending
	foundCordoned := was && pending              // someone's cordon, or an earlier call of ours
	oursOverAnother := !was && wrote && !pending // ours, where another answer is recorded
	if !foundCordoned && !oursOverAnother {
		return false, nil
	}
	if was {
		var n corev1.Node
		if err := r.apiReader.Get(ctx, client.ObjectKey{Name: c.Node}, &n); err != nil {
			return false, fmt.Errorf("reading node %s cordoned for slot %s: %w", c.Node, c.Slot, err)
		}
		if n.Spec.Unschedulable && n.Annotations[lease.NodeAnnotationCordonedFor] == lease.CordonMark(g.ID) {
			return false, nil
		}
	}
	rec := l.DeepCopy()
	lease.RecordCordon(rec, !was)
	if err := r.client.Update(ctx, rec); err != nil {
		return false, fmt.Errorf("recording the cordon of node %s on slot %s: %w", c.Node, c.Slot, err)
	}
	r.writes.wrote(pool, kindLease, rec)
	return true, nil
}

// cachedNode is the cache's copy of node, nil if it has none.
func (r *poolReconciler) cachedNode(ctx context.Context, node string) *corev1.Node {
	var n corev1.Node
	if err := r.client.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return nil
	}
	return &n
}

func (r *poolReconciler) uncordon(ctx context.Context, pool string, w *observed, node string) error {
	n, err := r.opts.Drainer.Uncordon(ctx, node, r.cachedNode(ctx, node))
	if err != nil {
		return fmt.Errorf("uncordoning node %s: %w", node, err)
	}
	if n != nil {
		r.writes.wrote(pool, kindNode, n)
		w.touch(node)
	}
	return nil
}
