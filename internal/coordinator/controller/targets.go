package controller

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/platform"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/resolve"
)

// targetCache remembers each pool's resolved image, so a tag is looked up
// once per interval, not once per reconcile. Lookups run in the background
// (amendment 33): a registry that accepts the connection and never answers
// holds a lookup for the resolver's whole timeout, and a pass that waited
// for it would hold the pool's releases, drains and status behind it. A
// pass uses the last result and starts a lookup when one is due; the end of
// a lookup asks for a pass of its pool (events).
type targetCache struct {
	resolver      Resolver
	auth          *registryAuth
	interval      time.Duration
	retryInterval time.Duration
	log           logr.Logger
	// firstWait bounds how long a pass waits for the first answer for a
	// pool's spec.image (firstAnswerWait).
	firstWait time.Duration
	events    chan event.TypedGenericEvent[*fleetv1.BootcNodePool]

	mu      sync.Mutex
	base    context.Context       // lookups run under it (Start); nil: not started
	m       map[string]*target    // by pool: the last result
	running map[string]*resolving // by pool: the lookup in flight
}

// resolving is one lookup in flight.
type resolving struct {
	spec    string    // specKey it resolves
	started time.Time // the process's clock, for the waits
	done    chan struct{}
	cancel  context.CancelFunc
	slow    bool // a pass logged that it is slow
}

// firstAnswerWait: a pass that finds no answer yet for its pool's
// spec.image (a new pool, a new spec.image, a restarted coordinator) waits
// this long from the lookup's start, once, so a registry that answers gives
// the pass its digest and a pool no passing ResolveFailed; a pool without a
// digest grants nothing anyway.
const firstAnswerWait = 2 * time.Second

// slowLookup: a lookup in flight this long is logged, once.
const slowLookup = 5 * time.Second

type target struct {
	spec   string // spec.image (and the pull secret's name) it was resolved from
	pinned imageref.Pinned
	// index: the per-platform images when pinned is a multi-arch index.
	index *platform.Index
	// indexUnknown: pinned came from the pool's status and has not been
	// resolved since, so whether it is an index is not known.
	indexUnknown bool
	// uninspected: why the registry could not say whether the digest
	// spec.image names is an index (it is used as written).
	uninspected string
	err         string
	at          time.Time // when resolved (or last tried)
	ok          time.Time // when last resolved successfully
}

// retry: the last attempt left something to find out.
func (t *target) retry() bool { return t.err != "" || t.uninspected != "" }

func newTargetCache(r Resolver, auth *registryAuth, interval, retry time.Duration, log logr.Logger) *targetCache {
	return &targetCache{resolver: r, auth: auth, interval: interval, retryInterval: retry, log: log, firstWait: firstAnswerWait,
		events: make(chan event.TypedGenericEvent[*fleetv1.BootcNodePool], 64),
		m:      map[string]*target{}, running: map[string]*resolving{}}
}

// Start implements manager.Runnable: it holds the context lookups run
// under, and cancels those in flight when it ends.
func (c *targetCache) Start(ctx context.Context) error {
	c.mu.Lock()
	c.base = ctx
	c.mu.Unlock()
	<-ctx.Done()
	c.mu.Lock()
	defer c.mu.Unlock()
	for pool, run := range c.running {
		run.cancel()
		delete(c.running, pool)
	}
	return nil
}

// specKey: what a resolution depends on in the pool's spec. A new pull
// secret is resolved with at once, not at the next interval.
func specKey(pool *fleetv1.BootcNodePool) string {
	return pool.Spec.Image + "\x00" + pool.Spec.ImagePullSecret
}

// noAnswerYet is the resolve error while the first lookup for a
// spec.image has not answered: no new grants, as for a failed one.
const noAnswerYet = "the registry has not answered yet; the lookup goes on in the background"

// get returns the pool's target, starting a lookup in the background when
// one is due, and how long until the pool wants a pass for the next. It
// does not wait for the registry, but for the first answer for a
// spec.image, at most firstWait from the lookup's start.
func (c *targetCache) get(ctx context.Context, pool *fleetv1.BootcNodePool, now time.Time) (target, time.Duration) {
	key := specKey(pool)
	c.mu.Lock()
	t := c.m[pool.Name]
	run := c.running[pool.Name]
	if run != nil && run.spec != key {
		// spec.image changed: the answer in flight is no one's.
		run.cancel()
		delete(c.running, pool.Name)
		run = nil
	}
	due := t == nil || t.spec != key ||
		(!t.retry() && now.Sub(t.at) >= c.interval) || (t.retry() && now.Sub(t.at) >= c.retryInterval)
	if due && run == nil {
		run = c.startLocked(pool, t, now)
	}
	c.mu.Unlock()

	answered := t != nil && t.spec == key
	if !answered && run != nil {
		c.awaitFirst(ctx, run)
		c.mu.Lock()
		t = c.m[pool.Name]
		c.mu.Unlock()
		answered = t != nil && t.spec == key
	}
	log := c.log.WithValues("pool", pool.Name, "image", pool.Spec.Image)
	if run != nil {
		c.noteSlow(log, run, t, answered)
	}
	if !answered {
		// Until it answers, in-flight grants finish against the last
		// target; whether that is an index, only the registry can say.
		nt := target{spec: key, err: noAnswerYet}
		if p, err := imageref.ParsePinned(pool.Status.TargetImage); err == nil {
			nt.pinned, nt.indexUnknown = p, true
		}
		return nt, c.retryInterval
	}
	if run != nil {
		// Its end asks for a pass; this is in case it never ends.
		return *t, c.retryInterval
	}
	return *t, c.next(t, now)
}

// awaitFirst waits for run until firstWait after its start.
func (c *targetCache) awaitFirst(ctx context.Context, run *resolving) {
	// Pacing, not a decision: the process's own clock.
	d := time.Until(run.started.Add(c.firstWait))
	if d <= 0 {
		return
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-run.done:
	case <-tm.C:
	case <-ctx.Done():
	}
}

// noteSlow logs, once per lookup, one that has been in flight for
// slowLookup, and what the passes go on with meanwhile.
func (c *targetCache) noteSlow(log logr.Logger, run *resolving, t *target, answered bool) {
	c.mu.Lock()
	if run.slow || time.Since(run.started) < slowLookup {
		c.mu.Unlock()
		return
	}
	run.slow = true
	c.mu.Unlock()
	if answered {
		log.Info("the registry has not answered for a while; passes go on with the last result until it does", "waited", time.Since(run.started).Round(time.Second).String(),
			"keeping", t.pinned.String(), "lastError", t.err)
		return
	}
	log.Info("the registry has not answered the first lookup of spec.image for a while; no new grants until it does", "waited", time.Since(run.started).Round(time.Second).String())
}

// startLocked starts a lookup of pool's image in the background; old is
// the last result (nil: none). c.mu is held.
func (c *targetCache) startLocked(pool *fleetv1.BootcNodePool, old *target, now time.Time) *resolving {
	base := c.base
	if base == nil {
		base = context.Background()
	}
	ctx, cancel := context.WithCancel(base)
	run := &resolving{spec: specKey(pool), started: time.Now(), done: make(chan struct{}), cancel: cancel}
	c.running[pool.Name] = run
	go c.resolve(ctx, run, pool.DeepCopy(), old, now)
	return run
}

// resolve runs one lookup and records its result, unless a newer spec or
// the pool's deletion made it no one's; then it asks for a pass of the pool.
func (c *targetCache) resolve(ctx context.Context, run *resolving, pool *fleetv1.BootcNodePool, t *target, now time.Time) {
	defer close(run.done)
	defer run.cancel()
	key := run.spec
	nt := &target{spec: key, at: now}
	if t != nil && t.spec == key {
		nt.pinned, nt.index, nt.indexUnknown, nt.uninspected, nt.ok = t.pinned, t.index, t.indexUnknown, t.uninspected, t.ok
	} else if p, err := imageref.ParsePinned(pool.Status.TargetImage); err == nil {
		// Until it resolves, in-flight grants finish against the last
		// target; whether that is an index, only the registry can say.
		nt.pinned, nt.indexUnknown = p, true
	}
	log := c.log.WithValues("pool", pool.Name, "image", pool.Spec.Image)
	var res resolve.Target
	kc, err := c.auth.keychain(ctx, pool)
	if err != nil {
		nt.err = credentialsReason(err) + ": " + err.Error()
	} else if res, err = c.resolver.Resolve(ctx, pool.Spec.Image, kc); err != nil {
		nt.err = err.Error()
		if r := resolve.Reason(err); r != "" {
			nt.err = r + ": " + nt.err
		}
	}
	c.mu.Lock()
	if c.running[pool.Name] != run {
		c.mu.Unlock()
		return // cancelled: spec.image changed, or the pool is gone
	}
	delete(c.running, pool.Name)
	c.m[pool.Name] = nt
	if err == nil {
		nt.pinned, nt.index, nt.indexUnknown, nt.ok, nt.uninspected = res.Image, res.Index, false, now, ""
		if res.Uninspected != nil {
			nt.uninspected = res.Uninspected.Error()
			if r := resolve.Reason(res.Uninspected); r != "" {
				nt.uninspected = r + ": " + nt.uninspected
			}
		}
	}
	c.mu.Unlock()
	if err != nil {
		log.Info("cannot resolve the pool's image; no new grants", "error", nt.err, "keeping", nt.pinned.String())
	} else {
		c.logResolved(log, t, nt)
	}
	select {
	case c.events <- event.TypedGenericEvent[*fleetv1.BootcNodePool]{Object: &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: pool.Name}}}:
	case <-ctx.Done():
	}
}

// logResolved explains a new result once, not every interval.
func (c *targetCache) logResolved(log logr.Logger, old, nt *target) {
	if old != nil && old.pinned == nt.pinned && old.err == "" && (old.index != nil) == (nt.index != nil) && old.uninspected == nt.uninspected {
		log.V(1).Info("resolved, unchanged", "target", nt.pinned.String())
		return
	}
	switch {
	case nt.uninspected != "":
		log.Info("the registry cannot say whether the digest is a multi-arch index; every node is given it as written", "target", nt.pinned.String(), "why", nt.uninspected)
	case nt.index != nil:
		log.Info("resolved to a multi-arch index; each node gets its platform's image", "target", nt.pinned.String(), "platforms", nt.index.Platforms())
	default:
		log.Info("resolved to a single manifest", "target", nt.pinned.String())
	}
}

func (c *targetCache) next(t *target, now time.Time) time.Duration {
	iv := c.interval
	if t.retry() {
		iv = c.retryInterval
	}
	if d := t.at.Add(iv).Sub(now); d > 0 {
		return d
	}
	return time.Second
}

func (c *targetCache) forget(pool string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if run := c.running[pool]; run != nil {
		run.cancel()
		delete(c.running, pool)
	}
	delete(c.m, pool)
}
