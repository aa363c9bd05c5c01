package controller

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/platform"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/resolve"
)

// targetCache remembers each pool's resolved image, so a tag is looked up
// once per interval, not once per reconcile.
type targetCache struct {
	resolver      Resolver
	auth          *registryAuth
	interval      time.Duration
	retryInterval time.Duration
	log           logr.Logger

	mu sync.Mutex
	m  map[string]*target // by pool
}

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
	return &targetCache{resolver: r, auth: auth, interval: interval, retryInterval: retry, log: log, m: map[string]*target{}}
}

// specKey: what a resolution depends on in the pool's spec. A new pull
// secret is resolved with at once, not at the next interval.
func specKey(pool *fleetv1.BootcNodePool) string {
	return pool.Spec.Image + "\x00" + pool.Spec.ImagePullSecret
}

// get returns the pool's target, resolving when due, and how long until the
// next resolution is due.
func (c *targetCache) get(ctx context.Context, pool *fleetv1.BootcNodePool, now time.Time) (target, time.Duration) {
	c.mu.Lock()
	t := c.m[pool.Name]
	c.mu.Unlock()
	key := specKey(pool)
	due := t == nil || t.spec != key ||
		(!t.retry() && now.Sub(t.at) >= c.interval) || (t.retry() && now.Sub(t.at) >= c.retryInterval)
	if !due {
		return *t, c.next(t, now)
	}
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
	if err != nil {
		log.Info("cannot resolve the pool's image; no new grants", "error", nt.err, "keeping", nt.pinned.String())
	} else {
		nt.pinned, nt.index, nt.indexUnknown, nt.ok, nt.uninspected = res.Image, res.Index, false, now, ""
		if res.Uninspected != nil {
			nt.uninspected = res.Uninspected.Error()
			if r := resolve.Reason(res.Uninspected); r != "" {
				nt.uninspected = r + ": " + nt.uninspected
			}
		}
		c.logResolved(log, t, nt)
	}
	c.mu.Lock()
	c.m[pool.Name] = nt
	c.mu.Unlock()
	return *nt, c.next(nt, now)
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
	delete(c.m, pool)
	c.mu.Unlock()
}
