package main

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
)

// The demo tells its story in three acts: a rollout whose image changes
// mid-way (v1 -> v2, switched to v2.1 when half the nodes run v2), a bad
// image the canary catches and is rolled back from (v3), and a good image
// that rolls the whole pool (v4).
const (
	tagFirst   = "v2"
	tagChanged = "v2.1"
	tagBad     = "v3"
	tagGood    = "v4"
)

// story is what the acts found, for the summary.
type story struct {
	changedAt, firstDone    time.Duration // act 1: image changed, converged
	badAt, caughtAt, backAt time.Duration // act 2: v3 set, quarantined, canary back and every slot free or finished
	goodAt, doneAt          time.Duration // act 3: v4 set, converged
	badFrom, badTo          int64         // act 2's events: Seq in (badFrom, badTo]
	previous                string        // what the pool ran before the bad image
	canary                  string        // the canary status.canary named for the bad image
	quarantine              *fleetv1.Quarantine
	degraded                *metav1.Condition // the pool's Degraded condition while quarantined
	target                  string            // what the act under way waits for
	shownMid                bool
	lastPlain               time.Time
}

// poolGate is the demo pool's health gate and canaries: every node passes
// a host check after each reboot (systemd running, boot-complete.target
// reached) within -health-timeout, and one canary goes first and alone,
// then soaks -canary-soak, on every target.
func (d *demo) poolGate(p *fleetv1.BootcNodePool) {
	one := intstr.FromInt32(1)
	p.Spec.Health = &fleetv1.HealthSpec{
		Timeout: &metav1.Duration{Duration: d.cfg.healthTimeout},
		Host:    &fleetv1.HostHealthCheck{RequireBootComplete: true},
	}
	p.Spec.Rollout.Canary = &fleetv1.CanarySpec{Nodes: &one, Soak: &metav1.Duration{Duration: d.cfg.soak}}
}

// until redraws the table every half second until done says so; it fails
// when the act runs longer than -timeout, or ctx ends.
func (d *demo) until(ctx context.Context, f *sim.ProcFleet, st *story, act string, done func(snap) (bool, error)) error {
	began := time.Now()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			d.scr.clearTable()
			return ctx.Err()
		case <-tick.C:
		}
		s := collect(ctx, f, d.start)
		d.show(s, &st.lastPlain)
		if ok, err := done(s); ok || err != nil {
			return err
		}
		if time.Since(began) > d.cfg.timeout {
			d.scr.snapshot(render(collect(ctx, f, d.start)))
			_, pending := f.Converged(ctx, st.target)
			return fmt.Errorf("%s: not done within %s: %s", act, d.cfg.timeout, pending)
		}
	}
}

// actRollout creates the pool on v2, switches it to v2.1 once about half
// the nodes run v2, and waits for the pool to converge on v2.1.
func (d *demo) actRollout(ctx context.Context, f *sim.ProcFleet, st *story) error {
	cfg := d.cfg
	v2, err := f.Push(tagFirst)
	if err != nil {
		return err
	}
	d.step("pushed %s and %s to the in-process registry %s", f.TagRef("v1"), f.TagRef(tagFirst), f.Registry)
	d.step("creating BootcNodePool %q: image %s, maxUnavailable %d, maxStaging %d, health gate on the host (timeout %s), 1 canary (soak %s)",
		f.Pool, f.TagRef(tagFirst), cfg.maxUnavailable, cfg.maxStaging, cfg.healthTimeout, cfg.soak)
	if err := f.CreatePool(ctx, tagFirst, cfg.maxUnavailable, cfg.maxStaging); err != nil {
		return fmt.Errorf("creating the pool: %w", err)
	}
	st.target = v2
	err = d.until(ctx, f, st, "the rollout of "+tagChanged, func(s snap) (bool, error) {
		if !st.shownMid {
			st.shownMid = d.showMidRollout(ctx, f, s)
		}
		if st.changedAt == 0 && s.poolTarget == v2 && int(s.pool.Updated)*2 >= cfg.nodes {
			changed, err := d.changeImage(ctx, f, s)
			if err != nil {
				return false, err
			}
			st.target, st.changedAt = changed, time.Since(d.start)
		}
		if st.changedAt == 0 {
			return false, nil
		}
		ok, _ := f.Converged(ctx, st.target)
		return ok, nil
	})
	if err != nil {
		return err
	}
	st.firstDone = time.Since(d.start)
	d.scr.snapshot(render(collect(ctx, f, d.start)))
	d.step("converged: every node booted %s, Ready, uncordoned, every slot free or finished (a stage slot is handed on lazily)", labelOf(f.Images(), st.target))
	return nil
}

// changeImage pushes v2.1 and points the pool at it, mid-rollout.
func (d *demo) changeImage(ctx context.Context, f *sim.ProcFleet, s snap) (string, error) {
	pinned, err := f.Push(tagChanged)
	if err != nil {
		return "", err
	}
	d.step("%d/%d nodes run %s: pushed %s and changed the pool image to it, mid-rollout", s.pool.Updated, d.cfg.nodes, tagFirst, f.TagRef(tagChanged))
	if err := f.SetPoolImage(ctx, tagChanged); err != nil {
		return "", fmt.Errorf("changing the pool image: %w", err)
	}
	return pinned, nil
}

// actBadImage pushes v3, which boots but breaks the host, points the pool
// at it, and waits until the canary failed its gate, v3 is quarantined, and
// the canary is back on the previous image with every slot free or finished.
func (d *demo) actBadImage(ctx context.Context, f *sim.ProcFleet, st *story) error {
	bad, err := f.PushBad(tagBad)
	if err != nil {
		return err
	}
	st.previous, st.badFrom = st.target, lastSeq(f)
	d.step("pushed %s: it boots, but on a machine booted into it %s fails (systemd degraded, boot-complete.target not reached); changed the pool image to it",
		f.TagRef(tagBad), sim.BadImageUnit)
	if err := f.SetPoolImage(ctx, tagBad); err != nil {
		return fmt.Errorf("changing the pool image: %w", err)
	}
	st.badAt = time.Since(d.start)
	err = d.until(ctx, f, st, "catching "+tagBad, func(s snap) (bool, error) {
		if c := s.pool.Canary; c != nil && c.Target == bad && len(c.Nodes) > 0 && st.canary == "" {
			st.canary = c.Nodes[0]
			d.step("the canary for %s is %s: it goes first and alone", tagBad, st.canary)
		}
		if q := s.pool.Quarantine; q != nil && q.Digest == bad && st.quarantine == nil {
			st.quarantine, st.caughtAt = q.DeepCopy(), time.Since(d.start)
			d.step("%s failed its health gate on %s (%s: %s): %s quarantined, %s rolling back under a rollback grant",
				q.Node, tagBad, q.Reason, q.Message, tagBad, q.Node)
		}
		if st.quarantine == nil {
			return false, nil
		}
		if ok, _ := f.Converged(ctx, st.previous); !ok {
			return false, nil
		}
		d.showQuarantined(ctx, f, st, s)
		return true, nil
	})
	if err != nil {
		return err
	}
	st.backAt, st.badTo = time.Since(d.start), lastSeq(f)
	d.scr.snapshot(render(collect(ctx, f, d.start)))
	d.step("%s is back on %s, every node Ready, uncordoned, every slot free or finished (a stage slot is handed on lazily); %s stays quarantined while the pool names it",
		st.quarantine.Node, labelOf(f.Images(), st.previous), tagBad)
	return nil
}

// showQuarantined prints, once the canary is back on its previous image,
// while the bad image is quarantined, the pool's Degraded condition and what
// the plugin says of the canary and of the pool.
func (d *demo) showQuarantined(ctx context.Context, f *sim.ProcFleet, st *story, s snap) {
	for _, c := range s.pool.Conditions {
		if c.Type == fleetv1.PoolDegraded && c.Status == metav1.ConditionTrue {
			st.degraded = c.DeepCopy()
		}
	}
	if st.degraded == nil {
		d.step("%s quarantined but the pool is not Degraded", tagBad)
	} else {
		d.step("while %s is quarantined, the pool says Degraded=True, reason %s: %s", tagBad, st.degraded.Reason, st.degraded.Message)
	}
	d.plugin(ctx, f, "explain", st.quarantine.Node)
	d.plugin(ctx, f, "status", f.Pool)
}

// actGoodImage pushes v4, points the pool at it and waits for the pool to
// converge on it.
func (d *demo) actGoodImage(ctx context.Context, f *sim.ProcFleet, st *story) error {
	good, err := f.Push(tagGood)
	if err != nil {
		return err
	}
	d.step("pushed %s, a good image, and changed the pool image to it (a new image ends the quarantine)", f.TagRef(tagGood))
	if err := f.SetPoolImage(ctx, tagGood); err != nil {
		return fmt.Errorf("changing the pool image: %w", err)
	}
	st.target, st.goodAt = good, time.Since(d.start)
	err = d.until(ctx, f, st, "the rollout of "+tagGood, func(snap) (bool, error) {
		ok, _ := f.Converged(ctx, good)
		return ok, nil
	})
	if err != nil {
		return err
	}
	st.doneAt = time.Since(d.start)
	d.scr.snapshot(render(collect(ctx, f, d.start)))
	d.step("converged: every node booted %s, Ready, uncordoned, every slot free or finished (a stage slot is handed on lazily)", labelOf(f.Images(), good))
	return nil
}

// lastSeq is the Seq of the last event logged so far.
func lastSeq(f *sim.ProcFleet) int64 {
	evs := f.Log.Events()
	if len(evs) == 0 {
		return 0
	}
	return evs[len(evs)-1].Seq
}
