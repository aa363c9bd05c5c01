package agent

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/decide"
)

// held is a grant the informer shows for this node, with the agent's own
// time of its last accepted heartbeat that listed it.
type held struct {
	grant lease.Grant
	// lastHeartbeat is when the agent sent the last status report that
	// listed this grant and that the API server accepted; zero until then.
	// The grant is usable only for lease.ValidFraction of the lease
	// duration after it (lease.Grant.Allows).
	lastHeartbeat time.Time
}

// syncGrants reconciles the held grants with the informer's Leases. The
// agent writes no Lease: a grant is kept alive by the agent's status reports
// (report), and checked with a consistent read right before it is used
// (confirm). A grant whose Lease disappeared or changed hands is dropped at
// once; a grant rewritten in place (phase Draining -> Reboot) keeps its
// heartbeat, a new grant in the same Lease starts without one.
func (r *runner) syncGrants() {
	seen := map[string]bool{}
	r.malformed = r.malformed[:0]
	for _, l := range r.kube.cachedLeases() {
		g, err := lease.Parse(l)
		switch {
		case errors.Is(err, lease.ErrMalformed):
			r.malformed = append(r.malformed, l.Name+": "+err.Error())
			continue
		case err != nil || g.Holder != r.cfg.NodeName:
			continue
		}
		seen[l.Name] = true
		h := r.held[l.Name]
		if g.Duration > 0 {
			r.leaseDuration = g.Duration
		}
		if h == nil || h.grant.ID != g.ID {
			r.log.Info("grant seen", "lease", l.Name, "grant", g.ID.String(), "kind", string(g.Kind), "image", g.Image.String(),
				"phase", string(g.Phase), "bootID", g.BootID)
			r.held[l.Name] = &held{grant: g}
			continue
		}
		if h.grant.Phase != g.Phase || h.grant.Failure != g.Failure || h.grant.Image != g.Image {
			r.log.Info("grant changed", "lease", l.Name, "grant", g.ID.String(), "phase", string(g.Phase), "failure", g.Failure)
		}
		h.grant = g
	}
	for n, h := range r.held {
		if !seen[n] {
			r.log.Info("grant gone", "lease", n, "grant", h.grant.ID.String())
			delete(r.held, n)
		}
	}
	sort.Strings(r.malformed)
}

// grants returns the held grants, in lease name order.
func (r *runner) grants() []decide.HeldGrant {
	names := make([]string, 0, len(r.held))
	for n := range r.held {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]decide.HeldGrant, 0, len(names))
	for _, n := range names {
		h := r.held[n]
		out = append(out, decide.HeldGrant{Grant: h.grant, LastHeartbeat: h.lastHeartbeat})
	}
	return out
}

// heldGrant returns the held grant with this identity.
func (r *runner) heldGrant(id lease.ID) (decide.HeldGrant, bool) {
	h := r.held[id.Lease]
	if h == nil || h.grant.ID != id {
		return decide.HeldGrant{}, false
	}
	return decide.HeldGrant{Grant: h.grant, LastHeartbeat: h.lastHeartbeat}, true
}

// errNotConfirmed: the consistent read does not show the grant as held.
var errNotConfirmed = errors.New("grant not confirmed")

// confirm checks, right before a disruptive step, that the API server still
// holds exactly the grant the decision relied on. It reads the Lease with a
// consistent GET (not the informer's copy, which may lag behind a revoke)
// and checks the result with lease.Grant.Allows: same identity (name, UID,
// leaseTransitions), holder, image, boot, phase, no failure mark, and the
// agent's last accepted heartbeat recent enough. Any error means "do not
// act"; the next round looks again. On success the step is traced and
// logged with the resourceVersion the read returned.
func (r *runner) confirm(ctx context.Context, want decide.HeldGrant, act lease.Action, step, image string, boot decide.BootIdentity) bool {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	l, err := r.kube.readLease(cctx, want.Lease)
	r.noteRequest("get lease "+want.Lease, err)
	var g lease.Grant
	if err == nil {
		g, err = lease.Parse(l)
	}
	if err == nil && (g.ID != want.ID || g.Image != want.Image || g.Phase != want.Phase || g.BootID != want.BootID ||
		g.SoftRebootCount != want.SoftRebootCount || g.Failure != want.Failure) {
		err = fmt.Errorf("%w: the API server has %s (image %s, phase %q, boot %s, soft reboots %d, failure %q)", errNotConfirmed,
			g.ID, g.Image, g.Phase, g.BootID, g.SoftRebootCount, g.Failure)
	}
	if err == nil {
		err = g.Allows(lease.Check{Node: r.cfg.NodeName, Action: act, Image: image, BootID: boot.BootID,
			SoftRebootCount: boot.SoftRebootCount, Now: r.now(), LastHeartbeat: want.LastHeartbeat})
	}
	if err != nil {
		r.log.Info("grant not confirmed; not acting", "step", step, "lease", want.Lease, "grant", want.ID.String(), "err", err)
		if !errors.Is(err, lease.ErrExpired) {
			delete(r.held, want.Lease) // what we hold is not what the API server has
		}
		return false
	}
	r.log.Info("grant confirmed", "step", step, "lease", want.Lease, "resourceVersion", l.ResourceVersion,
		"grant", g.ID.String(), "image", g.Image.String(), "bootID", boot.BootID, "softRebootCount", boot.SoftRebootCount)
	if r.deps.Trace != nil {
		r.deps.Trace(Step{Kind: step, Lease: want.Lease, ResourceVersion: l.ResourceVersion, Grant: g.ID,
			Image: g.Image.String(), BootID: boot.BootID, SoftRebootCount: boot.SoftRebootCount})
	}
	return true
}

// reportEvery is how often the agent reports when nothing changes: while it
// holds a grant, HeartbeatsPerLease times per lease duration (the
// coordinator expires a stage grant after a lease duration without one);
// while it has rollout work (any phase but Idle) every ActiveReportInterval,
// so the pool can tell a quiet agent within minutes; otherwise every
// ReportInterval.
func (r *runner) reportEvery(phase string) time.Duration {
	every := r.cfg.ReportInterval
	if phase != "" && phase != "Idle" {
		every = min(every, r.cfg.ActiveReportInterval)
		if r.leaseDuration > 0 && phase == "Staging" {
			// A revoked holder still staging counts against maxStaging
			// while its heartbeats keep coming (amendment 7).
			every = min(every, r.leaseDuration/lease.HeartbeatsPerLease)
		}
	}
	for _, h := range r.held {
		if h.grant.Kind == lease.KindReboot && h.grant.Phase != lease.PhaseReboot {
			continue // not listed while the node drains (amendment 18)
		}
		every = min(every, h.grant.Duration/lease.HeartbeatsPerLease)
	}
	return max(every, 100*time.Millisecond)
}

// reportDue is the time until the next report is due.
func (r *runner) reportDue() time.Duration {
	if r.kube.bootcNode() == nil {
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
