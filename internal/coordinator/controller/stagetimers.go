package controller

import (
	"sync"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// stageTimers remembers, per pool and on the coordinator's own clock, when
// this coordinator first saw each held grant (the stage deadline of
// amendment 19 runs from it) and each node staging without a stage grant
// (the lapse of amendment 20). Nothing a node or another replica wrote sets
// either: a restarted coordinator starts from "seen now", so it may wait
// longer than needed, never shorter (amendment 8).
type stageTimers struct {
	mu    sync.Mutex
	pools map[string]*poolStageTimers
}

type poolStageTimers struct {
	grants    map[lease.ID]time.Time
	ungranted map[string]time.Time
}

func newStageTimers() *stageTimers { return &stageTimers{pools: map[string]*poolStageTimers{}} }

func (s *stageTimers) pool(name string) *poolStageTimers {
	p := s.pools[name]
	if p == nil {
		p = &poolStageTimers{grants: map[lease.ID]time.Time{}, ungranted: map[string]time.Time{}}
		s.pools[name] = p
	}
	return p
}

// observe records the held grants among slots first seen now, forgets
// grants no longer held, and returns copies of both maps for plan.Input.
func (s *stageTimers) observe(pool string, slots []plan.Slot, now time.Time) (grants map[lease.ID]time.Time, ungranted map[string]time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pool(pool)
	held := make(map[lease.ID]time.Time, len(slots))
	for _, sl := range slots {
		if sl.State != plan.SlotHeld {
			continue
		}
		seen, ok := p.grants[sl.Grant.ID]
		if !ok {
			seen = now
		}
		held[sl.Grant.ID] = seen
	}
	p.grants = held
	grants = make(map[lease.ID]time.Time, len(held))
	for k, v := range held {
		grants[k] = v
	}
	ungranted = make(map[string]time.Time, len(p.ungranted))
	for k, v := range p.ungranted {
		ungranted[k] = v
	}
	return grants, ungranted
}

// sawUngranted records the nodes a pass found staging without a stage grant
// (plan.Output.StagingWithoutGrant): new ones from now, and forgets the
// others, whose reports said otherwise.
func (s *stageTimers) sawUngranted(pool string, names []string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pool(pool)
	next := make(map[string]time.Time, len(names))
	for _, n := range names {
		since, ok := p.ungranted[n]
		if !ok {
			since = now
		}
		next[n] = since
	}
	p.ungranted = next
}

func (s *stageTimers) forget(pool string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pools, pool)
}
