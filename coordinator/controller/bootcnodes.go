package controller

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/coordinator/plan"
)

// bootcNodeWriter patches existing BootcNodes (spec and the coordinator's
// annotations) in the background, so a pass does not wait for them: in a
// wave of 100 grants a pass would otherwise write 100 rollout annotations
// before it could look at the next drain or boot. Nothing waits on these
// writes for safety: the planner grants only once the cache shows the
// BootcNode asking for the target (desiredIsTarget), whenever it lands.
//
// Each node's latest wanted content is kept, and a newer wish replaces an
// older one not written yet. Two lanes write them: spec changes, which
// grants wait for, and changes of only the rollout annotations, which
// nothing waits for. A node is written by one worker at a time (its lock),
// whichever lane it came through, so its writes are ordered. The patch is
// computed against the cache once it shows this writer's previous write of
// the node, so a merge patch never rests on a stale base.
type bootcNodeWriter struct {
	client client.Client
	writes *ownWrites
	log    logr.Logger
	spec   workqueue.TypedRateLimitingInterface[string]
	notes  workqueue.TypedRateLimitingInterface[string]

	mu    sync.Mutex
	want  map[string]bootcNodeWish // by node
	locks map[string]*sync.Mutex   // by node: one write at a time
}

type bootcNodeWish struct {
	pool   string
	change plan.BootcNodeChange
}

// specWorkers write spec changes: on an image change every node of the pool
// needs one before it can be granted anything, and at 5,000 nodes 8
// writers took two minutes to bring the new image to the median node.
// notesWorkers write annotation-only changes, few on purpose: they compete
// with the slot writes on the API server, and at 5,000 nodes 64 writers for
// both kinds cut the nodes updated after 4.5 minutes from 4,070 to 1,040.
const (
	specWorkers  = 32
	notesWorkers = 8
)

func newBootcNodeWriter(c client.Client, writes *ownWrites, log logr.Logger) *bootcNodeWriter {
	queue := func(name string) workqueue.TypedRateLimitingInterface[string] {
		return workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
	}
	return &bootcNodeWriter{
		client: c, writes: writes, log: log, want: map[string]bootcNodeWish{}, locks: map[string]*sync.Mutex{},
		spec: queue("bootcnode-spec-writes"), notes: queue("bootcnode-annotation-writes"),
	}
}

// annotationDelay is how long a change of only the rollout annotations
// waits before it is written, so a state a node passes through in a moment
// (Draining, for a node with nothing to evict) costs no API write: a newer
// wish replaces it. Spec changes go at once, since grants wait on them.
const annotationDelay = time.Second

// set asks for node's BootcNode to become c; onlyNotes says that c changes
// only the coordinator's annotations.
func (b *bootcNodeWriter) set(pool string, c plan.BootcNodeChange, onlyNotes bool) {
	b.mu.Lock()
	b.want[c.Name] = bootcNodeWish{pool: pool, change: c}
	b.mu.Unlock()
	if onlyNotes {
		b.notes.AddAfter(c.Name, annotationDelay)
		return
	}
	b.spec.Add(c.Name)
}

// forget drops what is wanted for node (its BootcNode is being deleted).
func (b *bootcNodeWriter) forget(node string) {
	b.mu.Lock()
	delete(b.want, node)
	delete(b.locks, node) // a write still running finds the BootcNode gone
	b.mu.Unlock()
}

// Start implements manager.Runnable (leader only, like the reconciler).
func (b *bootcNodeWriter) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	lane := func(q workqueue.TypedRateLimitingInterface[string], workers int) {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for b.next(ctx, q) {
				}
			}()
		}
	}
	lane(b.spec, specWorkers)
	lane(b.notes, notesWorkers)
	<-ctx.Done()
	b.spec.ShutDown()
	b.notes.ShutDown()
	wg.Wait()
	return nil
}

// lock takes node's write lock.
func (b *bootcNodeWriter) lock(node string) *sync.Mutex {
	b.mu.Lock()
	l := b.locks[node]
	if l == nil {
		l = &sync.Mutex{}
		b.locks[node] = l
	}
	b.mu.Unlock()
	l.Lock()
	return l
}

func (b *bootcNodeWriter) next(ctx context.Context, q workqueue.TypedRateLimitingInterface[string]) bool {
	node, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(node)
	l := b.lock(node)
	defer l.Unlock()
	// The latest wish, whichever lane queued it: a node in both lanes is
	// written once, by the first to get here.
	b.mu.Lock()
	wish, ok := b.want[node]
	b.mu.Unlock()
	if !ok {
		q.Forget(node)
		return true
	}
	if err := b.write(ctx, wish); err != nil {
		b.log.Info("cannot update BootcNode; retrying", "node", node, "error", err.Error())
		q.AddRateLimited(node)
		return true
	}
	q.Forget(node)
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
