package controller

import (
	"context"
	"slices"
	"sync"
	"time"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ownWrites gives a pass read-your-writes on the informer cache. A pass
// reads the pool's world from the cache, not from the API server (at 5,000
// nodes a fresh LIST of BootcNodes is megabytes per pass), so it must not
// start before the cache shows what the previous pass wrote: a slot it just
// granted would look free, and a BootcNode it just patched would be patched
// again. Each write remembers the resourceVersion the API server returned;
// the next pass of that pool waits until the cache holds that version or a
// later one (resourceversion.CompareResourceVersion, Kubernetes' comparable
// resource versions), or the object is gone.
//
// Waiting is a convenience, never the safety net: every Lease write is
// conditional on the version read, so a pass that planned on a stale cache
// (the wait timed out) fails with Conflict and plans again.
type ownWrites struct {
	mu      sync.Mutex
	pending map[string]map[writeKey]written // pool -> object -> what was written
}

// written is the version a write returned; gone: the object was deleted
// (at version rv, as read).
type written struct {
	rv   string
	gone bool
}

type writeKey struct {
	kind      string
	namespace string
	name      string
}

func newOwnWrites() *ownWrites { return &ownWrites{pending: map[string]map[writeKey]written{}} }

// wrote records that the pool's pass wrote obj (as returned by the API
// server); deleted records that it deleted obj.
func (o *ownWrites) wrote(pool, kind string, obj client.Object) {
	o.put(pool, writeKey{kind, obj.GetNamespace(), obj.GetName()}, written{rv: obj.GetResourceVersion()})
}

func (o *ownWrites) deleted(pool, kind string, obj client.Object) {
	o.put(pool, writeKey{kind, obj.GetNamespace(), obj.GetName()}, written{rv: obj.GetResourceVersion(), gone: true})
}

func (o *ownWrites) put(pool string, k writeKey, w written) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pending[pool] == nil {
		o.pending[pool] = map[writeKey]written{}
	}
	o.pending[pool][k] = w
}

// snapshot copies the pool's pending writes that which selects.
func (o *ownWrites) snapshot(pool string, which func(writeKey) bool) map[writeKey]written {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[writeKey]written{}
	for k, v := range o.pending[pool] {
		if which(k) {
			out[k] = v
		}
	}
	return out
}

func (o *ownWrites) done(pool string, k writeKey, w written) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pending[pool][k] == w { // not written again meanwhile
		delete(o.pending[pool], k)
	}
}

// forget drops what is pending for pool.
func (o *ownWrites) forget(pool string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.pending, pool)
}

// awaitOne is await for one object: it waits until cache shows the pool's
// last write of k, if one is pending.
func (o *ownWrites) awaitOne(ctx context.Context, pool string, k writeKey, cache client.Reader, timeout time.Duration) {
	o.awaitKeys(ctx, pool, cache, func(x writeKey) bool { return x == k }, timeout)
}

// awaitKinds waits until cache shows the writes of pool's passes, for at
// most timeout; it returns how many writes it gave up on (then forgotten).
// Only writes of the given kinds are waited for: a pass waits for its Leases,
// its pool and its cordons, not for the BootcNode writer's patches, which
// only explain (the writer waits for its own).
func (o *ownWrites) awaitKinds(ctx context.Context, pool string, cache client.Reader, timeout time.Duration, kinds ...string) int {
	return o.awaitKeys(ctx, pool, cache, func(k writeKey) bool { return slices.Contains(kinds, k.kind) }, timeout)
}

func (o *ownWrites) awaitKeys(ctx context.Context, pool string, cache client.Reader, which func(writeKey) bool, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for delay := 500 * time.Microsecond; ; delay = min(2*delay, 20*time.Millisecond) {
		left := 0
		for k, w := range o.snapshot(pool, which) {
			obj := newObject(k.kind)
			err := cache.Get(ctx, client.ObjectKey{Namespace: k.namespace, Name: k.name}, obj)
			switch {
			case kerrors.IsNotFound(err):
				if w.gone {
					o.done(pool, k, w)
					continue
				}
			case err != nil:
			case w.gone && obj.GetResourceVersion() != w.rv && caughtUp(obj.GetResourceVersion(), w.rv):
				// Deleted by us and back, newer: someone created it again.
				o.done(pool, k, w)
				continue
			case !w.gone && caughtUp(obj.GetResourceVersion(), w.rv):
				o.done(pool, k, w)
				continue
			}
			left++
		}
		if left == 0 {
			return 0
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			for k, w := range o.snapshot(pool, which) {
				o.done(pool, k, w)
			}
			return left
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// caughtUp: the cache's version is the one written or a later one. A version
// that is not a well-formed integer (an API server without comparable
// resource versions) counts only when equal.
func caughtUp(cached, written string) bool {
	c, err := resourceversion.CompareResourceVersion(cached, written)
	if err != nil {
		return cached == written
	}
	return c >= 0
}
