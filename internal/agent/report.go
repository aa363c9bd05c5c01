package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/decide"
)

// maxConditionMessage bounds a condition message (the API's limit is 32768).
const maxConditionMessage = 4096

// refused reports whether the API server answered and said no (as opposed to
// not answering): a permission, identity or validation refusal that will
// not heal by retrying, and that a person must see.
func refused(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsInvalid(err) ||
		apierrors.IsBadRequest(err) || apierrors.IsRequestEntityTooLargeError(err) || apierrors.IsMethodNotSupported(err) ||
		apierrors.IsNotAcceptable(err) || apierrors.IsUnsupportedMediaType(err)
}

// noteRequest remembers the outcome of one kind of API request: a refusal
// is kept (and shown in the APIAccess condition) until the same request
// succeeds.
func (r *runner) noteRequest(op string, err error) {
	switch {
	case err == nil || apierrors.IsNotFound(err):
		delete(r.refusals, op)
	case refused(err):
		if r.refusals[op] == "" {
			r.log.Error("the API server refused a request", "request", op, "err", err)
		}
		r.refusals[op] = err.Error()
	}
}

// apiAccess is the APIAccess condition: False while any request of the
// agent (its informers' lists and watches included) is refused.
func (r *runner) apiAccess(gen int64) metav1.Condition {
	var msgs []string
	for op, m := range r.refusals {
		msgs = append(msgs, op+": "+m)
	}
	for inf, err := range r.api.ListErrors() {
		if refused(err) {
			msgs = append(msgs, "list/watch "+inf+": "+err.Error())
		}
	}
	c := metav1.Condition{Type: fleetv1.ConditionAPIAccess, Status: metav1.ConditionTrue, Reason: fleetv1.ReasonAsExpected,
		Message: "the API server accepts every request of this agent", ObservedGeneration: gen}
	if len(msgs) > 0 {
		sort.Strings(msgs)
		c.Status, c.Reason = metav1.ConditionFalse, fleetv1.ReasonRequestRefused
		c.Message = text.Truncate("the API server refuses requests of this agent: "+strings.Join(msgs, "; "), maxConditionMessage)
	}
	return c
}

// report patches BootcNode.status when it changed or a heartbeat is due
// (reportEvery), and sends STATUS= when the phase or message changed. The
// report lists the grants the agent works under (decide.Claims); once the
// API server accepted it, each listed grant's heartbeat is the time the
// report was sent. credited says a grant got its first heartbeat, so the
// caller can use it at once.
func (r *runner) report(ctx context.Context, o decide.Observation, st bootc.Status, a decide.Action) (credited bool) {
	msg := r.notifyStatus(a)
	n := r.api.BootcNode()
	if n == nil {
		return false // the coordinator has not created it yet
	}
	claims := decide.Claims(o, a)
	rep := statusReport{
		ObservedGeneration: n.Generation,
		BootID:             o.Boot.BootID,
		SoftRebootCount:    o.Boot.SoftRebootCount,
		Phase:              a.Phase,
		Reason:             a.Reason,
		Message:            text.Truncate(msg, fleetv1.MaxStatusMessage),
		AgentVersion:       text.Truncate(r.cfg.Version, 128),
		Grants:             r.inUse(claims),
		Host:               r.hostHealth(ctx, n, o.Boot),
	}
	if st.Booted != nil || st.Staged != nil || st.Rollback != nil {
		rep.Booted, rep.Staged, rep.Rollback = deployment(st.Booted), deployment(st.Staged), deployment(st.Rollback)
	} else if r.reported {
		rep.Booted, rep.Staged, rep.Rollback = r.lastReport.Booted, r.lastReport.Staged, r.lastReport.Rollback
	}
	conds := append([]metav1.Condition(nil), n.Status.Conditions...)
	c := metav1.Condition{Type: ConditionGrantsReadable, Status: metav1.ConditionTrue, Reason: fleetv1.ReasonAsExpected,
		Message: "every lease labelled with this node follows the slot protocol", ObservedGeneration: n.Generation}
	if len(r.st.Malformed) > 0 {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, fleetv1.ReasonMalformedGrant, text.Truncate("ignored: "+strings.Join(r.st.Malformed, "; "), maxConditionMessage)
	}
	meta.SetStatusCondition(&conds, c)
	meta.SetStatusCondition(&conds, r.apiAccess(n.Generation))
	rep.Conditions = conds
	// A grant the coordinator took back (released, revoked, handed on) is
	// no news to it: dropping it from the list waits for the next report.
	// A stale entry names a grant identity that no longer exists.
	if r.reported && rep.sameAs(r.withoutGone(r.lastReport)) && r.now().Sub(r.lastReportAt) < r.reportEvery(string(a.Phase)) {
		return false
	}
	for _, c := range claims {
		if h, ok := r.st.Held(c.ID); ok && c.Released == "" && h.LastHeartbeat.IsZero() {
			credited = true // its first heartbeat, if this report is taken
		}
	}
	if err := r.send(ctx, rep); err != nil {
		r.log.Info("status report failed", "err", err)
		if refused(err) {
			cctx, cancel := context.WithTimeout(ctx, apiTimeout)
			r.reportRefusal(cctx, n.Generation, conds)
			cancel()
		}
		return false
	}
	return credited
}

// send writes rep as this node's BootcNode status, timed now. Once the API
// server took it, every grant it lists in use has this report as its
// heartbeat: the time it was sent, not when it arrived, so the agent's
// validity ends before the coordinator's (which runs from when it saw it).
func (r *runner) send(ctx context.Context, rep statusReport) error {
	sent := r.now()
	rep.LastReportTime, r.reportTried = sent, sent
	pctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	body, err := json.Marshal(map[string]any{"status": rep.fields()})
	if err == nil {
		err = r.api.PatchStatus(pctx, body)
	}
	r.noteRequest("patch bootcnode status", err)
	if err != nil {
		return err
	}
	r.api.ClearListError("bootcnodes")
	var listed []lease.ID
	for _, g := range rep.Grants {
		if g.Released == "" {
			listed = append(listed, lease.ClaimedID(g))
		}
	}
	r.step(decide.Input{Now: sent, Reported: &decide.Reported{Sent: sent, Grants: listed}})
	r.lastReport, r.lastReportAt, r.reported = rep, sent, true
	return nil
}

// notifyStatus sends STATUS= for a when the line changed and returns the
// message to report.
func (r *runner) notifyStatus(a decide.Action) string {
	msg := a.Message
	if len(r.st.Malformed) > 0 {
		msg += fmt.Sprintf(" (ignoring %d malformed lease(s))", len(r.st.Malformed))
	}
	line := string(a.Phase) + ": " + msg
	if line != r.lastNotify {
		if err := r.deps.Notifier.Status(line); err != nil {
			r.log.Error("sd_notify STATUS failed", "err", err)
		}
		r.lastNotify = line
	}
	return msg
}

// heartbeat re-sends the last report with a new time, so the grants it
// lists stay usable and the coordinator sees the agent alive. Nothing the
// report says changed (a change of bootc status, a grant or the BootcNode
// wakes a full round), so it reads no bootc status; only the boot ID is
// checked. It returns false when a full round must report instead: also
// when the last decision is an update's reboot that no report has said yet
// (amendment 37), so the report that falls due says Rebooting.
func (r *runner) heartbeat(ctx context.Context) bool {
	if !r.reported {
		return false
	}
	if a := r.st.Last.Action; decide.Unannounced(a) && (r.lastReport.Phase != a.Phase || r.lastReport.Reason != a.Reason) {
		return false
	}
	if id, err := r.deps.Host.BootID(); err != nil || id != r.lastReport.BootID {
		return false
	}
	if err := r.send(ctx, r.withoutGone(r.lastReport)); err != nil {
		r.log.Info("heartbeat failed", "err", err)
	}
	return true // a failed one is retried after a pause (reportDue)
}

// reportRefusal writes only the conditions, with APIAccess saying why the
// full report was refused (e.g. a field the schema rejects): a smaller
// patch may still pass, and a person then sees the server's message.
func (r *runner) reportRefusal(ctx context.Context, gen int64, conds []metav1.Condition) bool {
	meta.SetStatusCondition(&conds, r.apiAccess(gen))
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": conds}})
	if err != nil {
		return false
	}
	if err := r.api.PatchStatus(ctx, body); err != nil {
		r.log.Info("could not report the refusal either", "err", err)
		return false
	}
	return true
}

// withoutGone is rep without the grants whose Lease no longer holds that
// grant for this node (the coordinator released, revoked or re-granted it).
func (r *runner) withoutGone(rep statusReport) statusReport {
	kept := make([]fleetv1.GrantInUse, 0, len(rep.Grants))
	for _, g := range rep.Grants {
		if _, ok := r.st.Held(lease.ClaimedID(g)); ok {
			kept = append(kept, g)
		}
	}
	rep.Grants = kept
	return rep
}

// inUse turns claims into the status list, with each grant's UID.
func (r *runner) inUse(claims []decide.Claim) []fleetv1.GrantInUse {
	out := make([]fleetv1.GrantInUse, 0, len(claims))
	for _, c := range claims {
		out = append(out, fleetv1.GrantInUse{Lease: c.ID.Lease, UID: types.UID(c.ID.UID), LeaseTransitions: c.ID.Transitions, Released: c.Released})
	}
	return out
}

func deployment(e *bootc.Entry) *fleetv1.Deployment {
	if e == nil {
		return nil
	}
	d := &fleetv1.Deployment{
		// Bounded as the CRD bounds them: bootc's output is outside input.
		Image: text.Truncate(e.Image, 1024), Digest: e.Digest, Version: text.Truncate(e.Version, 256),
		DownloadOnly: e.DownloadOnly, SoftRebootCapable: e.SoftRebootCapable,
		Signature: fleetv1.ImageSignature(e.Signature),
	}
	if e.Timestamp != nil {
		t := metav1.NewTime(*e.Timestamp)
		d.Timestamp = &t
	}
	return d
}
