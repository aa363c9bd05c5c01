package main

import (
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// stats are the run's numbers for the summary, from the event log alone.
type stats struct {
	reboots      map[string]int // node -> agent-issued reboots
	rebootGrants map[string]int // node -> reboot grants received
	stageGrants  map[string]int
	totalStage   int
	totalReboot  int
	maxCordoned  int // most nodes cordoned at one time
	maxStaging   int // most nodes staging at one time
}

// summarize counts over the events. A grant is a new (holder, image, boot)
// on a slot Lease: the same slot granted again for another image or boot
// is another grant, a renew is not.
func summarize(evs []invariant.Event) stats {
	s := stats{reboots: map[string]int{}, rebootGrants: map[string]int{}, stageGrants: map[string]int{}}
	last := map[string]string{} // lease -> identity of its current grant
	cordoned, staging := map[string]bool{}, map[string]bool{}
	for _, e := range evs {
		switch e.Kind {
		case invariant.LeaseVersion:
			id := ""
			if e.Holder != "" {
				id = e.Holder + "|" + e.Image + "|" + e.BootID
			}
			if id != "" && id != last[e.Lease] {
				if e.Slot == lease.KindReboot {
					s.rebootGrants[e.Holder]++
					s.totalReboot++
				} else {
					s.stageGrants[e.Holder]++
					s.totalStage++
				}
			}
			last[e.Lease] = id
		case invariant.Cordon:
			cordoned[e.Node] = true
			s.maxCordoned = max(s.maxCordoned, len(cordoned))
		case invariant.Uncordon:
			delete(cordoned, e.Node)
		case invariant.StageStart:
			staging[e.Node] = true
			s.maxStaging = max(s.maxStaging, len(staging))
		case invariant.StageEnd:
			delete(staging, e.Node)
		case invariant.Reboot:
			s.reboots[e.Node]++
		}
	}
	return s
}
