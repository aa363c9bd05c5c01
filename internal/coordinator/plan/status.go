package plan

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// status fills the pool status: counts per node (each node in exactly one
// bucket) and the four conditions, with Events on condition transitions.
func (p *planner) status() {
	prev := p.in.Pool.Status
	st := p.statusBase(prev)
	holds := p.holdsAfter()
	c := p.countNodes(&st, holds)
	st.Failures = int32(p.failures())
	held := p.heldNodes()
	st.Held = int32(len(held))
	quiet, refusing := p.quietAgents(holds)
	st.Quiet = int32(len(quiet))
	st.Quarantine = p.quarantine

	set := p.conditionSetter(prev.Conditions, &st)
	halted := p.halted()
	p.haltedCondition(set, halted, c.failed)
	p.degradedCondition(set, c)
	p.progressConditions(set, &st, c.notUpdated, halted, held)
	p.canaryStatus(set, &st)
	p.agentsCondition(set, quiet, refusing)
	p.platformCondition(set)
	p.membershipCondition(prev.Conditions, set)
	p.windowCondition(set)
	sort.Slice(st.Conditions, func(i, j int) bool { return st.Conditions[i].Type < st.Conditions[j].Type })
	p.out.Status = st
}

// setCondition sets one condition of the pool status being built.
type setCondition func(typ string, status metav1.ConditionStatus, reason, msg string)

// statusBase is the new status before counts and conditions: generation,
// target (an Event when it changed) and resolution time.
func (p *planner) statusBase(prev fleetv1.BootcNodePoolStatus) fleetv1.BootcNodePoolStatus {
	st := fleetv1.BootcNodePoolStatus{
		ObservedGeneration: p.in.Pool.Generation,
		TargetImage:        prev.TargetImage,
		ResolvedTime:       prev.ResolvedTime,
		Conditions:         append([]metav1.Condition(nil), prev.Conditions...),
	}
	if p.target.Digest != "" {
		if prev.TargetImage != "" && prev.TargetImage != p.target.String() {
			p.event("Normal", fleetv1.EventImageChanged, "target image changed from %s to %s (spec.image %s): starting a new rollout", prev.TargetImage, p.target, p.in.Pool.Spec.Image)
		}
		st.TargetImage = p.target.String()
	}
	if !p.in.ResolvedAt.IsZero() {
		// As stored: metav1.Time keeps whole seconds, so a time with a
		// fraction would never equal the value read back, and the status
		// would be rewritten on every pass.
		t := metav1.NewTime(p.in.ResolvedAt).Rfc3339Copy()
		st.ResolvedTime = &t
	}
	return st
}

// nodeCounts names the nodes behind the status's buckets.
type nodeCounts struct {
	conflicts, degraded, failed, notUpdated []string
}

// countNodes puts every member in exactly one bucket of st.
func (p *planner) countNodes(st *fleetv1.BootcNodePoolStatus, holds map[string][]*Slot) nodeCounts {
	var c nodeCounts
	for _, name := range p.members {
		n := p.nodes[name]
		bs := p.fresh(n)
		tgt, hasTarget := p.targetOf(name)
		st.Nodes++
		switch {
		case p.conflicted(n):
			c.conflicts = append(c.conflicts, conflictText(n))
			st.Degraded++
			continue
		case p.failedSlot[name] != "":
			c.failed = append(c.failed, fmt.Sprintf("%s (%s)", name, p.failedSlot[name]))
			st.Degraded++
		case p.signatureRejected(name):
			c.failed = append(c.failed, fmt.Sprintf("%s (%s)", name, fleetv1.ReasonSignatureRejected))
			st.Degraded++
		case bs != nil && bs.Phase == fleetv1.PhaseDegraded:
			c.degraded = append(c.degraded, fmt.Sprintf("%s (%s)", name, orUnknown(bs.Reason)))
			st.Degraded++
		case holdsKind(holds[name], lease.KindReboot):
			st.Rebooting++
		case p.noImage[name] != nil:
			// Not done: there is nothing it could be updated to.
			c.degraded = append(c.degraded, fmt.Sprintf("%s (%s)", name, p.noImage[name].Reason))
			st.Degraded++
		case bs != nil && hasTarget && onDigest(bs.Booted, tgt.Digest):
			st.Updated++
			continue
		case bs != nil && hasTarget && onDigest(bs.Staged, tgt.Digest):
			st.Staged++
		case holdsKind(holds[name], lease.KindStage) || (bs != nil && bs.Phase == fleetv1.PhaseStaging):
			st.Staging++
		default:
			st.Waiting++
		}
		c.notUpdated = append(c.notUpdated, name)
	}
	sort.Strings(c.degraded)
	sort.Strings(c.failed)
	return c
}

// conditionSetter sets conditions on st, with an Event when Halted,
// Degraded or UpToDate turns True or changes its reason.
func (p *planner) conditionSetter(prev []metav1.Condition, st *fleetv1.BootcNodePoolStatus) setCondition {
	now := metav1.Time{Time: p.in.Now}
	return func(typ string, status metav1.ConditionStatus, reason, msg string) {
		old := meta.FindStatusCondition(prev, typ)
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: typ, Status: status, Reason: reason, Message: msg,
			ObservedGeneration: p.in.Pool.Generation, LastTransitionTime: now,
		})
		if status == metav1.ConditionTrue && (old == nil || old.Status != status || old.Reason != reason) {
			switch typ {
			case fleetv1.PoolHalted:
				p.event("Warning", fleetv1.EventHalted, "%s", msg)
			case fleetv1.PoolDegraded:
				p.event("Warning", reason, "%s", msg)
			case fleetv1.PoolUpToDate:
				p.event("Normal", fleetv1.EventRolloutComplete, "%s", msg)
			}
		}
	}
}

func (p *planner) haltedCondition(set setCondition, halted bool, failed []string) {
	if u := p.unrolledBack(); halted && len(u) > 0 {
		set(fleetv1.PoolHalted, metav1.ConditionTrue, fleetv1.ReasonFailuresReached,
			fmt.Sprintf("node(s) failed their health gate and were not rolled back: %s; no new reboot grants whatever haltAfterFailures says. A RollbackFailed node is never rebooted again automatically: repair it by hand, uncordon it and delete its Lease; a node without a rollback deployment likewise", joinMax(u, 5)))
		return
	}
	if gated := p.haltedGates(); halted && len(gated) > 0 {
		set(fleetv1.PoolHalted, metav1.ConditionTrue, fleetv1.ReasonFailuresReached,
			fmt.Sprintf("%d node(s) failed on the target image (%s), haltAfterFailures is %d: no new reboot grants. %s failed the health gate with onFailure Halt: each stays cordoned on the image and holds its reboot slot; roll it back (bootc rollback, then reboot) or repair it by hand, then uncordon it and delete its slot Lease in %s",
				len(failed), joinMax(failed, 5), p.b.HaltAfterFailures, joinMax(gated, 5), lease.Namespace))
		return
	}
	if halted {
		set(fleetv1.PoolHalted, metav1.ConditionTrue, fleetv1.ReasonFailuresReached,
			fmt.Sprintf("%d node(s) failed on the target image (%s), haltAfterFailures is %d: no new reboot grants. Repair those nodes (each slot is released once its node is back on the image; a node whose signature policy rejected the image recovers with a new image or a policy that accepts it), delete Nodes that are gone, or raise haltAfterFailures",
				len(failed), joinMax(failed, 5), p.b.HaltAfterFailures))
		return
	}
	set(fleetv1.PoolHalted, metav1.ConditionFalse, fleetv1.ReasonNotHalted,
		fmt.Sprintf("%d of %d allowed failure(s)", len(failed), p.b.HaltAfterFailures))
}

func (p *planner) degradedCondition(set setCondition, c nodeCounts) {
	switch {
	case p.in.ResolveError != "":
		set(fleetv1.PoolDegraded, metav1.ConditionTrue, fleetv1.ReasonResolveFailed,
			fmt.Sprintf("cannot resolve spec.image %s: %s; no new grants until it resolves (check the registry, the tag, and --insecure-registry)", p.in.Pool.Spec.Image, p.in.ResolveError))
	case p.quarantined():
		q := p.quarantine
		set(fleetv1.PoolDegraded, metav1.ConditionTrue, fleetv1.ReasonImageFailedHealthCheck,
			text.Truncate(fmt.Sprintf("%s is quarantined: node %s failed on it (%s: %s); no node stages or reboots into it until spec.image names another image (see status.quarantine)",
				q.Digest, q.Node, q.Reason, orUnknown(q.Message)), 1024))
	case len(c.conflicts) > 0:
		set(fleetv1.PoolDegraded, metav1.ConditionTrue, fleetv1.ReasonNodeConflict,
			fmt.Sprintf("node(s) not managed: %s; make the pools' nodeSelectors disjoint, or rename the nodes", joinMax(c.conflicts, 5)))
	case len(p.drainMsgs) > 0:
		sort.Strings(p.drainMsgs)
		set(fleetv1.PoolDegraded, metav1.ConditionTrue, fleetv1.ReasonDrainFailed,
			fmt.Sprintf("drain blocked: %s; the drain is retried and the node does not reboot until it drains (check the PodDisruptionBudget or pod named)", joinMax(p.drainMsgs, 3)))
	case len(c.failed)+len(c.degraded) > 0:
		set(fleetv1.PoolDegraded, metav1.ConditionTrue, fleetv1.ReasonNodesDegraded,
			fmt.Sprintf("node(s) need attention: %s; see `kubectl get bootcnode <name> -o yaml` (status.reason, status.message; for a Platform* reason the annotation %s and the pool's condition %s)",
				joinMax(append(c.failed, c.degraded...), 5), fleetv1.AnnotationNoPlatformImage, fleetv1.PoolPlatformImages))
	default:
		set(fleetv1.PoolDegraded, metav1.ConditionFalse, fleetv1.ReasonAsExpected, "no node needs attention")
	}
}

// progressConditions sets UpToDate and Progressing.
func (p *planner) progressConditions(set setCondition, st *fleetv1.BootcNodePoolStatus, notUpdated []string, halted bool, held []string) {
	switch {
	case st.Nodes == 0:
		set(fleetv1.PoolUpToDate, metav1.ConditionFalse, fleetv1.ReasonNoNodes, "no Node matches spec.nodeSelector")
		set(fleetv1.PoolProgressing, metav1.ConditionFalse, fleetv1.ReasonNoNodes, "no Node matches spec.nodeSelector")
		return
	case p.target.Digest == "":
		set(fleetv1.PoolUpToDate, metav1.ConditionFalse, fleetv1.ReasonResolveFailed, "the target image has not been resolved yet")
		set(fleetv1.PoolProgressing, metav1.ConditionFalse, fleetv1.ReasonResolveFailed, "waiting for spec.image to resolve to a digest")
		return
	case len(notUpdated) == 0:
		set(fleetv1.PoolUpToDate, metav1.ConditionTrue, fleetv1.ReasonAllUpdated, fmt.Sprintf("all %d node(s) run %s", st.Nodes, p.targetText()))
		set(fleetv1.PoolProgressing, metav1.ConditionFalse, fleetv1.ReasonAllUpdated, fmt.Sprintf("all %d node(s) run %s", st.Nodes, p.targetText()))
		return
	}
	msg := fmt.Sprintf("%d of %d node(s) run %s; waiting: %s", st.Updated, st.Nodes, p.targetText(), joinMax(notUpdated, 5))
	set(fleetv1.PoolUpToDate, metav1.ConditionFalse, fleetv1.ReasonRollingOut, msg)
	switch {
	case p.quarantined():
		set(fleetv1.PoolProgressing, metav1.ConditionFalse, fleetv1.ReasonImageFailedHealthCheck,
			fmt.Sprintf("%s is quarantined (see the Degraded condition): no new grants; set spec.image to another image", p.quarantine.Digest))
	case p.b.Paused:
		set(fleetv1.PoolProgressing, metav1.ConditionFalse, fleetv1.ReasonPaused, "spec.rollout.paused is true: no new grants; set it to false to continue")
	case p.in.ResolveError != "":
		set(fleetv1.PoolProgressing, metav1.ConditionFalse, fleetv1.ReasonResolveFailed, "no new grants while spec.image does not resolve")
	case halted:
		set(fleetv1.PoolProgressing, metav1.ConditionFalse, fleetv1.ReasonFailuresReached, "halted: no new reboot grants (see the Halted condition)")
	default:
		m := fmt.Sprintf("%s; %d staging, %d staged, %d rebooting (maxUnavailable %d, maxStaging %d)", msg, st.Staging, st.Staged, st.Rebooting, p.b.MaxUnavailable, p.b.MaxStaging)
		if pm := p.pacingMessage(held); pm != "" {
			m += "; " + pm
		}
		if mm := p.metricsMessage(); mm != "" {
			m += "; " + mm
		}
		set(fleetv1.PoolProgressing, metav1.ConditionTrue, fleetv1.ReasonRollingOut, m)
	}
}

// metricsMessage says what the pool's metrics query holds back, for
// Progressing; "" if nothing.
func (p *planner) metricsMessage() string {
	if p.in.MetricsError != "" {
		return text.Truncate("the metrics query failed ("+fleetv1.ReasonMetricsQueryFailed+": "+p.in.MetricsError+"): no new reboot grants", 300)
	}
	var blocked []string
	for _, name := range p.members {
		if p.in.MetricsBlocked[name] != "" {
			blocked = append(blocked, name)
		}
	}
	if len(blocked) == 0 {
		return ""
	}
	return fmt.Sprintf("the metrics query returns series for %s: no reboot grant for them", joinMax(blocked, 5))
}

func (p *planner) agentsCondition(set setCondition, quiet, refusing []string) {
	switch {
	case len(refusing) > 0:
		set(fleetv1.PoolAgentsReporting, metav1.ConditionFalse, fleetv1.ReasonAgentRequestsRefused,
			fmt.Sprintf("the API server refuses requests of the agent on %d node(s): %s; check the agent's RBAC and admission policies (packaging/rbac, packaging/policy)", len(refusing), joinMax(refusing, 3)))
	case len(p.staging.lapsed) > 0:
		names := p.staging.lapsedNames()
		set(fleetv1.PoolAgentsReporting, metav1.ConditionFalse, fleetv1.ReasonStagingWithoutGrant,
			fmt.Sprintf("%d node(s) hold staging capacity without a grant: they have reported phase Staging without a stage slot for longer than stageTimeout %s plus a lease duration (%s): %s; they no longer count against maxStaging and get no stage slot while they report so; check `journalctl -u bootc-fleet-agent` and the agent's version on them",
				len(names), p.b.StageTimeout, p.in.LeaseDuration, joinMax(names, 5)))
	case len(quiet) > 0 || len(p.goneHolders) > 0:
		for _, name := range p.goneHolders {
			quiet = append(quiet, fmt.Sprintf("%s (Node deleted while rebooting; its reboot slot stays held until it is back or rebootTimeout passed)", name))
		}
		set(fleetv1.PoolAgentsReporting, metav1.ConditionFalse, fleetv1.ReasonAgentsQuiet,
			fmt.Sprintf("%d node(s) with rollout work have not reported for over %s: %s; check `systemctl status bootc-fleet-agent` and its journal on them", len(quiet), p.in.QuietAfter, joinMax(quiet, 5)))
	default:
		set(fleetv1.PoolAgentsReporting, metav1.ConditionTrue, fleetv1.ReasonAgentsReporting, "every node with rollout work reports")
	}
}

func rebooting(ss []*Slot) bool {
	for _, s := range ss {
		if s.Phase.afterDrain() {
			return true
		}
	}
	return false
}

// quietAgents names the pool's nodes with rollout work (a slot held, or a
// desired image not booted yet; not a node down in its reboot) whose agent's
// reports have not changed for
// QuietAfter, as the coordinator saw them, and the nodes whose agent says
// the API server refuses its requests.
func (p *planner) quietAgents(holds map[string][]*Slot) (quiet, refusing []string) {
	for _, name := range p.members {
		n := p.nodes[name]
		bn := p.bns[name]
		if p.conflicted(n) || bn == nil || bn.Spec.Pool != p.pool {
			continue
		}
		if c := meta.FindStatusCondition(bn.Status.Conditions, fleetv1.ConditionAPIAccess); c != nil && c.Status == metav1.ConditionFalse {
			refusing = append(refusing, fmt.Sprintf("%s (%s)", name, text.Truncate(c.Message, 200)))
		}
		st := p.fresh(n)
		work := len(holds[name]) > 0 || (bn.Spec.DesiredImage != "" && (st == nil || st.Booted == nil ||
			bn.Spec.DesiredImage != st.Booted.Image && !strings.HasSuffix(bn.Spec.DesiredImage, "@"+st.Booted.Digest)))
		if rebooting(holds[name]) {
			continue // down in its reboot, silent by design; rebootTimeout judges it
		}
		hb := p.in.Heartbeats[name]
		since := hb.Seen
		if hb.SpecSeen.After(since) {
			since = hb.SpecSeen
		}
		if !work || p.in.QuietAfter <= 0 || since.IsZero() {
			continue
		}
		if at := since.Add(p.in.QuietAfter); p.in.Now.Before(at) {
			p.requeueAt(at)
			continue
		}
		what := "reported"
		if bn.Status.LastReportTime == nil {
			what = "never reported"
		}
		// A fixed time, not an age: the status must not change every reconcile.
		quiet = append(quiet, fmt.Sprintf("%s (%s; nothing new since %s)", name, what, since.UTC().Format(time.RFC3339)))
	}
	return quiet, refusing
}

func conflictText(n Node) string {
	if len(n.OtherPools) > 0 {
		return fmt.Sprintf("%s (also matched by pool %s)", n.Name, joinMax(n.OtherPools, 3))
	}
	return fmt.Sprintf("%s (name is not a valid label value)", n.Name)
}

func orUnknown(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}
