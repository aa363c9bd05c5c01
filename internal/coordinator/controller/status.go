package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// The pool's status: what the planner reads back is written at once, the
// rest at most every statusEvery.

// recordQuarantineFirst writes the pool's status before anything else of
// the pass when it quarantines a target (amendment 34). The quarantine
// lives only in status.quarantine, and the slot writes of the same pass
// (the failed grant, or the release of a node that came back by itself)
// and of the next (the rollback grant) take away what it was derived from:
// written after them, a status update that fails, or a restart in between,
// would let the image through to the next node. If this write fails,
// nothing of the pass is done. It returns the pool as written (or as read,
// when nothing was).
func (r *poolReconciler) recordQuarantineFirst(ctx context.Context, log logr.Logger, pool *fleetv1.BootcNodePool, st fleetv1.BootcNodePoolStatus) (*fleetv1.BootcNodePool, error) {
	if st.Quarantine == nil || equality.Semantic.DeepEqual(pool.Status.Quarantine, st.Quarantine) {
		return pool, nil
	}
	written, err := r.updateStatus(ctx, pool, st)
	if err != nil {
		return pool, fmt.Errorf("recording the quarantine of %s before acting on it: %w", st.Quarantine.Digest, err)
	}
	log.Info("quarantine recorded", "digest", st.Quarantine.Digest, "node", st.Quarantine.Node, "reason", st.Quarantine.Reason)
	return written, nil
}

// statusEvery is how often a pool's status is written when only its counts
// and messages changed: a busy pool passes many times a second, and one
// status write per pass was the largest share of the coordinator's writes.
const statusEvery = time.Second

// writeStatus writes the pool's new status now if a decision rests on what
// changed (the conditions' status or reason, the target image, the observed
// generation: the planner reads those back to tell transitions), else at
// most every statusEvery; a pass that leaves one unwritten is followed by
// another in time to write it (statusDue).
func (r *poolReconciler) writeStatus(ctx context.Context, pool *fleetv1.BootcNodePool, st fleetv1.BootcNodePoolStatus) error {
	// Pacing of writes, not a decision: the process's own clock.
	now := time.Now()
	if equality.Semantic.DeepEqual(pool.Status, st) {
		r.setStatusDue(pool.Name, 0)
		return nil
	}
	r.mu.Lock()
	last := r.statusWritten[pool.Name]
	r.mu.Unlock()
	if !statusUrgent(pool.Status, st) && now.Sub(last) < statusEvery {
		r.setStatusDue(pool.Name, last.Add(statusEvery).Sub(now))
		return nil
	}
	_, err := r.updateStatus(ctx, pool, st)
	return err
}

// updateStatus writes st as pool's status now and returns the pool as
// written.
func (r *poolReconciler) updateStatus(ctx context.Context, pool *fleetv1.BootcNodePool, st fleetv1.BootcNodePoolStatus) (*fleetv1.BootcNodePool, error) {
	p := pool.DeepCopy()
	p.Status = st
	if err := r.client.Status().Update(ctx, p); err != nil {
		return nil, fmt.Errorf("updating pool status: %w", err)
	}
	// The typed client clears TypeMeta on decode; Events and owner
	// references made from the returned object need it.
	p.TypeMeta = pool.TypeMeta
	r.writes.wrote(pool.Name, kindPool, p)
	r.mu.Lock()
	r.statusWritten[pool.Name] = time.Now()
	r.mu.Unlock()
	r.setStatusDue(pool.Name, 0)
	return p, nil
}

func (r *poolReconciler) setStatusDue(pool string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d <= 0 {
		delete(r.statusDue, pool)
		return
	}
	r.statusDue[pool] = d
}

// statusUrgent: b differs from a in something the planner reads back.
func statusUrgent(a, b fleetv1.BootcNodePoolStatus) bool {
	if a.ObservedGeneration != b.ObservedGeneration || a.TargetImage != b.TargetImage || len(a.Conditions) != len(b.Conditions) {
		return true
	}
	if !equality.Semantic.DeepEqual(a.Quarantine, b.Quarantine) || !equality.Semantic.DeepEqual(a.Canary, b.Canary) {
		return true
	}
	for _, c := range b.Conditions {
		old := meta.FindStatusCondition(a.Conditions, c.Type)
		if old == nil || old.Status != c.Status || old.Reason != c.Reason || old.ObservedGeneration != c.ObservedGeneration {
			return true
		}
	}
	return false
}
