package decide

import (
	"sort"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Claim is a grant the agent lists in its status (fleetv1.GrantInUse): the
// agent writes no Lease, so a listed grant in a fresh report is how it tells
// the coordinator it still works under it (docs/design.md, amendment 8).
type Claim struct {
	ID lease.ID
	// Released is the reason the agent lets go of the grant; empty while it
	// still uses it.
	Released string
}

// Claims returns the grants to list in the report of action a: every grant
// this node holds in the current boot for the image it is moving to, unless
// the coordinator marked it failed or a reboot already spent it; a reboot
// grant of this boot only once it is in phase Reboot. A stage grant the
// agent is done with (StageFinished: its image staged and locked in the
// grant's boot, or a grant of another boot, void in this one) is not
// listed: the coordinator sees as much in the report and hands its slot on
// when another node needs it (amendment 31). A stage
// grant is released when the stage failed lease.MaxStageAttempts times under
// it, or when a is a Degraded verdict (the agent cannot use the grant, so it
// must not keep the slot from the next node). A reboot grant is released
// only when it is of an earlier boot and the agent never used it
// (RebootGrantUnused); otherwise the coordinator's rebootTimeout, which no
// report of the agent extends, decides about it.
func Claims(o Observation, a Action) []Claim {
	var out []Claim
	for _, g := range o.Grants {
		if g.Holder != o.Node || g.Failure != "" || !o.Boot.Known() {
			continue
		}
		if !grantedIn(g.Grant, o.Boot) {
			// Void in this boot (I5): a stage grant is said to be let go of,
			// so its slot is handed on. A reboot grant of the last boot that
			// a reboot of ours spent (or a record names) is the one the
			// coordinator is verifying: nothing to say. One the agent never
			// used is said to be unused, so the coordinator does not wait
			// for a reboot into the image that will never come (the node
			// went down some other way, and a locked stage went with it).
			switch {
			case g.Kind == lease.KindStage:
				// Finished (amendment 31): its slot is the coordinator's
				// to hand on, by the kubelet's boot ID and the agent's
				// soft-reboot count, without a word.
			case !spent(o, g.ID) && (!o.Record.Present || o.Record.Grant != g.ID) && o.Record.Unreadable == "":
				out = append(out, Claim{ID: g.ID, Released: fleetv1.ReasonRebootGrantUnused})
			}
			continue
		}
		wanted := o.Desired.Set && o.Desired.Invalid == "" && g.Image == o.Desired.Image
		if (o.Record.Present && g.ID == o.Record.Grant) || (g.Kind == lease.KindReboot && g.Rollback) {
			wanted = true // a rollback grant's image is not the desired one until the coordinator says so
		}
		if !wanted || StageFinished(o, g.Grant) {
			continue
		}
		c := Claim{ID: g.ID}
		switch {
		case g.Kind == lease.KindReboot:
			if spent(o, g.ID) || !Heartbeated(g.Grant) {
				continue
			}
		case o.LastStageFailure.exhausted(g.ID):
			c.Released = o.LastStageFailure.reason()
		case a.Phase == fleetv1.PhaseDegraded && releasesStage(a.Reason):
			c.Released = a.Reason
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID.Lease < out[j].ID.Lease })
	return out
}

// releasesStage: a Degraded reason that means the agent cannot use a stage
// grant now. A stage failure still being retried and a bootc status that
// failed once are passing: the grant is kept.
func releasesStage(reason string) bool {
	return reason != fleetv1.ReasonStageFailed && reason != fleetv1.ReasonStatusUnavailable
}

// StageFinished reports whether the agent is done with stage grant g (held
// by this node): issued in another boot (void in this one), or its image
// staged and locked (download-only), verified when signed images are
// required, as a status read in the grant's boot shows, with no stage
// process still running (bootc can show the stage before it returns). The agent neither
// lists it nor uses it while that holds (rule 4 needs no stage grant for a
// locked stage): the coordinator reads the same from the report and hands
// its slot on lazily (docs/design.md, amendment 31). Should the locked
// stage go in the grant's boot, the grant is live again and, its heartbeat
// cleared while it was finished (State.view), is listed before it is
// used, as a new grant is.
func StageFinished(o Observation, g lease.Grant) bool {
	if g.Kind != lease.KindStage || g.Holder != o.Node || !o.Boot.Known() {
		return false
	}
	if !grantedIn(g, o.Boot) {
		return true
	}
	if o.InFlight != nil || o.Status.Unavailable != "" || o.Status.ReadIn != o.Boot || !o.Status.Staged.Is(g.Image) || !o.Status.Staged.DownloadOnly {
		return false
	}
	return !o.RequireSigned || o.Status.Staged.verified()
}
