package controller

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/metrics"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// poolReconciler reconciles one BootcNodePool at a time: read, Plan, write.
type poolReconciler struct {
	client client.Client // reads from the informer cache
	cache  cache.Cache   // the informers' own objects (cachedreads.go)
	// apiReader reads from the API server (an undecodable pool, unstructured).
	apiReader client.Reader
	// undecodable: BootcNodes and pools the cache set aside.
	undecodable *undecodables
	writes      *ownWrites // what the cache must show before a pass plans
	// bootcNodes writes existing BootcNodes in the background.
	bootcNodes *bootcNodeWriter
	recorder   recorder.EventRecorder
	drains     *drainTracker
	targets    *targetCache
	seen       *heartbeats
	slotClock  *slotClock // timers of slot records on this process's clock
	stages     *stageTimers
	gate       *healthGate // the health gate's pods and metrics query
	opts       Options
	log        logr.Logger

	mu      sync.Mutex
	waiting map[string]time.Time // pool/node/kind -> first seen waiting, for GrantLatency
	// progress: what the progress gauges compare with (poolmetrics.go).
	progress *poolProgress
	// statusWritten: when each pool's status was last written; statusDue:
	// how soon a status left unwritten must be (writeStatus).
	statusWritten map[string]time.Time
	statusDue     map[string]time.Duration
	// badMarks: per Node, the unusable autoscaler marks last logged.
	badMarks map[string]string
}

func (r *poolReconciler) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("bootcnodepool").
		// A FIFO queue, not controller-runtime's priority queue: that one
		// puts every pool read at startup behind every pool with an event,
		// for good. After a restart, a pool with no events of its own (a
		// new pool: its nodes have no BootcNodes to report on yet) then
		// waits as long as busy pools keep the workers occupied, which under
		// load can be minutes. Pools take turns here.
		WithOptions(controller.Options{SkipNameValidation: ptrTrue(), MaxConcurrentReconciles: r.opts.Workers, UsePriorityQueue: ptrFalse()}).
		For(&fleetv1.BootcNodePool{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}))).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.poolsOfNode), builder.WithPredicates(nodeChanged())).
		Watches(&fleetv1.BootcNode{}, handler.EnqueueRequestsFromMapFunc(poolOfBootcNode), builder.WithPredicates(bootcNodeChanged())).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(poolOfLease)).
		WatchesRawSource(source.Channel(r.drains.events, &handler.TypedEnqueueRequestForObject[*fleetv1.BootcNodePool]{})).
		WatchesRawSource(source.Channel(r.targets.events, &handler.TypedEnqueueRequestForObject[*fleetv1.BootcNodePool]{})).
		WatchesRawSource(source.Channel(r.undecodable.events, &handler.TypedEnqueueRequestForObject[*fleetv1.BootcNodePool]{})).
		Complete(r)
}

func ptrTrue() *bool  { t := true; return &t }
func ptrFalse() *bool { f := false; return &f }

// poolsOfNode maps a Node to every pool whose selector matches it, and to the
// pool of its BootcNode (so a node leaving a pool reaches that pool).
func (r *poolReconciler) poolsOfNode(ctx context.Context, o client.Object) []reconcile.Request {
	var pools fleetv1.BootcNodePoolList
	if err := r.client.List(ctx, &pools); err != nil {
		return nil
	}
	seen := map[string]bool{}
	var out []reconcile.Request
	add := func(name string) {
		if name != "" && !seen[name] {
			seen[name] = true
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
		}
	}
	for i := range pools.Items {
		if sel, err := metav1.LabelSelectorAsSelector(&pools.Items[i].Spec.NodeSelector); err == nil && !sel.Empty() && sel.Matches(labels.Set(o.GetLabels())) {
			add(pools.Items[i].Name)
		}
	}
	var bn fleetv1.BootcNode
	if err := r.client.Get(ctx, types.NamespacedName{Name: o.GetName()}, &bn); err == nil {
		add(bn.Spec.Pool)
	}
	return out
}

func poolOfBootcNode(_ context.Context, o client.Object) []reconcile.Request {
	bn, ok := o.(*fleetv1.BootcNode)
	if !ok || bn.Spec.Pool == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: bn.Spec.Pool}}}
}

func poolOfLease(_ context.Context, o client.Object) []reconcile.Request {
	if p := o.GetLabels()[lease.LabelPool]; p != "" && o.GetNamespace() == lease.Namespace {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: p}}}
	}
	return nil
}

// Reconcile implements reconcile.Reconciler.
func (r *poolReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := r.log.WithValues("pool", req.Name)
	began := time.Now()
	if n := r.writes.awaitKinds(ctx, req.Name, r.client, cacheWait, kindLease, kindPool, kindNode); n > 0 {
		// Planned on anyway: a Lease write made on a stale read conflicts.
		log.Info("the cache did not show this coordinator's last writes in time; planning on it anyway", "writes", n, "waited", cacheWait.String())
	}
	awaited := time.Now()
	var pool fleetv1.BootcNodePool
	if err := r.client.Get(ctx, req.NamespacedName, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			return r.poolGone(ctx, req.Name)
		}
		return reconcile.Result{}, err
	}
	if pool.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	now := r.opts.Clock()
	tgt, untilResolve := r.targets.get(ctx, &pool, now)

	w, err := r.observe(ctx, &pool)
	if err != nil {
		if errors.Is(err, errInvalidSelector) {
			return reconcile.Result{}, r.invalidSpec(ctx, &pool, err)
		}
		return reconcile.Result{}, err
	}
	in := r.planInput(&pool, w, tgt, now)
	recheck := r.gate.fill(ctx, &pool, w.bootcNodes, &in, now)
	observed := time.Now()
	out := plan.Plan(in)
	if recheck > 0 && (out.RequeueAfter <= 0 || recheck < out.RequeueAfter) {
		out.RequeueAfter = recheck
	}
	r.stages.sawUngranted(req.Name, out.StagingWithoutGrant, now)
	r.noteUndecodable(&pool, &out.Status)

	planned := time.Now()
	applied, err := r.apply(ctx, log, &pool, w, in, out)
	log.V(1).Info("pass", "slotChanges", len(out.Changes), "bootcNodeWrites", len(out.CreateBootcNodes)+len(out.UpdateBootcNodes),
		"events", len(out.Events), "readAndPlan", planned.Sub(began).String(), "write", time.Since(planned).String(),
		"awaitOwnWrites", awaited.Sub(began).String(), "observe", observed.Sub(awaited).String(), "plan", planned.Sub(observed).String())
	if err != nil {
		if apierrors.IsConflict(err) {
			// Someone else changed a Lease or the pool since we read it:
			// read again and plan again.
			log.V(1).Info("conflict, replanning", "error", err.Error())
			metrics.Conflicts.WithLabelValues(req.Name).Inc()
			return reconcile.Result{RequeueAfter: 200 * time.Millisecond}, nil
		}
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: r.requeueAfter(req.Name, untilResolve, out.RequeueAfter, applied)}, nil
}

// poolGone forgets what this coordinator kept about a pool that is not in
// the cache: deleted, or set aside as undecodable.
func (r *poolReconciler) poolGone(ctx context.Context, name string) (reconcile.Result, error) {
	// Slot Leases and BootcNodes carry an ownerReference to the pool
	// and go with it.
	r.targets.forget(name)
	r.stages.forget(name)
	r.writes.forget(name)
	r.mu.Lock()
	delete(r.statusWritten, name)
	delete(r.statusDue, name)
	r.mu.Unlock()
	r.drains.forgetExcept(name, nil)
	r.forgetPool(name)
	r.progress.forget(name)
	r.slotClock.forget(name)
	r.gate.forget(name)
	metrics.ForgetPool(name)
	if u, ok := r.undecodable.get(kindPool, name); ok {
		// Not gone: set aside, so it gets no action; say why on it,
		// and look again later (it is in no cache to wake us).
		return reconcile.Result{RequeueAfter: r.opts.RequeueInterval}, r.reportUndecodablePool(ctx, u)
	}
	return reconcile.Result{}, nil
}

// planInput completes the observed world with the target, the drains, the
// clock and what this coordinator remembers between passes.
func (r *poolReconciler) planInput(pool *fleetv1.BootcNodePool, w *observed, tgt target, now time.Time) plan.Input {
	in := w.input
	in.Target, in.ResolveError, in.Drains, in.Now, in.LeaseDuration = tgt.pinned, tgt.err, r.drains.snapshot(), now, r.opts.LeaseDuration
	in.Index, in.IndexUnknown, in.Uninspected = tgt.index, tgt.indexUnknown, tgt.uninspected
	in.Heartbeats, in.QuietAfter = r.seen.observe(in.BootcNodes, now), r.opts.QuietAfter
	r.seen.forgetGone(w.bootcNodes)
	r.slotClock.observe(pool.Name, in.Slots, now)
	in.GrantsSeen, in.UngrantedStagingSince = r.stages.observe(pool.Name, in.Slots, now)
	if tgt.err == "" {
		in.ResolvedAt = tgt.ok
	}
	return in
}

// requeueAfter is when the pool is reconciled again: the soonest of the
// requeue interval, the next resolution, the plan's next deadline, a due
// status write, and a second after a pass that wrote.
func (r *poolReconciler) requeueAfter(pool string, untilResolve, planned time.Duration, applied bool) time.Duration {
	after := min(r.opts.RequeueInterval, untilResolve)
	if planned > 0 {
		after = min(after, planned)
	}
	r.mu.Lock()
	due, ok := r.statusDue[pool]
	r.mu.Unlock()
	if ok {
		after = min(after, due)
	}
	if applied {
		after = min(after, time.Second)
	}
	return after
}

var errInvalidSelector = errors.New("invalid spec.nodeSelector")

// cacheWait bounds how long a pass waits for the cache to show the previous
// pass's writes; watch events normally arrive within milliseconds.
const cacheWait = 5 * time.Second

// Kinds of objects the coordinator writes, for ownWrites.
const (
	kindLease     = "Lease"
	kindBootcNode = "BootcNode"
	kindPool      = "BootcNodePool"
	kindNode      = "Node"
)

func newObject(kind string) client.Object {
	switch kind {
	case kindLease:
		return &coordinationv1.Lease{}
	case kindBootcNode:
		return &fleetv1.BootcNode{}
	case kindPool:
		return &fleetv1.BootcNodePool{}
	default:
		return &corev1.Node{}
	}
}

// observed is one read of a pool's world from the cache (after ownWrites).
type observed struct {
	input      plan.Input
	leases     map[string]*coordinationv1.Lease // slot Leases by name, as read
	bootcNodes map[string]*fleetv1.BootcNode
	nodeUIDs   map[string]types.UID // the Nodes Events are recorded on
	// nodes are the cache's Nodes the pool sees, and those carrying an
	// autoscaler-marks record of one of its slots (read only).
	nodes map[string]*corev1.Node
	// touched: Nodes this pass cordoned or uncordoned (their autoscaler
	// marks went with that write).
	touchedMu sync.Mutex
	touched   map[string]bool
}

// touch notes that this pass wrote node's cordon.
func (w *observed) touch(node string) {
	w.touchedMu.Lock()
	defer w.touchedMu.Unlock()
	w.touched[node] = true
}

func (r *poolReconciler) observe(ctx context.Context, pool *fleetv1.BootcNodePool) (*observed, error) {
	sel, err := metav1.LabelSelectorAsSelector(&pool.Spec.NodeSelector)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidSelector, err)
	}
	if sel.Empty() {
		// The message as it has always read (the API server refuses an
		// empty selector, so only an object from before that rule has one).
		return nil, fmt.Errorf("%w: <nil>", errInvalidSelector)
	}
	others, err := r.otherPools(ctx, pool.Name)
	if err != nil {
		return nil, err
	}
	// The cache's own objects, not copies (cachedreads.go).
	nodes, err := r.cachedNodes(ctx)
	if err != nil {
		return nil, err
	}
	// From the cache, which shows at least this coordinator's own writes
	// (ownWrites). A grant planned on a slot as read is written conditionally
	// on that read, so a stale slot cannot exceed the budget: it conflicts.
	var leases coordinationv1.LeaseList
	if err := r.client.List(ctx, &leases, client.InNamespace(lease.Namespace), client.MatchingLabels{lease.LabelPool: pool.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing slot Leases: %w", err)
	}
	bns, err := r.cachedBootcNodes(ctx)
	if err != nil {
		return nil, err
	}

	w := &observed{leases: make(map[string]*coordinationv1.Lease, len(leases.Items)),
		bootcNodes: make(map[string]*fleetv1.BootcNode, len(bns)), nodeUIDs: make(map[string]types.UID, len(nodes)),
		nodes: make(map[string]*corev1.Node, len(nodes)), touched: map[string]bool{}}
	w.input.Pool, w.input.Nodes = pool, make([]plan.Node, 0, len(nodes))
	wanted := w.addSlots(pool.Name, leases.Items, bns)
	for _, n := range nodes {
		in := sel.Matches(labels.Set(n.Labels))
		if !in && !wanted[n.Name] {
			if marksOf(n) == pool.Name {
				w.nodes[n.Name] = n
			}
			continue
		}
		w.nodes[n.Name] = n
		w.nodeUIDs[n.Name] = n.UID
		w.input.Nodes = append(w.input.Nodes, planNode(n, in, others))
	}
	w.addBootcNodes(pool.Name)
	return w, nil
}

// otherPools are the selectors of the pools other than pool, to name the
// pools a node is in besides it.
func (r *poolReconciler) otherPools(ctx context.Context, pool string) (map[string]labels.Selector, error) {
	var pools fleetv1.BootcNodePoolList
	if err := r.client.List(ctx, &pools); err != nil {
		return nil, err
	}
	others := map[string]labels.Selector{}
	for i := range pools.Items {
		p := &pools.Items[i]
		if p.Name == pool || p.DeletionTimestamp != nil {
			continue
		}
		if s, err := metav1.LabelSelectorAsSelector(&p.Spec.NodeSelector); err == nil && !s.Empty() {
			others[p.Name] = s
		}
	}
	return others, nil
}

// addSlots keeps the pool's slot Leases and every BootcNode, and returns
// the nodes the pool refers to: holders of its slots, nodes of its
// BootcNodes.
func (w *observed) addSlots(pool string, leases []coordinationv1.Lease, bns []*fleetv1.BootcNode) map[string]bool {
	wanted := make(map[string]bool, len(leases))
	w.input.Slots = make([]plan.Slot, 0, len(leases))
	for i := range leases {
		l := &leases[i]
		s, ok := plan.ParseSlot(pool, l)
		if !ok {
			continue
		}
		w.leases[l.Name] = l
		w.input.Slots = append(w.input.Slots, s)
		if s.Holder != "" {
			wanted[s.Holder] = true
		}
	}
	for _, bn := range bns {
		if bn.Spec.Pool == pool {
			wanted[bn.Name] = true
		}
		w.bootcNodes[bn.Name] = bn
	}
	return wanted
}

// planNode is what the planner reads of a Node; in says the pool's
// selector matches it, others are the other pools' selectors.
func planNode(n *corev1.Node, in bool, others map[string]labels.Selector) plan.Node {
	pn := plan.Node{Name: n.Name, InPool: in, Ready: nodeReady(n), Unschedulable: n.Spec.Unschedulable, BootID: n.Status.NodeInfo.BootID,
		OS: n.Status.NodeInfo.OperatingSystem, Arch: n.Status.NodeInfo.Architecture,
		CordonedFor: n.Annotations[lease.NodeAnnotationCordonedFor]}
	pn.HoldReason, pn.Held = n.Annotations[fleetv1.AnnotationHold]
	pn.Zone = n.Labels[fleetv1.LabelZone]
	_, pn.Canary = n.Labels[fleetv1.LabelCanary]
	if in {
		for name, s := range others {
			if s.Matches(labels.Set(n.Labels)) {
				pn.OtherPools = append(pn.OtherPools, name)
			}
		}
		sort.Strings(pn.OtherPools)
	}
	return pn
}

// addBootcNodes gives the planner, sorted by name, the BootcNodes of the
// nodes it sees and those of the pool.
func (w *observed) addBootcNodes(pool string) {
	present := make(map[string]bool, len(w.input.Nodes))
	for _, n := range w.input.Nodes {
		present[n.Name] = true
	}
	// Counted first: the copies are the planner's input, and growing the
	// slice to them copied them again, on every pass.
	n := 0
	for name, bn := range w.bootcNodes {
		if present[name] || bn.Spec.Pool == pool {
			n++
		}
	}
	w.input.BootcNodes = make([]fleetv1.BootcNode, 0, n)
	for name, bn := range w.bootcNodes {
		if present[name] || bn.Spec.Pool == pool {
			w.input.BootcNodes = append(w.input.BootcNodes, *bn)
		}
	}
	sort.Slice(w.input.BootcNodes, func(i, j int) bool { return w.input.BootcNodes[i].Name < w.input.BootcNodes[j].Name })
}

// invalidSpec reports a selector the API server accepted but that selects
// nothing usable; nothing else is done for the pool.
func (r *poolReconciler) invalidSpec(ctx context.Context, pool *fleetv1.BootcNodePool, cause error) error {
	st := pool.Status.DeepCopy()
	st.ObservedGeneration = pool.Generation
	setCondition(st, fleetv1.PoolDegraded, metav1.ConditionTrue, fleetv1.ReasonInvalidSpec, cause.Error()+": fix spec.nodeSelector", pool.Generation)
	pool.Status = *st
	if err := r.client.Status().Update(ctx, pool); err != nil {
		return err
	}
	r.writes.wrote(pool.Name, kindPool, pool)
	return nil
}
