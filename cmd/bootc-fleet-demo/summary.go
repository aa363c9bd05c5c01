package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
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

// badImageCheck is what the event log says the bad image did.
type badImageCheck struct {
	canary        string
	canaryReboots []string // images the canary rebooted into during the act
	grants        int      // distinct grants those reboots were under
	untouched     []string // other nodes that did not reboot during the act
	staged        []string // other nodes that staged the bad image (locked: harmless)
	problems      []string
}

// checkBadImage checks the bad image's act, the events with Seq in (from,
// to]: the canary rebooted exactly twice, into bad and then back into
// previous, under two different grants (the update's and the rollback's),
// and no other node rebooted; over the whole run, no node but the canary
// rebooted or booted into bad.
func checkBadImage(evs []invariant.Event, from, to int64, canary, bad, previous string, nodes []string) badImageCheck {
	c := badImageCheck{canary: canary}
	grantOf := map[string]string{} // lease@rv -> the grant it holds
	grants := map[string]bool{}
	rebooted := map[string]bool{}
	for _, e := range evs {
		at := fmt.Sprintf("%s@%d", e.Lease, e.RV)
		switch {
		case e.Kind == invariant.LeaseVersion && e.Holder != "":
			grantOf[at] = fmt.Sprintf("%s/%s/%s/%d/%s", e.Lease, e.Holder, e.BootID, e.SoftRebootCount, e.Image)
		case (e.Kind == invariant.Reboot || e.Kind == invariant.Boot) && e.Image == bad && e.Node != canary:
			c.problems = append(c.problems, fmt.Sprintf("%s %s into the bad image (event #%d)", e.Node, strings.ToLower(string(e.Kind)), e.Seq))
		case e.Kind == invariant.StageStart && e.Image == bad && e.Node != canary && !slices.Contains(c.staged, e.Node):
			c.staged = append(c.staged, e.Node)
		}
		if e.Kind != invariant.Reboot || e.Seq <= from || e.Seq > to {
			continue
		}
		rebooted[e.Node] = true
		if e.Node == canary {
			c.canaryReboots = append(c.canaryReboots, e.Image)
			if g := grantOf[fmt.Sprintf("%s@%d", e.GrantLease, e.GrantRV)]; g != "" {
				grants[g] = true
			}
		}
	}
	c.grants = len(grants)
	switch {
	case canary == "":
		c.problems = append(c.problems, "no canary failed its gate on the bad image")
	case !slices.Equal(c.canaryReboots, []string{bad, previous}):
		c.problems = append(c.problems, fmt.Sprintf("the canary %s rebooted into %q, want the bad image, then back to the previous one", canary, c.canaryReboots))
	case c.grants != 2:
		c.problems = append(c.problems, fmt.Sprintf("the canary %s rebooted twice under %d grants, want 2 (update, rollback)", canary, c.grants))
	}
	for _, n := range nodes {
		switch {
		case n == canary:
		case rebooted[n]:
			c.problems = append(c.problems, fmt.Sprintf("%s rebooted while the bad image was the target", n))
		default:
			c.untouched = append(c.untouched, n)
		}
	}
	return c
}

// writeActs writes one line per act of the story and returns what the
// event log says the bad image did.
func writeActs(w io.Writer, images map[string]string, st *story, evs []invariant.Event, nodes []*sim.ProcNode) badImageCheck {
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	canary := st.canary
	if q := st.quarantine; q != nil && canary == "" {
		canary = q.Node
	}
	to := st.badTo
	if to == 0 { // the act did not finish: up to now
		to = math.MaxInt64
	}
	bad := checkBadImage(evs, st.badFrom, to, canary, images[tagBad], st.previous, names)
	if st.firstDone == 0 {
		fmt.Fprintf(w, "  v1 -> %s: did NOT converge on %s\n", tagFirst, labelOf(images, st.target))
		return bad
	}
	fmt.Fprintf(w, "  v1 -> %s: image changed to %s at %.1fs, mid-rollout; every node on %s at %.1fs\n",
		tagFirst, tagChanged, st.changedAt.Seconds(), tagChanged, st.firstDone.Seconds())
	q := st.quarantine
	switch {
	case q == nil:
		fmt.Fprintf(w, "  %s (bad) at %.1fs: NOT caught\n", tagBad, st.badAt.Seconds())
		return bad
	case st.backAt == 0:
		fmt.Fprintf(w, "  %s (bad) at %.1fs: caught on %s (%s) at %.1fs, quarantined; the rollback did NOT finish\n",
			tagBad, st.badAt.Seconds(), q.Node, q.Reason, st.caughtAt.Seconds())
		return bad
	}
	fmt.Fprintf(w, "  %s (bad) at %.1fs: caught on %s (%s) at %.1fs, quarantined; %s rolled back to %s at %.1fs; %d other nodes untouched (none rebooted, %d staged %s, locked)\n",
		tagBad, st.badAt.Seconds(), q.Node, q.Reason, st.caughtAt.Seconds(), q.Node, labelOf(images, st.previous), st.backAt.Seconds(),
		len(bad.untouched), len(bad.staged), tagBad)
	if st.doneAt == 0 {
		fmt.Fprintf(w, "  %s at %.1fs: did NOT converge\n", tagGood, st.goodAt.Seconds())
		return bad
	}
	fmt.Fprintf(w, "  %s at %.1fs: every node on %s at %.1fs\n", tagGood, st.goodAt.Seconds(), tagGood, st.doneAt.Seconds())
	return bad
}

// writeBadImageCheck writes the verdict of checkBadImage, once the bad
// image's act began.
func writeBadImageCheck(w io.Writer, images map[string]string, st *story, c badImageCheck) {
	if st.badAt == 0 {
		return
	}
	if len(c.problems) == 0 {
		fmt.Fprintf(w, "  bad image: held (%s rebooted twice for %s under %d grants: into %s, back to %s; no other node rebooted or booted into %s)\n",
			c.canary, tagBad, c.grants, labelOf(images, images[tagBad]), labelOf(images, st.previous), tagBad)
		return
	}
	fmt.Fprintf(w, "  bad image: %d VIOLATED\n", len(c.problems))
	for _, p := range c.problems {
		fmt.Fprintf(w, "    %s\n", p)
	}
}
