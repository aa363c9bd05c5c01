package lease

import (
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// ClaimedID is the grant an agent's status entry names.
func ClaimedID(c fleetv1.GrantInUse) ID {
	return ID{Lease: c.Lease, UID: c.UID, Transitions: c.LeaseTransitions}
}

// Matches reports whether status entry c names grant id: the same Lease,
// the same UID and the same leaseTransitions, so an entry for an earlier
// grant of the slot, or for a Lease deleted and made again, never counts
// for this one. It is the one comparison of a reported grant with a
// Lease's; whether the entry releases the grant is the caller's question.
func Matches(c fleetv1.GrantInUse, id ID) bool { return ClaimedID(c) == id }

// FindClaim is the entry of claims (a BootcNode's status.grants) that
// names grant id.
func FindClaim(claims []fleetv1.GrantInUse, id ID) (fleetv1.GrantInUse, bool) {
	for _, c := range claims {
		if Matches(c, id) {
			return c, true
		}
	}
	return fleetv1.GrantInUse{}, false
}

// Claim is the status entry that names grant id, with the reason the agent
// lets go of it ("" while it uses it).
func Claim(id ID, released string) fleetv1.GrantInUse {
	return fleetv1.GrantInUse{Lease: id.Lease, UID: id.UID, LeaseTransitions: id.Transitions, Released: released}
}
