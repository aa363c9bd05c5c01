package kubectl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// What `wait --for` waits for.
const (
	ForUpToDate = fleetv1.PoolUpToDate
	ForHalted   = fleetv1.PoolHalted
)

// ErrHalted is the error of a `wait` for UpToDate whose pool halted.
var ErrHalted = errors.New("halted")

// ErrTimedOut is the error of a `wait` whose --timeout ran out.
var ErrTimedOut = errors.New("timed out")

// upToDate reports whether pool p is up to date on the target of its
// current spec, and if not, why not. The status must be of the current
// generation (a new spec.image is not yet looked at otherwise), its target
// resolved from the current spec.image (not the last one kept while the new
// one does not resolve), and UpToDate True for that generation.
func upToDate(p *fleetv1.BootcNodePool) (bool, string) {
	st := p.Status
	if st.ObservedGeneration != p.Generation {
		return false, fmt.Sprintf("the coordinator has not looked at generation %d of the pool yet (its status is of generation %d)", p.Generation, st.ObservedGeneration)
	}
	if st.TargetImage == "" {
		return false, "spec.image " + p.Spec.Image + " has not resolved to a digest yet"
	}
	if c := meta.FindStatusCondition(st.Conditions, fleetv1.PoolDegraded); c != nil && c.Status == metav1.ConditionTrue && c.Reason == fleetv1.ReasonResolveFailed {
		return false, "spec.image does not resolve (the target is the last one resolved): " + c.Message
	}
	if !targetOf(p.Spec.Image, st.TargetImage) {
		return false, fmt.Sprintf("status.targetImage %s is not a resolution of spec.image %s yet", st.TargetImage, p.Spec.Image)
	}
	c := meta.FindStatusCondition(st.Conditions, fleetv1.PoolUpToDate)
	switch {
	case c == nil:
		return false, "no UpToDate condition yet"
	case c.ObservedGeneration != p.Generation:
		return false, fmt.Sprintf("the UpToDate condition is of generation %d, not %d", c.ObservedGeneration, p.Generation)
	case c.Status != metav1.ConditionTrue:
		return false, c.Reason + ": " + c.Message
	}
	return true, c.Message
}

// targetOf: target (repo@sha256:...) can be a resolution of spec: the same
// repository and, when spec names a digest, that digest.
func targetOf(spec, target string) bool {
	t, err := imageref.ParsePinned(target)
	if err != nil {
		return false
	}
	repo, err := imageref.Repository(spec)
	if err != nil || repo != t.Repository {
		return false
	}
	if at := strings.LastIndexByte(spec, '@'); at >= 0 {
		return spec[at+1:] == t.Digest
	}
	return true
}

// halted is the pool's Halted condition when True.
func halted(p *fleetv1.BootcNodePool) *metav1.Condition {
	if c := meta.FindStatusCondition(p.Status.Conditions, fleetv1.PoolHalted); c != nil && c.Status == metav1.ConditionTrue {
		return c
	}
	return nil
}

// settled: nothing more happens to the pool without an operator: up to
// date on its current target, or halted.
func settled(p *fleetv1.BootcNodePool) bool {
	ok, _ := upToDate(p)
	return ok || halted(p) != nil
}

// verdict is what `wait --for want` makes of p: done (with what to print),
// an error that ends the wait, or what it still waits for.
func verdict(p *fleetv1.BootcNodePool, want string) (done bool, msg string, err error) {
	h := halted(p)
	if want == ForHalted {
		if h != nil {
			return true, fmt.Sprintf("pool %s is halted: %s: %s", p.Name, h.Reason, h.Message), nil
		}
		return false, progress(p), nil
	}
	if ok, why := upToDate(p); ok {
		return true, fmt.Sprintf("pool %s is up to date on %s: %s", p.Name, p.Status.TargetImage, why), nil
	}
	if h != nil {
		return false, "", fmt.Errorf("pool %s is %w: %s: %s", p.Name, ErrHalted, h.Reason, h.Message)
	}
	return false, progress(p), nil
}

// progress is one line on how far p is and what it waits for.
func progress(p *fleetv1.BootcNodePool) string {
	_, why := upToDate(p)
	return fmt.Sprintf("pool %s: %d of %d node(s) updated, target %s; %s", p.Name, p.Status.Updated, p.Status.Nodes, shortDigest(p.Status.TargetImage), why)
}

// blockedNow is what blocks p, for the timeout message.
func blockedNow(p *fleetv1.BootcNodePool, now time.Time) string {
	v := &poolView{now: now, pool: p}
	if b := blockedText(v.poolReport(), now); b != "-" {
		return "; blocked: " + b
	}
	return ""
}

// wait waits, driven by a watch of the pool, until pool is what want
// names; it prints each new progress line. timeout 0: no limit.
func (c *cli) wait(ctx context.Context, pool, want string, timeout time.Duration) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	wc, err := watchable(cl)
	if err != nil {
		return err
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	changed := make(chan struct{}, 1)
	errc := make(chan error, 1)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { errc <- watchAll(wctx, wc, []watchTarget{poolTarget(pool)}, changed) }()
	r := &reader{c: cl}
	var last *fleetv1.BootcNodePool
	shown := ""
	for {
		select {
		case <-ctx.Done():
			return c.waitEnded(ctx, pool, want, timeout, last)
		case err := <-errc:
			if err != nil {
				return err
			}
			return c.waitEnded(ctx, pool, want, timeout, last)
		case <-changed:
		}
		p, err := r.pool(ctx, pool)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			return err
		}
		last = p
		done, msg, err := verdict(p, want)
		if err != nil {
			return err
		}
		if msg != shown {
			fmt.Fprintln(c.o.Out, msg)
			shown = msg
		}
		if done {
			return nil
		}
	}
}

// waitEnded is the error of a wait whose context ended: the timeout, with
// what the pool still waited for and what blocks it, or the interrupt.
func (c *cli) waitEnded(ctx context.Context, pool, want string, timeout time.Duration, last *fleetv1.BootcNodePool) error {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("interrupted while waiting for pool %s to be %s", pool, want)
	}
	why := "the pool was not read"
	if last != nil {
		why = progress(last) + blockedNow(last, c.o.Now().UTC())
	}
	return fmt.Errorf("%w after %s waiting for pool %s to be %s: %s", ErrTimedOut, timeout, pool, want, why)
}

// poolTarget watches one pool.
func poolTarget(name string) watchTarget {
	return watchTarget{list: &fleetv1.BootcNodePoolList{}, resource: "bootcnodepools.fleet.bootc.dev",
		opts: []client.ListOption{client.MatchingFields{"metadata.name": name}}}
}
