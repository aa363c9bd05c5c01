package invariant

import (
	"fmt"
	"math"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
)

// purposeMismatch is the rollback part of I1 for an action under grant g
// that is otherwise valid: `bootc rollback` and the reboot into the
// deployment it queued need a rollback grant; an apply, and a reboot into
// a staged deployment, an update grant (amendment 25: an update grant never
// allows a rollback, a rollback grant never an update).
func purposeMismatch(e, g Event) string {
	switch {
	case e.Kind == RollbackRun && !g.Rollback:
		return "bootc rollback under an update grant"
	case e.Kind == Reboot && e.Rollback && !g.Rollback:
		return "reboot into the rollback deployment under an update grant"
	case e.Kind == Reboot && !e.Rollback && g.Rollback:
		return "update reboot under a rollback grant"
	case e.Kind == Apply && g.Rollback:
		return "update applied under a rollback grant"
	}
	return ""
}

// quarantine is one quarantine of a pool's target: from pool version rv
// (logged at seq) until spec.image leaves specImage (pool version endRV,
// logged at endSeq; both MaxInt64 while it stays).
type quarantine struct {
	ev            Event
	specImage     string
	digest        string
	rv, seq       int64
	endRV, endSeq int64
}

func (q quarantine) activeAtRV(rv int64) bool   { return rv > q.rv && rv < q.endRV }
func (q quarantine) activeAtSeq(seq int64) bool { return seq > q.seq && seq < q.endSeq }

// quarantines reads the Quarantine and PoolImage events of every pool.
func quarantines(evs []Event) map[string][]quarantine {
	out := map[string][]quarantine{}
	spec := map[string]string{} // pool -> spec.image as last logged
	for _, e := range evs {
		switch e.Kind {
		case Quarantine:
			q := quarantine{ev: e, specImage: e.Detail, digest: e.Image, rv: e.RV, seq: e.Seq, endRV: math.MaxInt64, endSeq: math.MaxInt64}
			if s, ok := spec[e.Pool]; ok && s != q.specImage {
				q.endRV, q.endSeq = q.rv, q.seq // written for an image spec.image no longer names: stands for nothing
			}
			out[e.Pool] = append(out[e.Pool], q)
		case PoolImage:
			spec[e.Pool] = e.Detail
			qs := out[e.Pool]
			for i := range qs {
				if qs[i].endSeq == math.MaxInt64 && e.Detail != qs[i].specImage && e.RV > qs[i].rv {
					qs[i].endRV, qs[i].endSeq = e.RV, e.Seq
				}
			}
		}
	}
	return out
}

// grantKey is one grant: a slot held by a node in a boot for an image and
// a purpose. Versions of a Lease that keep it are the same grant.
type grantKey struct {
	lease, holder, boot string
	soft                uint32
	image               string
	rollback            bool
}

func keyOf(e Event) grantKey {
	return grantKey{e.Lease, e.Holder, e.BootID, e.SoftRebootCount, e.Image, e.Rollback}
}

// checkQuarantine is I6: once the coordinator quarantined digest D for a
// pool (status.quarantine), while spec.image still names the image it named
// then, no grant for D is given, none for D advances to phase Reboot, and no
// node boots D but one whose reboot under a grant for D was already in phase
// Reboot when D was quarantined (it finishes, amendment 25).
func checkQuarantine(evs []Event) []Violation {
	qs := quarantines(evs)
	if len(qs) == 0 {
		return nil
	}
	var out []Violation
	prev := map[string]Event{}          // lease -> its previous version
	rebootFrom := map[grantKey]int64{}  // grant -> first version in phase Reboot
	versions := map[leaseKey]grantKey{} // lease version -> its grant
	lastAction := map[string]Event{}    // node -> its last Apply or Reboot
	booted := map[string]string{}       // node -> image of its last Boot
	for _, e := range evs {
		switch e.Kind {
		case LeaseVersion:
			out = append(out, quarantinedGrant(e, prev, qs[e.Pool])...)
			prev[e.Lease] = e
			if e.Holder == "" {
				continue
			}
			k := keyOf(e)
			versions[leaseKey{e.Lease, e.RV}] = k
			if _, ok := rebootFrom[k]; !ok && e.Phase == lease.PhaseReboot {
				rebootFrom[k] = e.RV
			}
		case Apply, Reboot:
			lastAction[e.Node] = e
		case Boot:
			was := booted[e.Node]
			booted[e.Node] = e.Image
			if e.Image == "" || e.Image == was {
				continue // a boot again into what it ran: nothing entered
			}
			for _, q := range qs[e.Pool] {
				if q.digest != e.Image || !q.activeAtSeq(e.Seq) {
					continue
				}
				a, ok := lastAction[e.Node]
				k, known := versions[leaseKey{a.GrantLease, a.GrantRV}]
				from, phased := rebootFrom[k]
				if !ok || !known || !phased || k.image != q.digest || from > q.rv {
					out = append(out, Violation{"I6", e.Node, fmt.Sprintf("booted quarantined %s (spec.image %s) under no reboot grant for it in phase Reboot before the quarantine",
						e.Image, q.specImage), evidence(q.ev, a, ok, e)})
				}
			}
		}
	}
	return out
}

// quarantinedGrant checks one Lease version against the pool's
// quarantines: a new grant for a quarantined digest, or one advancing to
// phase Reboot, while the quarantine stands.
func quarantinedGrant(e Event, prev map[string]Event, qs []quarantine) []Violation {
	if e.Holder == "" {
		return nil
	}
	p, had := prev[e.Lease]
	fresh := !had || p.Holder == "" || keyOf(p) != keyOf(e)
	advanced := !fresh && e.Phase == lease.PhaseReboot && p.Phase != lease.PhaseReboot
	if !fresh && !advanced {
		return nil
	}
	var out []Violation
	for _, q := range qs {
		if q.digest != e.Image || !q.activeAtRV(e.RV) {
			continue
		}
		what := "given"
		if advanced {
			what = "advanced to phase Reboot"
		}
		out = append(out, Violation{"I6", e.Holder, fmt.Sprintf("%s grant for quarantined %s %s while spec.image is still %s",
			e.Slot, e.Image, what, q.specImage), []Event{q.ev, e}})
	}
	return out
}

func evidence(q, a Event, ok bool, e Event) []Event {
	if ok {
		return []Event{q, a, e}
	}
	return []Event{q, e}
}
