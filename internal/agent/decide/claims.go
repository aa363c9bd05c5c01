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
// the coordinator marked it failed or a reboot already spent it; a stage
// grant issued in another boot is listed as released (GrantedInAnotherBoot);
// a reboot grant of this boot only once it is in phase Reboot. A stage
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
				out = append(out, Claim{ID: g.ID, Released: fleetv1.ReasonGrantedInAnotherBoot})
			case !spent(o, g.ID) && (!o.Record.Present || o.Record.Grant != g.ID) && o.Record.Unreadable == "":
				out = append(out, Claim{ID: g.ID, Released: fleetv1.ReasonRebootGrantUnused})
			}
			continue
		}
		wanted := o.Desired.Set && o.Desired.Invalid == "" && g.Image == o.Desired.Image
		if (o.Record.Present && g.ID == o.Record.Grant) || (g.Kind == lease.KindReboot && g.Rollback) {
			wanted = true // a rollback grant's image is not the desired one until the coordinator says so
		}
		if !wanted {
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
