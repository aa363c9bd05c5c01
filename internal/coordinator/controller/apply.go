package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/go-logr/logr"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/metrics"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// writeParallelism bounds the writes one pass has in flight: a wave of a
// 1,000-node pool grants 100 slots, and written one after another they
// would hold every release behind them for a second. On a loaded API server
// a write takes a quarter of a second, and at 5,000 nodes a pass has 600
// slot changes: at 16 in flight passes grew to half a minute, each holding
// the next wave's releases behind it (1,011 nodes updated after 3 minutes,
// against 2,949 at 64).
const writeParallelism = 64

// apply makes the plan's changes and stops at the first failure. Each slot's
// changes of the pass are one Update of the Lease as read (a release and the
// grant that hands the slot on are one write), so a concurrent writer makes
// it fail with Conflict. Slots are independent, so their writes go out
// concurrently, in rounds (slotRounds): what a grant counts on is written
// before it. applied reports whether any slot changed.
func (r *poolReconciler) apply(ctx context.Context, log logr.Logger, pool *fleetv1.BootcNodePool, w *observed, in plan.Input, out plan.Output) (applied bool, err error) {
	if pool, err = r.recordQuarantineFirst(ctx, log, pool, out.Status); err != nil {
		return false, err
	}
	if err := r.parallel(ctx, len(out.CreateSlots), func(ctx context.Context, i int) error {
		ref := out.CreateSlots[i]
		l := plan.NewSlotLease(pool.Name, ref)
		if err := controllerutil.SetOwnerReference(pool, l, r.client.Scheme()); err != nil {
			return err
		}
		switch err := r.client.Create(ctx, l); {
		case err == nil:
			r.writes.wrote(pool.Name, kindLease, l)
		case !kerrors.IsAlreadyExists(err):
			return fmt.Errorf("creating slot Lease %s: %w", ref.Name, err)
		}
		return nil
	}); err != nil {
		return len(out.CreateSlots) > 0, err
	}
	applied = len(out.CreateSlots) > 0
	for _, name := range out.DeleteSlots {
		l := w.leases[name]
		// Only the free slot as read: a grant written since makes this fail.
		pre := client.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion}
		if err := r.client.Delete(ctx, l, pre); err != nil && !kerrors.IsNotFound(err) {
			return applied, fmt.Errorf("deleting surplus slot Lease %s: %w", name, err)
		}
		r.writes.deleted(pool.Name, kindLease, l)
	}

	targets := newTargetsAfterGrants(w, out.UpdateBootcNodes)
	for _, round := range slotRounds(out.Changes) {
		written := make([]*coordinationv1.Lease, len(round))
		err := r.parallel(ctx, len(round), func(ctx context.Context, i int) error {
			l, err := r.applySlot(ctx, log, pool, w, w.leases[round[i][0].Slot], round[i], in.Now)
			written[i] = l
			if l != nil {
				targets.granted(r.bootcNodes, pool.Name, round[i])
			}
			return err
		})
		for _, l := range written {
			if l != nil {
				w.leases[l.Name] = l
				applied = true
			}
		}
		if err != nil {
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
	if err := r.writeStatus(ctx, pool, out.Status); err != nil {
		return applied, err
	}
	r.observeMetrics(pool.Name, w, in, out.FinishedSlots)
	r.progress.observePool(pool, out.Status, w.leases, in, out.FinishedSlots)
	// Last: the slots as written say which nodes hold a reboot slot.
	return applied, r.markAutoscalers(ctx, log, pool.Name, w)
}

// slotRounds groups the pass's changes by slot (in the plan's order within
// each slot: a release and the grant handing the slot on are one write) and
// orders the slots into rounds, each written concurrently once the one
// before succeeded, so a grant is never written after a failed release it
// was counted on: a reboot grant counts on the reboot slots freed and on its
// node's own stage slot being released, a stage grant on the stage slots
// freed. Reboot grants do not wait behind a wave of stage releases.
func slotRounds(changes []plan.SlotChange) [][][]plan.SlotChange {
	var order []string
	by := map[string][]plan.SlotChange{}
	rebootGranted := map[string]bool{}
	for _, c := range changes {
		if _, ok := by[c.Slot]; !ok {
			order = append(order, c.Slot)
		}
		by[c.Slot] = append(by[c.Slot], c)
		if c.Op == plan.OpGrant && c.Kind == lease.KindReboot {
			rebootGranted[c.Node] = true
		}
	}
	rounds := make([][][]plan.SlotChange, 3)
	for _, slot := range order {
		chain := by[slot]
		grant := slices.ContainsFunc(chain, func(c plan.SlotChange) bool { return c.Op == plan.OpGrant })
		kind := chain[0].Kind
		switch {
		case !grant && (kind == lease.KindReboot || rebootGranted[chain[0].Node]):
			rounds[0] = append(rounds[0], chain)
		case kind == lease.KindReboot || !grant:
			rounds[1] = append(rounds[1], chain)
		default:
			rounds[2] = append(rounds[2], chain)
		}
	}
	return rounds
}

// parallel runs do(0..n-1), at most writeParallelism at a time, and returns
// the first error; after one, no new call starts, and the calls in flight
// finish on ctx, the caller's (amendment 33). A call is a slot's writes in
// their order (uncordon, Lease, cordon): cancelling the others at the first
// failure would leave them half done, a grant written without its cordon
// or a request aborted with no answer, for the next pass to find and mend,
// where letting them finish costs at most the writes already started.
func (r *poolReconciler) parallel(ctx context.Context, n int, do func(ctx context.Context, i int) error) error {
	if n == 1 {
		return do(ctx, 0)
	}
	// A Group without a context: the first error cancels nothing.
	var g errgroup.Group
	g.SetLimit(writeParallelism)
	var failed atomic.Bool
	for i := range n {
		if failed.Load() {
			break
		}
		g.Go(func() error {
			if failed.Load() {
				return nil // queued behind the limit when the first failed
			}
			err := ctx.Err()
			if err == nil {
				err = do(ctx, i)
			}
			if err != nil {
				failed.Store(true)
			}
			return err
		})
	}
	return g.Wait()
}

// recordEvents records the plan's Events. Every Event is an API write, so
// a node's routine update is one Event on its Node (amendment 29):
// `NodeUpdated` (or `RolledBack`) once it is done, with the pool as related
// object; the steps before it (staged, reboot granted, drained, back) are
// logged, and said meanwhile by the BootcNode's rollout-state. Other Normal
// Events about a node (revokes, releases) go on its Node, so `kubectl
// describe node` tells every update and every grant taken back, and
// `kubectl bootc-fleet explain`, which reads the Events of the Node and the
// BootcNode, the whole story. A Warning about a node goes
// on the Node, the BootcNode and the pool, with the Node as related object
// there (without it events.k8s.io/v1 would fold the Events of different
// nodes with the same reason into one series that keeps the first note).
func (r *poolReconciler) recordEvents(pool *fleetv1.BootcNodePool, w *observed, out plan.Output) {
	for _, e := range out.Events {
		if stepOfUpdate(e) {
			r.log.Info("node update step", "pool", pool.Name, "node", e.Node, "reason", e.Reason, "message", e.Message)
			continue
		}
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
		bn := w.bootcNodes[e.Node]
		onBootcNode := bn != nil && bn.UID != "" && bn.Spec.Pool == pool.Name
		r.recorder.Eventf(node, pool, e.Type, e.Reason, "Reconcile", "%s", e.Message)
		if e.Type != corev1.EventTypeNormal {
			r.recorder.Eventf(pool, node, e.Type, e.Reason, "Reconcile", "%s", e.Message)
			if onBootcNode {
				r.recorder.Eventf(bn, pool, e.Type, e.Reason, "Reconcile", "%s", e.Message)
			}
		}
	}
}

// stepOfUpdate: a Normal Event about a step of a node's routine update
// before it is done, logged instead of recorded (amendment 29).
func stepOfUpdate(e plan.Event) bool {
	if e.Type != corev1.EventTypeNormal || e.Node == "" {
		return false
	}
	switch e.Reason {
	case fleetv1.EventStaged, fleetv1.EventRebootGranted, fleetv1.EventDrained, fleetv1.EventNodeBack:
		return true
	}
	return false
}

// applySlot makes one slot's changes of the pass on read with one Update and
// returns the Lease written (nil if none was). The nodes whose cordon a
// change lifts are uncordoned first: if we stop in between, the grant is
// still there to say the cordon was ours. A reboot grant (or a Draining
// grant whose node lost its cordon) is then cordoned, and its drain started.
func (r *poolReconciler) applySlot(ctx context.Context, log logr.Logger, pool *fleetv1.BootcNodePool, w *observed, read *coordinationv1.Lease, chain []plan.SlotChange, now time.Time) (*coordinationv1.Lease, error) {
	if read == nil {
		return nil, fmt.Errorf("slot Lease %s vanished", chain[0].Slot)
	}
	var cordon *plan.SlotChange
	l := read.DeepCopy()
	changed := false
	for i, c := range chain {
		if c.Uncordon {
			if err := r.uncordon(ctx, pool.Name, w, c.Node); err != nil && !kerrors.IsNotFound(err) {
				return nil, err
			}
		}
		if c.Op == plan.OpCordon || (c.Op == plan.OpGrant && c.Kind == lease.KindReboot) {
			cordon = &chain[i]
		}
		if c.Op != plan.OpCordon {
			plan.ApplyToLease(l, c, now, r.opts.LeaseDuration)
			changed = true
		}
	}
	var written *coordinationv1.Lease
	if changed {
		if err := r.client.Update(ctx, l); err != nil {
			last := chain[len(chain)-1]
			return nil, fmt.Errorf("%s slot %s for node %s: %w", ops(chain), last.Slot, last.Node, err)
		}
		r.writes.wrote(pool.Name, kindLease, l)
		written = l
		for _, c := range chain {
			r.slotChanged(log, pool.Name, c, now)
		}
	}
	if cordon == nil {
		return written, nil
	}
	return written, r.cordon(ctx, log, pool.Name, w, l, *cordon)
}

func ops(chain []plan.SlotChange) string {
	var s []string
	for _, c := range chain {
		s = append(s, string(c.Op))
	}
	return strings.Join(s, "+")
}

// slotChanged logs a written change and counts it.
func (r *poolReconciler) slotChanged(log logr.Logger, pool string, c plan.SlotChange, now time.Time) {
	if c.Op == plan.OpCordon {
		return
	}
	log.Info("slot "+string(c.Op), "slot", c.Slot, "node", c.Node, "why", c.Why, "image", c.Image.String())
	switch c.Op {
	case plan.OpGrant:
		metrics.Grants.WithLabelValues(pool, string(c.Kind)).Inc()
		metrics.PoolLastGrant.WithLabelValues(pool).Set(float64(now.Unix()))
		r.progress.moved(pool, now)
		r.mu.Lock()
		if since, ok := r.waiting[waitKey(pool, c.Node, c.Kind)]; ok {
			metrics.GrantLatency.WithLabelValues(pool, string(c.Kind)).Observe(now.Sub(since).Seconds())
			delete(r.waiting, waitKey(pool, c.Node, c.Kind))
		}
		r.mu.Unlock()
	case plan.OpRelease:
		r.progress.moved(pool, now)
	case plan.OpRevoke:
		metrics.Revokes.WithLabelValues(pool, c.Why).Inc()
	case plan.OpMarkFailed:
		metrics.Failures.WithLabelValues(pool, c.Failure).Inc()
	}
}

// applyBootcNodes creates the plan's new BootcNodes, hands changes of
// existing ones to the background writer and deletes those of nodes that
// left. Both go in the plan's order (the queue order, plan.membership): a
// node stages only once its BootcNode asks for the target, and a pool's
// creations take seconds at 1,000 nodes, so the first wave's nodes are
// written first. A BootcNode this coordinator created that the cache does
// not show yet is not created again (createdUnseen).
func (r *poolReconciler) applyBootcNodes(ctx context.Context, log logr.Logger, pool *fleetv1.BootcNodePool, w *observed, out plan.Output) error {
	// Pacing of writes, not a decision: the process's own clock.
	now := time.Now()
	inCache := func(name string) bool { return w.bootcNodes[name] != nil }
	r.bootcNodes.pruneCreated(inCache, now)
	creates := make([]plan.BootcNodeChange, 0, len(out.CreateBootcNodes))
	for _, c := range out.CreateBootcNodes {
		if !r.bootcNodes.createdUnseen(c.Name) {
			creates = append(creates, c)
		}
	}
	if err := r.createBootcNodes(ctx, log, pool, w, creates); err != nil {
		return err
	}
	// Existing BootcNodes are written in the background (bootcNodeWriter).
	for _, c := range out.UpdateBootcNodes {
		r.bootcNodes.set(pool.Name, c, onlyNotes(w, c), newSlotKind(w, c))
	}
	for _, name := range out.DeleteBootcNodes {
		bn := w.bootcNodes[name]
		if bn == nil {
			continue
		}
		r.bootcNodes.forget(name)
		pre := client.Preconditions{UID: &bn.UID}
		if err := r.client.Delete(ctx, bn, pre); err != nil && !kerrors.IsNotFound(err) {
			return fmt.Errorf("deleting BootcNode %s: %w", name, err)
		}
		r.writes.deleted(pool.Name, kindBootcNode, bn)
	}
	return nil
}

func logBootcNode(log logr.Logger, msg string, c plan.BootcNodeChange) {
	if c.NoPlatformImage != "" {
		log.Info(msg+": no image for the node's platform, so no desired image and no grants", "node", c.Name, "why", c.NoPlatformImage)
		return
	}
	log.V(1).Info(msg, "node", c.Name, "desiredImage", c.Spec.DesiredImage, "rolloutState", c.RolloutState)
}

func waitKey(pool, node string, k lease.Kind) string { return pool + "/" + node + "/" + string(k) }

// observeMetrics sets the gauges from what this reconcile saw and wrote, and
// notes when nodes start waiting for a slot (for GrantLatency). finished
// are the grants of the stage slots whose holders were done with them
// (plan.Output.FinishedSlots): no longer held, and their holders may wait
// for a reboot slot (amendment 31). A slot written in the pass carries
// another grant.
func (r *poolReconciler) observeMetrics(pool string, w *observed, in plan.Input, finished map[lease.ID]bool) {
	held := map[lease.Kind]int{lease.KindReboot: 0, lease.KindStage: 0}
	holders := map[string]bool{}
	for _, l := range w.leases {
		if s, ok := plan.ParseSlot(pool, l); ok && s.State != plan.SlotFree && !finished[s.Grant.ID] {
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
	waiting := map[string]bool{}
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
		key := waitKey(pool, bn.Name, kind)
		waiting[key] = true
		if _, ok := r.waiting[key]; !ok {
			r.waiting[key] = now
		}
	}
	// A node that stopped waiting without a grant (left the pool, was
	// deleted, went Degraded) takes its clock with it.
	for k := range r.waiting {
		if strings.HasPrefix(k, pool+"/") && !waiting[k] {
			delete(r.waiting, k)
		}
	}
}

func setCondition(st *fleetv1.BootcNodePoolStatus, typ string, status metav1.ConditionStatus, reason, msg string, gen int64) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// forgetPool drops the GrantLatency clocks of a deleted pool's nodes.
func (r *poolReconciler) forgetPool(pool string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.waiting {
		if strings.HasPrefix(k, pool+"/") {
			delete(r.waiting, k)
		}
	}
}
