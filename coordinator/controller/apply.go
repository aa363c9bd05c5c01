package controller

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/coordinator/metrics"
	"github.com/bootc-fleet/bootc-fleet/coordinator/plan"
)

// apply makes the plan's changes, in order, and stops at the first failure:
// releases come before grants, so a grant is never written after a failed
// release it was counted on. Every slot change is one Update of the Lease as
// read; a concurrent writer makes it fail with Conflict. applied reports
// whether any slot changed.
func (r *poolReconciler) apply(ctx context.Context, log logr.Logger, pool *fleetv1.BootcNodePool, w *observed, in plan.Input, out plan.Output) (applied bool, err error) {
	for _, ref := range out.CreateSlots {
		l := plan.NewSlotLease(pool.Name, ref)
		if err := controllerutil.SetOwnerReference(pool, l, r.client.Scheme()); err != nil {
			return applied, err
		}
		if err := r.client.Create(ctx, l); err != nil && !kerrors.IsAlreadyExists(err) {
			return applied, fmt.Errorf("creating slot Lease %s: %w", ref.Name, err)
		}
		applied = true
	}
	for _, name := range out.DeleteSlots {
		l := w.leases[name]
		// Only the free slot as read: a grant written since makes this fail.
		pre := client.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion}
		if err := r.client.Delete(ctx, l, pre); err != nil && !kerrors.IsNotFound(err) {
			return applied, fmt.Errorf("deleting surplus slot Lease %s: %w", name, err)
		}
	}

	for _, c := range out.Changes {
		if err := r.applyChange(ctx, log, pool.Name, w, c, in.Now); err != nil {
			return applied, err
		}
		applied = true
	}
	for _, node := range out.Uncordon {
		if err := r.opts.Drainer.Uncordon(ctx, node); err != nil {
			return applied, err
		}
	}
	for _, node := range out.StopDrains {
		r.drains.stop(node)
	}
	for _, d := range out.StartDrains {
		log.Info("draining node", "node", d.Node, "grant", d.Grant.String(), "timeout", d.Timeout.String())
		r.drains.start(pool.Name, d.Node, d.Grant, d.Timeout)
	}

	if err := r.applyBootcNodes(ctx, log, pool, w, out); err != nil {
		return applied, err
	}

	// Events once the slots and BootcNodes they describe are written; a
	// status update that fails next does not take them back.
	r.recordEvents(pool, w, out)
	if !equality.Semantic.DeepEqual(pool.Status, out.Status) {
		p := pool.DeepCopy()
		p.Status = out.Status
		if err := r.client.Status().Update(ctx, p); err != nil {
			return applied, fmt.Errorf("updating pool status: %w", err)
		}
	}
	r.observeMetrics(pool.Name, w, in, out)
	return applied, nil
}

// recordEvents records the plan's Events on the pool (or the BootcNode they
// are about) and, for those about a node, on its Node and BootcNode too, so
// `kubectl describe node` and `kubectl describe bootcnode` tell its story. The pool's Event
// names the node as its related object: events.k8s.io/v1 folds Events with
// the same reason, regarding and related object into one series that keeps
// the first note, so without it the grant of the second node would only
// raise the count on the first node's Event.
func (r *poolReconciler) recordEvents(pool *fleetv1.BootcNodePool, w *observed, out plan.Output) {
	for _, e := range out.Events {
		if bn := w.bootcNodes[e.BootcNode]; e.BootcNode != "" && bn != nil && bn.UID != "" {
			r.recorder.Eventf(bn, pool, e.Type, e.Reason, "Reconcile", "%s", e.Message)
			continue
		}
		uid, ok := w.nodeUIDs[e.Node]
		if e.Node == "" || !ok {
			r.recorder.Eventf(pool, nil, e.Type, e.Reason, "Reconcile", "%s", e.Message)
			continue
		}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.Node, UID: uid}}
		node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
		r.recorder.Eventf(pool, node, e.Type, e.Reason, "Reconcile", "%s", e.Message)
		r.recorder.Eventf(node, pool, e.Type, e.Reason, "Reconcile", "%s", e.Message)
		if bn := w.bootcNodes[e.Node]; bn != nil && bn.UID != "" && bn.Spec.Pool == pool.Name {
			r.recorder.Eventf(bn, pool, e.Type, e.Reason, "Reconcile", "%s", e.Message)
		}
	}
}

func (r *poolReconciler) applyChange(ctx context.Context, log logr.Logger, pool string, w *observed, c plan.SlotChange, now time.Time) error {
	read := w.leases[c.Slot]
	if read == nil {
		return fmt.Errorf("slot Lease %s vanished", c.Slot)
	}
	// Restore the node before the grant that records our cordon is cleared:
	// if we stop in between, the grant is still there to say so.
	if c.Uncordon {
		if err := r.opts.Drainer.Uncordon(ctx, c.Node); err != nil && !kerrors.IsNotFound(err) {
			return fmt.Errorf("uncordoning node %s: %w", c.Node, err)
		}
	}
	if c.Op == plan.OpCordon {
		return r.cordon(ctx, log, w, c, now)
	}
	l := read.DeepCopy()
	plan.ApplyToLease(l, c, now, r.opts.LeaseDuration)
	if err := r.client.Update(ctx, l); err != nil {
		return fmt.Errorf("%s slot %s for node %s: %w", c.Op, c.Slot, c.Node, err)
	}
	w.leases[c.Slot] = l
	log.Info("slot "+string(c.Op), "slot", c.Slot, "node", c.Node, "why", c.Why, "image", c.Image.String())
	switch c.Op {
	case plan.OpGrant:
		metrics.Grants.WithLabelValues(pool, string(c.Kind)).Inc()
		r.mu.Lock()
		if since, ok := r.waiting[waitKey(pool, c.Node, c.Kind)]; ok {
			metrics.GrantLatency.WithLabelValues(pool, string(c.Kind)).Observe(now.Sub(since).Seconds())
			delete(r.waiting, waitKey(pool, c.Node, c.Kind))
		}
		r.mu.Unlock()
		if c.Kind == lease.KindReboot {
			return r.cordon(ctx, log, w, c, now)
		}
	case plan.OpRevoke:
		metrics.Revokes.WithLabelValues(pool, c.Why).Inc()
	case plan.OpMarkFailed:
		metrics.Failures.WithLabelValues(pool, c.Failure).Inc()
	}
	return nil
}

// cordon cordons the node of a Draining reboot grant, marking the Node with
// the grant in the same update, then records on the grant what the cordon
// call found (cordoned-by-us), never what a cache showed: an admin's cordon
// made a moment before the grant stays the admin's. If the coordinator stops
// between the two writes, the Node's mark tells the next one the cordon was
// its own.
func (r *poolReconciler) cordon(ctx context.Context, log logr.Logger, w *observed, c plan.SlotChange, now time.Time) error {
	l := w.leases[c.Slot].DeepCopy()
	g, err := lease.Parse(l)
	if err != nil {
		return fmt.Errorf("cordoning for slot %s: %w", c.Slot, err)
	}
	was, err := r.opts.Drainer.Cordon(ctx, c.Node, lease.CordonMark(g.ID))
	if err != nil {
		return fmt.Errorf("cordoning node %s: %w", c.Node, err)
	}
	rec := plan.SlotChange{Slot: c.Slot, Kind: c.Kind, Op: plan.OpCordon, Node: c.Node, CordonedByUs: !was}
	if l.Annotations[lease.AnnotationCordonedByUs] == strconv.FormatBool(rec.CordonedByUs) {
		return nil
	}
	plan.ApplyToLease(l, rec, now, r.opts.LeaseDuration)
	if err := r.client.Update(ctx, l); err != nil {
		return fmt.Errorf("recording the cordon of node %s on slot %s: %w", c.Node, c.Slot, err)
	}
	w.leases[c.Slot] = l
	log.Info("cordon recorded", "slot", c.Slot, "node", c.Node, "cordonedByUs", rec.CordonedByUs)
	return nil
}

func (r *poolReconciler) applyBootcNodes(ctx context.Context, log logr.Logger, pool *fleetv1.BootcNodePool, w *observed, out plan.Output) error {
	for _, c := range out.CreateBootcNodes {
		bn := &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: c.Name}, Spec: c.Spec}
		bn.SetNoPlatformImage(c.NoPlatformImage)
		bn.SetRollout(c.RolloutState, c.RolloutReason)
		if err := controllerutil.SetControllerReference(pool, bn, r.client.Scheme()); err != nil {
			return err
		}
		switch err := r.client.Create(ctx, bn); {
		case err == nil:
			w.bootcNodes[c.Name] = bn
			logBootcNode(log, "BootcNode created", c)
		case !kerrors.IsAlreadyExists(err):
			return fmt.Errorf("creating BootcNode %s: %w", c.Name, err)
		}
	}
	for _, c := range out.UpdateBootcNodes {
		read := w.bootcNodes[c.Name]
		bn := read.DeepCopy()
		bn.Spec = c.Spec
		bn.SetNoPlatformImage(c.NoPlatformImage)
		bn.SetRollout(c.RolloutState, c.RolloutReason)
		// A merge patch of what the coordinator owns (spec and its
		// annotations), not an Update: the agent writes the status all the
		// time, and a resourceVersion precondition would make nearly every
		// such write conflict with it for nothing.
		if err := r.client.Patch(ctx, bn, client.MergeFrom(read)); err != nil {
			return fmt.Errorf("setting BootcNode %s spec: %w", c.Name, err)
		}
		w.bootcNodes[c.Name] = bn
		logBootcNode(log, "BootcNode updated", c)
	}
	for _, name := range out.DeleteBootcNodes {
		bn := w.bootcNodes[name]
		if bn == nil {
			continue
		}
		pre := client.Preconditions{UID: &bn.UID}
		if err := r.client.Delete(ctx, bn, pre); err != nil && !kerrors.IsNotFound(err) {
			return fmt.Errorf("deleting BootcNode %s: %w", name, err)
		}
	}
	return nil
}

func logBootcNode(log logr.Logger, msg string, c plan.BootcNodeChange) {
	if c.NoPlatformImage != "" {
		log.Info(msg+": no image for the node's platform, so no desired image and no grants", "node", c.Name, "why", c.NoPlatformImage)
		return
	}
	log.V(1).Info(msg, "node", c.Name, "desiredImage", c.Spec.DesiredImage)
}

func waitKey(pool, node string, k lease.Kind) string { return pool + "/" + node + "/" + string(k) }

// observeMetrics sets the gauges from what this reconcile saw and wrote, and
// notes when nodes start waiting for a slot (for GrantLatency).
func (r *poolReconciler) observeMetrics(pool string, w *observed, in plan.Input, out plan.Output) {
	held := map[lease.Kind]int{lease.KindReboot: 0, lease.KindStage: 0}
	holders := map[string]bool{}
	for _, l := range w.leases {
		if s, ok := plan.ParseSlot(pool, l); ok && s.State != plan.SlotFree {
			held[s.Kind]++
			holders[s.Holder] = true
		}
	}
	for k, n := range held {
		metrics.SlotsHeld.WithLabelValues(pool, string(k)).Set(float64(n))
	}
	phases := map[fleetv1.NodePhase]int{}
	for _, p := range []fleetv1.NodePhase{fleetv1.PhaseIdle, fleetv1.PhaseWaiting, fleetv1.PhaseStaging, fleetv1.PhaseStaged, fleetv1.PhaseRebooting, fleetv1.PhaseDegraded} {
		phases[p] = 0
	}
	members := map[string]bool{}
	for _, n := range in.Nodes {
		members[n.Name] = n.InPool
	}
	for _, bn := range in.BootcNodes {
		if members[bn.Name] && bn.Status.Phase != "" {
			phases[bn.Status.Phase]++
		}
	}
	for p, n := range phases {
		metrics.NodesByPhase.WithLabelValues(pool, string(p)).Set(float64(n))
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	now := in.Now
	for _, bn := range in.BootcNodes {
		if !members[bn.Name] || holders[bn.Name] {
			continue
		}
		var kind lease.Kind
		switch bn.Status.Phase {
		case fleetv1.PhaseWaiting:
			kind = lease.KindStage
		case fleetv1.PhaseStaged:
			kind = lease.KindReboot
		default:
			continue
		}
		if _, ok := r.waiting[waitKey(pool, bn.Name, kind)]; !ok {
			r.waiting[waitKey(pool, bn.Name, kind)] = now
		}
	}
}

func setCondition(st *fleetv1.BootcNodePoolStatus, typ string, status metav1.ConditionStatus, reason, msg string, gen int64) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen})
}
