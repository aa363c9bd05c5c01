package controller

import (
	"strings"
	"sync"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// slotClock times what slot Leases record on this process's own clock. The
// reboot timeout (from phase Reboot), minReadySeconds (from back-since) and
// pauseBetweenBatches (from released-at) are times a coordinator wrote,
// possibly another replica before a failover, whose clock may be ahead of
// this one: compared with this clock they would end early. So each runs
// from when this process first saw the record (amendment 8's rule for
// heartbeats, amendment 21): a new leader may wait up to one timer longer
// than needed, never shorter.
type slotClock struct {
	mu   sync.Mutex
	seen map[string]seenValue // slot Lease name + "|" + what -> first sight
}

type seenValue struct {
	value string
	at    time.Time
}

func newSlotClock() *slotClock { return &slotClock{seen: map[string]seenValue{}} }

// observe replaces, in the slots of pool as read, the recorded times with
// this process's first sight of each record, and forgets records no slot
// of the pool carries any more.
func (c *slotClock) observe(pool string, slots []plan.Slot, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keep := map[string]bool{}
	first := func(key, value string) time.Time {
		keep[key] = true
		if s, ok := c.seen[key]; ok && s.value == value {
			return s.at
		}
		c.seen[key] = seenValue{value: value, at: now}
		return now
	}
	for i := range slots {
		s := &slots[i]
		if s.State == plan.SlotHeld && s.Kind == lease.KindReboot && s.Grant.Phase == lease.PhaseReboot {
			g := s.Grant
			s.RebootSince = first(s.Name+"|reboot", g.ID.String()+"/"+string(g.UID)+"@"+g.Renewed.UTC().Format(time.RFC3339Nano))
		}
		if !s.BackSince.IsZero() {
			s.BackSince = first(s.Name+"|back-since", s.Grant.ID.String()+"@"+s.BackSince.UTC().Format(time.RFC3339Nano))
		}
		if !s.ReleasedAt.IsZero() {
			s.ReleasedAt = first(s.Name+"|released-at", s.ReleasedAt.UTC().Format(time.RFC3339Nano))
		}
	}
	for k := range c.seen {
		if slotPool(k) == pool && !keep[k] {
			delete(c.seen, k)
		}
	}
}

// forget drops every record of pool's slots (the pool was deleted).
func (c *slotClock) forget(pool string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.seen {
		if slotPool(k) == pool {
			delete(c.seen, k)
		}
	}
}

func slotPool(key string) string {
	name, _, _ := strings.Cut(key, "|")
	p, _, _, err := lease.ParseSlotName(name)
	if err != nil {
		return ""
	}
	return p
}
