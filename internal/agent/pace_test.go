package agent

import (
	"context"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"
)

// paced runs paceRound in the background and says whether it returned
// before the fake clock moved.
type paced struct {
	done chan bool
}

func pace(r *runner, woke wake, lastRound time.Time) paced {
	p := paced{done: make(chan bool, 1)}
	go func() { p.done <- r.paceRound(context.Background(), woke, lastRound) }()
	return p
}

// returned waits (on the real clock, generously) for paceRound to return.
func (p paced) returned(t *testing.T) bool {
	t.Helper()
	select {
	case ok := <-p.done:
		if !ok {
			t.Fatal("paceRound gave up without a cancelled context")
		}
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

// blocked says paceRound is still waiting once the fake clock has a timer
// for it (so it reached its sleep rather than being slow to start).
func (p paced) blocked(t *testing.T, c *testingclock.FakeClock) bool {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !c.HasWaiters() {
		select {
		case <-p.done:
			return false
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("paceRound neither returned nor set a timer")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func paceRunner(c *testingclock.FakeClock) *runner {
	k := &kube{pokes: make(chan struct{}, 1)}
	return &runner{deps: Deps{Clock: c, API: k}, api: k}
}

// News from the API server is on the rollout's critical path (a reboot grant
// in phase Draining, then phase Reboot ~100 ms later): its rounds go at once
// within a burst, and only a storm is held to minRoundGap.
func TestPaceRoundAPIWakesGoAtOnceWithinABurst(t *testing.T) {
	c := testingclock.NewFakeClock(time.Unix(1_000_000, 0))
	r := paceRunner(c)
	last := c.Now()
	for i := range apiRoundBurst {
		if !pace(r, wokeByAPI, last).returned(t) {
			t.Fatalf("API-woken round %d of a burst of %d waited", i+1, apiRoundBurst)
		}
	}
	p := pace(r, wokeByAPI, last)
	if !p.blocked(t, c) {
		t.Fatalf("round %d of a storm went at once, want it held", apiRoundBurst+1)
	}
	c.Step(minRoundGap)
	if !p.returned(t) {
		t.Fatal("the held round did not go once minRoundGap passed")
	}
}

// The agent's own stage finishing goes at once: Staged is what the
// coordinator grants the reboot on.
func TestPaceRoundStageDoneGoesAtOnce(t *testing.T) {
	c := testingclock.NewFakeClock(time.Unix(1_000_000, 0))
	if !pace(paceRunner(c), wokeByStage, c.Now()).returned(t) {
		t.Fatal("a round woken by the finished stage waited")
	}
}

// A file-system change right after a round waits out minRoundGap, and
// further changes in the gap do not end it (a burst is one round), but
// news from the API server does.
func TestPaceRoundFileChangesWaitTheGap(t *testing.T) {
	c := testingclock.NewFakeClock(time.Unix(1_000_000, 0))
	changes := make(chan struct{}, 1)
	r := paceRunner(c)
	r.deps.Changes = changes
	last := c.Now()

	p := pace(r, wokeByFiles, last)
	if !p.blocked(t, c) {
		t.Fatal("a file change right after a round went at once")
	}
	changes <- struct{}{}
	for len(changes) > 0 { // taken by paceRound's sleep
		time.Sleep(time.Millisecond)
	}
	select {
	case <-p.done:
		t.Fatal("a second file change ended the gap")
	case <-time.After(100 * time.Millisecond):
	}
	c.Step(minRoundGap)
	if !p.returned(t) {
		t.Fatal("the gap did not end after minRoundGap")
	}

	last = c.Now()
	p = pace(r, wokeByFiles, last)
	if !p.blocked(t, c) {
		t.Fatal("a file change right after a round went at once")
	}
	r.api.(*kube).poke()
	if !p.returned(t) {
		t.Fatal("news from the API server did not end the gap")
	}

	// Long after the last round there is nothing to wait for.
	c.Step(time.Minute)
	if !pace(r, wokeByFiles, last).returned(t) {
		t.Fatal("a file change a minute after the last round waited")
	}
}
