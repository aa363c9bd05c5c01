package agent

import (
	"context"
	"errors"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/decide"
)

// leaseView parses the informer's Leases for Step (decide.State.syncGrants
// keeps the heartbeats). The agent writes no Lease: a grant is kept alive
// by the agent's status reports (report), and checked with a consistent
// read right before it is used (a Confirm effect).
func (r *runner) leaseView() decide.LeaseView {
	var v decide.LeaseView
	for _, l := range r.api.Leases() {
		g, err := lease.Parse(l)
		switch {
		case errors.Is(err, lease.ErrMalformed):
			v.Malformed = append(v.Malformed, l.Name+": "+err.Error())
		case err == nil:
			v.Grants = append(v.Grants, g)
		}
	}
	if err := r.api.SlotsError(); err != nil {
		v.Malformed = append(v.Malformed, "BootcNode "+r.cfg.NodeName+": "+err.Error())
	}
	return v
}

// logGrants logs the grants that came, changed or went since before.
func (r *runner) logGrants(before []decide.HeldGrant) {
	was := map[string]lease.Grant{}
	for _, h := range before {
		was[h.Lease] = h.Grant
	}
	for _, h := range r.st.Grants {
		g := h.Grant
		old, ok := was[g.Lease]
		delete(was, g.Lease)
		switch {
		case !ok || old.ID != g.ID:
			r.log.Info("grant seen", "lease", g.Lease, "grant", g.ID.String(), "kind", string(g.Kind), "image", g.Image.String(),
				"phase", string(g.Phase), "bootID", g.BootID)
		case old.Phase != g.Phase || old.Failure != g.Failure || old.Image != g.Image:
			r.log.Info("grant changed", "lease", g.Lease, "grant", g.ID.String(), "phase", string(g.Phase), "failure", g.Failure)
		}
	}
	for n, g := range was {
		r.log.Info("grant gone", "lease", n, "grant", g.ID.String())
	}
}

// readGrant is a Confirm effect: a consistent read of the grant's Lease
// (a GET without resourceVersion, not the informer's copy, which may lag
// behind a revoke). decide.State.Confirmed judges what it returns.
func (r *runner) readGrant(ctx context.Context, e decide.Effect) decide.Result {
	res := decide.Result{Kind: e.Kind}
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	l, err := r.api.ReadLease(cctx, e.Grant.Lease)
	r.noteRequest("get lease "+e.Grant.Lease, err)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	g, err := lease.Parse(l)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	res.Lease, res.ResourceVersion = &g, l.ResourceVersion
	return res
}

// confirmed logs and traces the confirm that allowed e (a Stage, Unlock or
// Reboot effect): the step is taken right after.
func (r *runner) confirmed(e decide.Effect) {
	r.log.Info("grant confirmed", "step", e.Step, "lease", e.Grant.Lease, "resourceVersion", e.ResourceVersion,
		"grant", e.Grant.ID.String(), "image", e.Grant.Image.String(), "bootID", e.Boot.BootID, "softRebootCount", e.Boot.SoftRebootCount)
	if r.deps.Trace != nil {
		r.deps.Trace(Step{Time: r.now(), Kind: e.Step, Lease: e.Grant.Lease, ResourceVersion: e.ResourceVersion, Grant: e.Grant.ID,
			Image: e.Grant.Image.String(), BootID: e.Boot.BootID, SoftRebootCount: e.Boot.SoftRebootCount})
	}
}

// reportEvery is how often the agent reports when nothing changes: while it
// holds a grant it lists, HeartbeatsPerLease times per lease duration (the
// coordinator expires a stage grant after a lease duration without one);
// while it has rollout work (any phase but Idle) every ActiveReportInterval,
// so the pool can tell a quiet agent within minutes; otherwise every
// ReportInterval.
func (r *runner) reportEvery(phase string) time.Duration {
	every := r.cfg.ReportInterval
	if phase != "" && phase != "Idle" {
		every = min(every, r.cfg.ActiveReportInterval)
		if r.st.LeaseDuration > 0 && phase == "Staging" {
			// A revoked holder still staging counts against maxStaging
			// while its heartbeats keep coming (amendment 7).
			every = min(every, r.st.LeaseDuration/lease.HeartbeatsPerLease)
		}
	}
	for _, h := range r.st.Grants {
		if !decide.Heartbeated(h.Grant) {
			continue // not listed while the node drains (amendment 18)
		}
		if decide.StageFinished(r.st.Last.Obs, h.Grant) {
			continue // done with, not listed: handed on lazily (amendment 31)
		}
		every = min(every, h.Duration/lease.HeartbeatsPerLease)
	}
	return max(every, 100*time.Millisecond)
}

// reportDue is the time until the next report is due.
func (r *runner) reportDue() time.Duration {
	if r.api.BootcNode() == nil {
		return time.Duration(1<<62 - 1) // nothing to report into yet; its creation wakes the loop
	}
	due := r.lastReportAt.Add(r.reportEvery(string(r.lastReport.Phase)))
	if !r.reported {
		due = time.Time{}
	}
	// A report the API server did not take is retried after a pause, not
	// in a tight loop of rounds (each reads bootc status).
	if retry := r.reportTried.Add(max(r.cfg.RereadInterval, time.Second)); retry.After(due) {
		due = retry
	}
	return due.Sub(r.now())
}
