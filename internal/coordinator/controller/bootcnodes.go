package controller

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// bootcNodeWriter patches existing BootcNodes (spec and the coordinator's
// annotations) in the background, so a pass does not wait for them: in a
// wave of 100 grants a pass would otherwise write 100 rollout annotations
// before it could look at the next drain or boot. Nothing waits on these
// writes for safety: the planner grants only once the cache shows the
// BootcNode asking for the target (desiredIsTarget), whenever it lands.
//
// Each node's latest wanted content is kept; a workqueue never works on one
// node twice at a time, so writes of a node are ordered and a newer wish
// replaces an older one not written yet. The patch is computed against the
// cache once it shows this writer's previous write of the node, so a merge
// patch never rests on a stale base.
type bootcNodeWriter struct {
	client client.Client
	writes *ownWrites
	log    logr.Logger
	queue  priorityqueue.PriorityQueue[string]
	// workers write concurrently (bootcNodeWorkers).
	workers int

	mu   sync.Mutex
	want map[string]bootcNodeWish // by node
	// created: BootcNodes this coordinator created and its cache has not
	// shown yet, and when each create returned (createdUnseen).
	created map[string]time.Time
}

type bootcNodeWish struct {
	pool   string
	change plan.BootcNodeChange
	spec   bool // it changes more than the coordinator's annotations
	// newSlot is the kind of a slot it names that the BootcNode does not
	// name yet (reboot if both), or "".
	newSlot lease.Kind
}

// bootcNodeWorkers write BootcNodes concurrently. Few on purpose: these
// writes compete with the slot writes on the API server, and at 5,000 nodes
// 64 workers (the slot writes' parallelism) cut the nodes updated after 4.5
// minutes from 4,070 to 1,040, though the first spec patches landed sooner;
// a separate lane of 32 writers for spec patches alone cut the nodes updated
// after 2 minutes from 1,558 to 683: the API server is saturated there.
// Instead spec changes (which grants wait for) go first: they are queued at
// once and at a higher priority, annotation-only changes after
// annotationDelay at the lowest.
const bootcNodeWorkers = 8

// Priorities in the writer's queue: a node whose wish changes its spec is
// written before every node whose wish only explains. The node's agent
// watches only the Leases its BootcNode names (amendment 39), so until a
// new slot's name lands the node cannot see its grant: a wish naming a new
// stage slot goes as a spec change does, one naming a new reboot slot (at
// the advance to phase Reboot) before everything else: it is on the path of
// its wave, and an image change queues a patch for every node of the pool
// (at 1,000 nodes, with every stage slot granted at once, for 20 s).
var (
	priorityReboot = 2
	prioritySpec   = 1
	priorityNotes  = 0
)

func newBootcNodeWriter(c client.Client, writes *ownWrites, log logr.Logger) *bootcNodeWriter {
	return &bootcNodeWriter{
		client: c, writes: writes, log: log, workers: bootcNodeWorkers, want: map[string]bootcNodeWish{}, created: map[string]time.Time{},
		queue: priorityqueue.New("bootcnode-writes", func(o *priorityqueue.Opts[string]) {
			o.RateLimiter = workqueue.DefaultTypedControllerRateLimiter[string]()
			o.Log = log.WithName("queue")
		}),
	}
}

// annotationDelay is how long a change of only the rollout annotations
// waits before it is written, so a state a node passes through in a moment
// (Draining, for a node with nothing to evict) costs no API write: a newer
// wish replaces it. Spec changes go at once, since grants wait on them.
const annotationDelay = time.Second

// set asks for node's BootcNode to become c; onlyNotes says that c changes
// only the coordinator's annotations. A node already queued keeps the
// higher of its priorities and the sooner of its times.
//
// The order of the writes is the order of the calls, within a priority:
// controller-runtime's priority queue hands out ready items by priority,
// then by an added counter (priorityqueue.go, lessReady), which it takes
// when an item is first queued, when its priority rises and when its After
// delay ends; a node set again at the same priority keeps its place. The
// controller sets a pass's changes in the plan's order (the queue order,
// plan.membership), so spec changes are written in the order the nodes can
// stage and then reboot: the first wave's before the next wave's.
func (b *bootcNodeWriter) set(pool string, c plan.BootcNodeChange, onlyNotes bool, newSlot lease.Kind) {
	wish := bootcNodeWish{pool: pool, change: c, spec: !onlyNotes, newSlot: newSlot}
	b.mu.Lock()
	b.want[c.Name] = wish
	b.mu.Unlock()
	if onlyNotes && newSlot == "" {
		b.queue.AddWithOpts(priorityqueue.AddOpts{After: annotationDelay, Priority: &priorityNotes}, c.Name)
		return
	}
	b.queue.AddWithOpts(priorityqueue.AddOpts{Priority: wish.priority()}, c.Name)
}

func (w bootcNodeWish) priority() *int {
	switch {
	case w.newSlot == lease.KindReboot:
		return &priorityReboot
	case w.spec || w.newSlot != "":
		return &prioritySpec
	}
	return &priorityNotes
}

// forget drops what is wanted for node (its BootcNode is being deleted).
func (b *bootcNodeWriter) forget(node string) {
	b.mu.Lock()
	delete(b.want, node)
	b.mu.Unlock()
}

// Start implements manager.Runnable (leader only, like the reconciler).
func (b *bootcNodeWriter) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for range b.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b.next(ctx) {
			}
		}()
	}
	<-ctx.Done()
	b.queue.ShutDown()
	wg.Wait()
	return nil
}

func (b *bootcNodeWriter) next(ctx context.Context) bool {
	node, quit := b.queue.Get()
	if quit {
		return false
	}
	defer b.queue.Done(node)
	b.mu.Lock()
	wish, ok := b.want[node]
	b.mu.Unlock()
	if !ok {
		b.queue.Forget(node)
		return true
	}
	if err := b.write(ctx, wish); err != nil {
		b.log.Info("cannot update BootcNode; retrying", "node", node, "error", err.Error())
		b.queue.AddWithOpts(priorityqueue.AddOpts{RateLimited: true, Priority: wish.priority()}, node)
		return true
	}
	b.queue.Forget(node)
	b.mu.Lock()
	if cur, ok := b.want[node]; ok && reflect.DeepEqual(cur, wish) {
		delete(b.want, node)
	}
	b.mu.Unlock()
	return true
}

func (b *bootcNodeWriter) write(ctx context.Context, wish bootcNodeWish) error {
	c := wish.change
	// The base of the merge patch: the cache, once it shows our last write.
	b.writes.awaitOne(ctx, wish.pool, writeKey{kind: kindBootcNode, name: c.Name}, b.client, cacheWait)
	var read fleetv1.BootcNode
	if err := b.client.Get(ctx, client.ObjectKey{Name: c.Name}, &read); err != nil {
		if kerrors.IsNotFound(err) {
			return nil // deleted: nothing to write
		}
		return err
	}
	bn := read.DeepCopy()
	bn.Spec = c.Spec
	bn.SetNoPlatformImage(c.NoPlatformImage)
	bn.SetRollout(c.RolloutState, c.RolloutReason)
	bn.SetSlots(c.Slots)
	if equality.Semantic.DeepEqual(bn.Spec, read.Spec) && equality.Semantic.DeepEqual(bn.Annotations, read.Annotations) {
		return nil
	}
	// A merge patch of what the coordinator owns (spec and its annotations),
	// not an Update: the agent writes the status all the time, and a
	// resourceVersion precondition would make nearly every such write
	// conflict with it for nothing.
	if err := b.client.Patch(ctx, bn, client.MergeFrom(&read)); err != nil {
		return fmt.Errorf("setting BootcNode %s: %w", c.Name, err)
	}
	b.writes.wrote(wish.pool, kindBootcNode, bn)
	logBootcNode(b.log.WithValues("pool", wish.pool), "BootcNode updated", c)
	return nil
}

// createdFor is how long a BootcNode this coordinator created is taken to
// exist while its cache does not show it: a pass planned before the watch
// brought it in asks to create it again, which would cost the API server
// a POST that fails with AlreadyExists (at 1,000 nodes a quarter of the
// creations were such, 140 ms each on the loaded API server). After this
// long a node still missing from the cache is created again: it may have
// been deleted before the cache saw it.
const createdFor = cacheWait

// noteCreated records that this coordinator created node's BootcNode at now.
func (b *bootcNodeWriter) noteCreated(node string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.created[node] = now
}

// pruneCreated forgets the creations the cache shows (cached says whether
// it shows a BootcNode by that name) and those made createdFor or longer
// before now.
func (b *bootcNodeWriter) pruneCreated(cached func(string) bool, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for node, at := range b.created {
		if cached(node) || now.Sub(at) >= createdFor || now.Before(at) {
			delete(b.created, node)
		}
	}
}

// createdUnseen says whether node's BootcNode was created by this
// coordinator and not yet forgotten by pruneCreated: the cache did not show
// it yet, and it was created less than createdFor ago.
func (b *bootcNodeWriter) createdUnseen(node string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.created[node]
	return ok
}

// onlyNotes: c changes only the coordinator's annotations of the BootcNode
// as read, not its spec.
func onlyNotes(w *observed, c plan.BootcNodeChange) bool {
	read := w.bootcNodes[c.Name]
	return read != nil && equality.Semantic.DeepEqual(read.Spec, c.Spec) && read.Annotations[fleetv1.AnnotationNoPlatformImage] == c.NoPlatformImage
}

// newSlotKind is the kind of a slot c names that the BootcNode as read does
// not (a grant its agent cannot see until the name lands, amendment 39):
// reboot if one is, else stage if one is, else "".
func newSlotKind(w *observed, c plan.BootcNodeChange) lease.Kind {
	var had []string
	if read := w.bootcNodes[c.Name]; read != nil {
		had, _, _ = fleetv1.SlotsOf(read) // a bad annotation is rewritten whole
	}
	var k lease.Kind
	for _, s := range c.Slots {
		if slices.Contains(had, s) {
			continue
		}
		_, kind, _, err := lease.ParseSlotName(s)
		if err != nil || kind == lease.KindReboot {
			return lease.KindReboot // a name the coordinator made; unknown: the cautious side
		}
		k = kind
	}
	return k
}

// targetsAfterGrants hands the BootcNode writer a node's new target, and
// the name of a slot it is to watch, as soon as the grant (or the advance
// to phase Reboot) that goes out with it (amendment 29) is written, not
// once every slot of the pass is: at 1,000 nodes a pass that grants 1,000
// stage slots writes them for a second, and the first wave's targets would
// wait behind the last grant; and a node sees its grant only once its
// BootcNode names the slot (amendment 39), which for a reboot grant is on
// the path of its wave. The Lease is still written before the patch
// (amendment 29), and the targets are still handed over in the queue
// order, as the grants are written in it (amendment 30); applyBootcNodes
// hands over the rest, and a node handed over again keeps its place.
type targetsAfterGrants map[string]handOver

type handOver struct {
	change    plan.BootcNodeChange
	onlyNotes bool
	newSlot   lease.Kind
}

func newTargetsAfterGrants(w *observed, changes []plan.BootcNodeChange) targetsAfterGrants {
	t := targetsAfterGrants{}
	for _, c := range changes {
		h := handOver{change: c, onlyNotes: onlyNotes(w, c), newSlot: newSlotKind(w, c)}
		if !h.onlyNotes || h.newSlot != "" {
			t[c.Name] = h
		}
	}
	return t
}

// granted hands over the changes of the nodes chain granted a slot to or
// advanced to phase Reboot (chain was written). Calls may run concurrently:
// t is only read.
func (t targetsAfterGrants) granted(b *bootcNodeWriter, pool string, chain []plan.SlotChange) {
	for _, c := range chain {
		if c.Op != plan.OpGrant && c.Op != plan.OpAdvance {
			continue
		}
		if h, ok := t[c.Node]; ok {
			b.set(pool, h.change, h.onlyNotes, h.newSlot)
		}
	}
}

// createBootcNodes creates cs concurrently (writeParallelism at a time),
// started in cs's order.
func (r *poolReconciler) createBootcNodes(ctx context.Context, log logr.Logger, pool *fleetv1.BootcNodePool, w *observed, cs []plan.BootcNodeChange) error {
	created := make([]*fleetv1.BootcNode, len(cs))
	err := r.parallel(ctx, len(cs), func(ctx context.Context, i int) error {
		c := cs[i]
		bn := &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: c.Name}, Spec: c.Spec}
		bn.SetNoPlatformImage(c.NoPlatformImage)
		bn.SetRollout(c.RolloutState, c.RolloutReason)
		bn.SetSlots(c.Slots)
		if err := controllerutil.SetControllerReference(pool, bn, r.client.Scheme()); err != nil {
			return err
		}
		switch err := r.client.Create(ctx, bn); {
		case err == nil:
			r.writes.wrote(pool.Name, kindBootcNode, bn)
			r.bootcNodes.noteCreated(bn.Name, time.Now())
			created[i] = bn
			logBootcNode(log, "BootcNode created", c)
		case !kerrors.IsAlreadyExists(err):
			return fmt.Errorf("creating BootcNode %s: %w", c.Name, err)
		}
		return nil
	})
	for _, bn := range created {
		if bn != nil {
			w.bootcNodes[bn.Name] = bn
		}
	}
	return err
}
