package agent

import (
	"context"
	"time"

	"golang.org/x/time/rate"
)

// wake says what ended a sleep.
type wake int

const (
	wokeByTimer wake = iota
	wokeByAPI        // the BootcNode's spec or one of this node's Leases changed
	wokeByFiles      // a file-system change under the watched bootc paths
	wokeByStage      // the agent's own stage finished
)

// minRoundGap is the shortest time between a round and the next one woken by
// a file-system change or a short timer: a change right after a round is
// usually that round's own doing (or a burst), so a feedback loop or a burst
// costs at most a few rounds a second.
const minRoundGap = 250 * time.Millisecond

// apiRounds paces rounds woken by the API server. A coordinator's grant
// comes in steps milliseconds apart (a reboot grant in phase Draining, then
// phase Reboot once the node is drained) and each is on the rollout's
// critical path, so they go at once, from a burst; only a storm of updates
// to this node's objects is held to the pace of file-system wakes.
const (
	apiRoundBurst = 4
	apiRoundRate  = rate.Limit(float64(time.Second) / float64(minRoundGap))
)

// paceRound waits, if need be, before the round that woke: at once for the
// agent's own finished stage and (within apiRounds) for news from the API
// server; otherwise until minRoundGap after the last round, or earlier news
// from the API server or the stage. It returns false once ctx ended.
func (r *runner) paceRound(ctx context.Context, woke wake, lastRound time.Time) bool {
	now := r.now()
	switch woke {
	case wokeByStage:
		return true
	case wokeByAPI:
		if r.apiRounds == nil {
			r.apiRounds = rate.NewLimiter(apiRoundRate, apiRoundBurst)
		}
		d := r.apiRounds.ReserveN(now, 1).DelayFrom(now)
		if d <= 0 {
			return true
		}
		return r.sleepOnly(ctx, d)
	}
	for {
		d := minRoundGap - r.now().Sub(lastRound)
		if d <= 0 {
			return true
		}
		woke, ok := r.sleep(ctx, d)
		if !ok {
			return false
		}
		if woke == wokeByStage || woke == wokeByAPI {
			return true
		}
	}
}

// sleepOnly waits d, or until ctx ended (false); events wait for the round.
func (r *runner) sleepOnly(ctx context.Context, d time.Duration) bool {
	t := r.deps.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// sleep waits d or until an event, and says which ended it; ok is false
// once ctx ended.
func (r *runner) sleep(ctx context.Context, d time.Duration) (woke wake, ok bool) {
	t := r.deps.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return wokeByTimer, false
	case <-r.api.Changed():
		return wokeByAPI, true
	case <-r.deps.Changes:
		return wokeByFiles, true
	case err := <-r.stageDone():
		r.stageFinished(err)
		return wokeByStage, true
	case <-t.C():
		return wokeByTimer, true
	}
}
