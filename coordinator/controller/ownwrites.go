package controller

import (
	"context"
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
	pending map[string]map[writeKey]string // pool -> object -> version written ("" : deleted)
}

type writeKey struct {
	kind      string
	namespace string
	name      string
}

func newOwnWrites() *ownWrites { return &ownWrites{pending: map[string]map[writeKey]string{}} }

// wrote records that the pool's pass wrote obj (as returned by the API
// server); deleted records that it deleted obj.
func (o *ownWrites) wrote(pool, kind string, obj client.Object) {
	o.put(pool, writeKey{kind, obj.GetNamespace(), obj.GetName()}, obj.GetResourceVersion())
}

func (o *ownWrites) deleted(pool, kind string, obj client.Object) {
	o.put(pool, writeKey{kind, obj.GetNamespace(), obj.GetName()}, "")
}

func (o *ownWrites) put(pool string, k writeKey, rv string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pending[pool] == nil {
		o.pending[pool] = map[writeKey]string{}
	}
	o.pending[pool][k] = rv
}

func (o *ownWrites) snapshot(pool string) map[writeKey]string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[writeKey]string, len(o.pending[pool]))
	for k, v := range o.pending[pool] {
		out[k] = v
	}
	return out
}

func (o *ownWrites) done(pool string, k writeKey, rv string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pending[pool][k] == rv { // not written again meanwhile
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

// await waits until cache shows every write of pool's passes, for at most
// timeout; it returns how many writes it gave up on (then forgotten).
func (o *ownWrites) await(ctx context.Context, pool string, cache client.Reader, timeout time.Duration) int {
	return o.awaitKeys(ctx, pool, cache, func(writeKey) bool { return true }, timeout)
}

func (o *ownWrites) awaitKeys(ctx context.Context, pool string, cache client.Reader, which func(writeKey) bool, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for delay := 500 * time.Microsecond; ; delay = min(2*delay, 20*time.Millisecond) {
		left := 0
		for k, rv := range o.snapshot(pool) {
			if !which(k) {
				continue
			}
			obj := newObject(k.kind)
			err := cache.Get(ctx, client.ObjectKey{Namespace: k.namespace, Name: k.name}, obj)
			switch {
			case kerrors.IsNotFound(err):
				if rv == "" {
					o.done(pool, k, rv)
					continue
				}
			case err != nil:
			case rv == "":
				// Deleted by us, and back: someone created it again.
				o.done(pool, k, rv)
				continue
			case caughtUp(obj.GetResourceVersion(), rv):
				o.done(pool, k, rv)
				continue
			}
			left++
		}
		if left == 0 {
			return 0
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			for k, rv := range o.snapshot(pool) {
				if which(k) {
					o.done(pool, k, rv)
				}
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
