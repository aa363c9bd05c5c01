package controller

import (
	"context"
	"sync"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/coordinator/resolve"
)

// targetCache remembers each pool's resolved image, so a tag is looked up
// once per interval, not once per reconcile.
type targetCache struct {
	resolver      Resolver
	interval      time.Duration
	retryInterval time.Duration

	mu sync.Mutex
	m  map[string]*target // by pool
}

type target struct {
	spec   string // spec.image it was resolved from
	pinned imageref.Pinned
	err    string
	at     time.Time // when resolved (or last tried)
	ok     time.Time // when last resolved successfully
}

func newTargetCache(r Resolver, interval, retry time.Duration) *targetCache {
	return &targetCache{resolver: r, interval: interval, retryInterval: retry, m: map[string]*target{}}
}

// get returns the pool's target, resolving when due, and how long until the
// next resolution is due.
func (c *targetCache) get(ctx context.Context, pool *fleetv1.BootcNodePool, now time.Time) (target, time.Duration) {
	c.mu.Lock()
	t := c.m[pool.Name]
	c.mu.Unlock()
	due := t == nil || t.spec != pool.Spec.Image ||
		(t.err == "" && now.Sub(t.at) >= c.interval) || (t.err != "" && now.Sub(t.at) >= c.retryInterval)
	if !due {
		return *t, c.next(t, now)
	}
	nt := &target{spec: pool.Spec.Image, at: now}
	if t != nil && t.spec == pool.Spec.Image {
		nt.pinned, nt.ok = t.pinned, t.ok
	} else if p, err := imageref.ParsePinned(pool.Status.TargetImage); err == nil {
		// Until it resolves, in-flight grants finish against the last target.
		nt.pinned = p
	}
	p, err := c.resolver.Resolve(ctx, pool.Spec.Image)
	if err != nil {
		nt.err = err.Error()
		if r := resolve.Reason(err); r != "" {
			nt.err = r + ": " + nt.err
		}
	} else {
		nt.pinned, nt.ok = p, now
	}
	c.mu.Lock()
	c.m[pool.Name] = nt
	c.mu.Unlock()
	return *nt, c.next(nt, now)
}

func (c *targetCache) next(t *target, now time.Time) time.Duration {
	iv := c.interval
	if t.err != "" {
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
