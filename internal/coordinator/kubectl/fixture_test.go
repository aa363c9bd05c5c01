package kubectl

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// now is the fixed clock of every golden test: a Tuesday, 12:00 UTC.
var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

const (
	repo  = "registry.example/os"
	oldDg = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	newDg = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

func bootID(i int) string { return fmt.Sprintf("%08x-0000-4000-8000-000000000000", i) }

// fixture is the world the golden tests read: pool web mid-rollout
// (maxUnavailable 2, maxStaging 1) and pool db, paused and halted, outside
// its maintenance window.
type fixture struct {
	t *testing.T
	c client.Client
}

type nodeSpec struct {
	name, pool    string
	ready, cordon bool
	hold          *string
	booted        string // digest
	staged        string // digest, download-only
	phase         fleetv1.NodePhase
	agentReason   string
	message       string
	state, reason string // rollout annotations
}

func seed(t *testing.T, c client.Client) {
	f := &fixture{t: t, c: c}
	target := repo + "@" + newDg
	f.pool("web", "web", 10, 1, 1, false, nil, []metav1.Condition{
		cond(fleetv1.PoolProgressing, metav1.ConditionTrue, fleetv1.ReasonRollingOut, "rolling out"),
		cond(fleetv1.PoolNodeSelectorRestricted, metav1.ConditionFalse, fleetv1.ReasonSelfSettableLabels, "spec.nodeSelector keys on role, which a kubelet may set on its own Node"),
		cond(fleetv1.PoolAgentsReporting, metav1.ConditionFalse, fleetv1.ReasonStagingWithoutGrant, "1 node(s) hold staging capacity without a grant: node-j"),
	})
	f.pool("db", "db", 2, 0, 0, true, []fleetv1.MaintenanceWindow{{Days: []fleetv1.Weekday{"Saturday"}, Start: "02:00", Duration: metav1.Duration{Duration: 4 * time.Hour}, TimeZone: "Europe/Berlin"}},
		[]metav1.Condition{
			cond(fleetv1.PoolHalted, metav1.ConditionTrue, fleetv1.ReasonFailuresReached, "1 failure(s) reached haltAfterFailures 1: db-1 (RebootTimeout)"),
			cond(fleetv1.PoolDegraded, metav1.ConditionTrue, fleetv1.ReasonNodesDegraded, "db-1 (RebootTimeout)"),
		})
	f.pool("empty", "none", 0, 0, 0, false, nil, nil)
	// app: the coordinator's notes are a moment older than its slots.
	f.pool("app", "app", 5, 1, 0, false, nil, []metav1.Condition{
		cond(fleetv1.PoolUpToDate, metav1.ConditionFalse, fleetv1.ReasonRollingOut, "1 of 5 node(s) run "+target+"; waiting: app-1, app-2, app-4, app-5"),
	})
	// done: every node on the target, the status of the current generation.
	f.pool("done", "done", 2, 2, 0, false, nil, nil)
	f.upToDate("done", "all 2 node(s) run "+target)

	drainMsg := "drain blocked, retrying: drain of node-a timed out after 10m0s: pod shop/web-1 blocked by PodDisruptionBudget shop/web"
	waitMsg := "staged; waiting for a reboot slot: maxUnavailable 2, counting nodes rebooting and those NotReady or cordoned by others"
	held := "disk replacement"
	for i, n := range []nodeSpec{
		{name: "node-a", pool: "web", ready: true, cordon: true, booted: oldDg, staged: newDg, phase: fleetv1.PhaseStaged, state: fleetv1.RolloutDraining, reason: drainMsg},
		{name: "node-b", pool: "web", ready: true, booted: newDg, phase: fleetv1.PhaseIdle, state: fleetv1.RolloutUpdated, reason: "runs " + repo + "@sha256:222222222222…"},
		{name: "node-c", pool: "web", ready: false, cordon: true, booted: oldDg, staged: newDg, phase: fleetv1.PhaseRebooting, state: fleetv1.RolloutRebooting, reason: "rebooting into " + repo + "@sha256:222222222222… under reboot slot web-reboot-1"},
		{name: "node-d", pool: "web", ready: true, booted: oldDg, staged: newDg, phase: fleetv1.PhaseStaged, state: fleetv1.RolloutWaitingForRebootSlot, reason: waitMsg},
		// Cordoned by someone else: the coordinator offers it a slot first.
		{name: "node-e", pool: "web", ready: true, cordon: true, booted: oldDg, staged: newDg, phase: fleetv1.PhaseStaged, state: fleetv1.RolloutWaitingForRebootSlot, reason: waitMsg},
		{name: "node-f", pool: "web", ready: true, booted: oldDg, phase: fleetv1.PhaseWaiting, agentReason: fleetv1.ReasonStageFailed, message: "error: Switching: pull timed out", state: fleetv1.RolloutWaitingForStageSlot, reason: "its last stage failed; it waits behind the other nodes for a stage slot: error: Switching: pull timed out"},
		{name: "node-g", pool: "web", ready: true, booted: oldDg, phase: fleetv1.PhaseStaging, state: fleetv1.RolloutStaging, reason: "downloading and staging " + repo + "@sha256:222222222222… under stage slot web-stage-0"},
		{name: "node-h", pool: "web", ready: true, hold: &held, booted: oldDg, phase: fleetv1.PhaseWaiting, state: fleetv1.RolloutHeld, reason: "held out of the rollout by the Node annotation fleet.bootc.dev/hold (disk replacement); remove it to let the node update"},
		{name: "node-i", pool: "web", ready: true, booted: oldDg, phase: fleetv1.PhaseWaiting, state: fleetv1.RolloutWaitingForStageSlot, reason: "waiting for a stage slot: maxStaging 1"},
		{name: "db-1", pool: "db", ready: false, booted: oldDg, phase: fleetv1.PhaseRebooting, state: fleetv1.RolloutFailed, reason: "did not come back Ready on " + repo + "@sha256:222222222222… in a new boot within rebootTimeout (15m0s); reboot slot db-reboot-0 stays held until it does, or the Node is deleted"},
		// Reports Staging without holding a stage slot (amendment 20).
		{name: "node-j", pool: "web", ready: true, booted: oldDg, phase: fleetv1.PhaseStaging, state: fleetv1.RolloutStaging, reason: "its agent reports Staging without a stage grant"},
		// Just got its reboot slot: the note still says it waits for one.
		{name: "app-1", pool: "app", ready: true, cordon: true, booted: oldDg, staged: newDg, phase: fleetv1.PhaseStaged, state: fleetv1.RolloutWaitingForRebootSlot, reason: waitMsg},
		{name: "app-2", pool: "app", ready: true, booted: oldDg, staged: newDg, phase: fleetv1.PhaseStaged, state: fleetv1.RolloutWaitingForRebootSlot, reason: waitMsg},
		// Back on the target, its slot just released: the note still says Rebooting.
		{name: "app-3", pool: "app", ready: true, booted: newDg, phase: fleetv1.PhaseIdle, agentReason: fleetv1.ReasonUpToDate, state: fleetv1.RolloutRebooting, reason: "rebooting into " + repo + "@sha256:222222222222… under reboot slot app-reboot-1"},
		// Staged, its stage slot just released: the note still says Staging.
		{name: "app-4", pool: "app", ready: true, booted: oldDg, staged: newDg, phase: fleetv1.PhaseStaged, state: fleetv1.RolloutStaging, reason: "downloading and staging " + repo + "@sha256:222222222222… under stage slot app-stage-0"},
		// Its stage failed and its stage slot was released: the note still says Staging.
		{name: "app-5", pool: "app", ready: true, booted: oldDg, phase: fleetv1.PhaseWaiting, agentReason: fleetv1.ReasonStageFailed, message: "error: Switching: pull timed out", state: fleetv1.RolloutStaging, reason: "downloading and staging " + repo + "@sha256:222222222222… under stage slot app-stage-0"},
		{name: "done-1", pool: "done", ready: true, booted: newDg, phase: fleetv1.PhaseIdle, agentReason: fleetv1.ReasonUpToDate, state: fleetv1.RolloutUpdated, reason: "runs " + repo + "@sha256:222222222222…"},
		{name: "done-2", pool: "done", ready: true, booted: newDg, phase: fleetv1.PhaseIdle, agentReason: fleetv1.ReasonUpToDate, state: fleetv1.RolloutUpdated, reason: "runs " + repo + "@sha256:222222222222…"},
	} {
		f.node(i, n, target)
	}
	// A Node web selects that the coordinator has no BootcNode for yet.
	joined := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-new", Labels: map[string]string{"role": "web"}}}
	f.create(joined)
	joined.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Fixture"}}
	f.status(joined)
	// A Node no pool selects.
	f.create(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "plain", Labels: map[string]string{"role": "other"}}})

	img, err := imageref.ParsePinned(target)
	if err != nil {
		t.Fatal(err)
	}
	f.slot("web", lease.KindReboot, 0, "node-a", 0, img, now.Add(-12*time.Second), time.Time{})
	f.slot("web", lease.KindReboot, 1, "node-c", 2, img, now.Add(-5*time.Minute), now.Add(-100*time.Second))
	f.slot("web", lease.KindStage, 0, "node-g", 6, img, now.Add(-30*time.Second), time.Time{})
	f.slot("db", lease.KindReboot, 0, "db-1", 9, img, now.Add(-2*time.Hour), now.Add(-100*time.Minute), "RebootTimeout")
	f.slot("db", lease.KindStage, 0, "", 0, img, time.Time{}, time.Time{})
	f.slot("app", lease.KindReboot, 0, "app-1", 11, img, now.Add(-time.Second), time.Time{})
	f.slot("app", lease.KindReboot, 1, "", 0, img, time.Time{}, time.Time{})
	f.slot("app", lease.KindStage, 0, "", 0, img, time.Time{}, time.Time{})

	// node-a's drain: pod shop/web-1 under PDB shop/web (no disruption
	// allowed). shop/other allows none either but selects no pod on the
	// node; shop/lenient selects it but allows one.
	f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	for _, p := range []struct{ name, node, app string }{{"web-1", "node-a", "web"}, {"web-2", "node-b", "web"}, {"cache-1", "node-a", "cache"}} {
		f.create(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "shop", Labels: map[string]string{"app": p.app}},
			Spec: corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}}}})
	}
	for _, b := range []struct {
		name, app string
		allowed   int32
	}{{"web", "web", 0}, {"other", "other", 0}, {"lenient", "web", 1}} {
		pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: b.name, Namespace: "shop"},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": b.app}}}}
		f.create(pdb)
		// No disruption controller runs here: the status is written as it would.
		pdb.Status = policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: b.allowed, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1, ObservedGeneration: pdb.Generation}
		f.status(pdb)
	}

	// Events: 11 about node-a's BootcNode (events.k8s.io/v1, as the
	// coordinator writes them), one about its Node (core/v1, as a kubelet
	// writes them), one about another node. explain shows the newest 10.
	for i := 0; i < 11; i++ {
		f.create(&eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-a.%02d", i), Namespace: "default"},
			EventTime:  metav1.NewMicroTime(now.Add(time.Duration(i-20) * time.Minute)),
			Regarding:  corev1.ObjectReference{APIVersion: fleetv1.GroupVersion.String(), Kind: "BootcNode", Name: "node-a"},
			Related:    &corev1.ObjectReference{APIVersion: fleetv1.GroupVersion.String(), Kind: "BootcNodePool", Name: "web"},
			Type:       corev1.EventTypeNormal, Reason: "Step", Action: "Reconcile", Note: fmt.Sprintf("step %d of the rollout", i),
			ReportingController: "bootc-fleet-coordinator", ReportingInstance: "bootc-fleet-coordinator-0",
		})
	}
	f.create(&eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a.drain", Namespace: "default"},
		EventTime:  metav1.NewMicroTime(now.Add(-90 * time.Second)),
		Series:     &eventsv1.EventSeries{Count: 3, LastObservedTime: metav1.NewMicroTime(now.Add(-30 * time.Second))},
		Regarding:  corev1.ObjectReference{APIVersion: fleetv1.GroupVersion.String(), Kind: "BootcNode", Name: "node-a"},
		Type:       corev1.EventTypeWarning, Reason: "DrainFailed", Action: "Reconcile",
		Note:                "drain of node node-a did not finish within 10m0s (attempt 3): pod shop/web-1 blocked by PodDisruptionBudget shop/web",
		ReportingController: "bootc-fleet-coordinator", ReportingInstance: "bootc-fleet-coordinator-0",
	})
	f.create(&corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "node-a.kubelet", Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "node-a", UID: "node-a"},
		Type:           corev1.EventTypeNormal, Reason: "NodeNotSchedulable", Message: "Node node-a status is now: NodeNotSchedulable",
		Source:         corev1.EventSource{Component: "kubelet", Host: "node-a"},
		FirstTimestamp: metav1.NewTime(now.Add(-11 * time.Second)), LastTimestamp: metav1.NewTime(now.Add(-11 * time.Second)), Count: 1,
	})
	// One Event recorded on both the BootcNode and the Node: shown once.
	for _, kind := range []string{"BootcNode", "Node"} {
		f.create(&eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: "node-a.granted." + strings.ToLower(kind), Namespace: "default"},
			EventTime:  metav1.NewMicroTime(now.Add(-12 * time.Second)),
			Regarding:  corev1.ObjectReference{Kind: kind, Name: "node-a"},
			Type:       corev1.EventTypeNormal, Reason: "RebootGranted", Action: "Reconcile",
			Note:                "granted reboot slot web-reboot-0 to node node-a for " + target + ": cordon and drain, then reboot",
			ReportingController: "bootc-fleet-coordinator", ReportingInstance: "bootc-fleet-coordinator-0",
		})
	}
	f.create(&corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "node-b.kubelet", Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "node-b", UID: "node-b"},
		Type:           corev1.EventTypeNormal, Reason: "Rebooted", Message: "not about node-a",
		FirstTimestamp: metav1.NewTime(now.Add(-time.Second)), LastTimestamp: metav1.NewTime(now.Add(-time.Second)), Count: 1,
	})
}

func cond(t string, s metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(now.Add(-time.Hour))}
}

func (f *fixture) create(o client.Object) {
	f.t.Helper()
	if err := f.c.Create(context.Background(), o); err != nil {
		f.t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
	}
}

func (f *fixture) status(o client.Object) {
	f.t.Helper()
	if err := f.c.Status().Update(context.Background(), o); err != nil {
		f.t.Fatalf("status of %T %s: %v", o, o.GetName(), err)
	}
}

func (f *fixture) pool(name, role string, nodes, updated, held int32, paused bool, windows []fleetv1.MaintenanceWindow, conds []metav1.Condition) {
	p := &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: fleetv1.BootcNodePoolSpec{
		NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": role}},
		Image:        repo + ":v2",
		Rollout: fleetv1.RolloutSpec{MaxUnavailable: ptr.To(intstr.FromInt32(2)), MaxStaging: ptr.To(intstr.FromInt32(1)),
			Paused: paused, Windows: windows},
	}}
	f.create(p)
	// As the coordinator writes it: of the generation it looked at.
	for i := range conds {
		conds[i].ObservedGeneration = p.Generation
	}
	p.Status = fleetv1.BootcNodePoolStatus{ObservedGeneration: p.Generation, Nodes: nodes, Updated: updated, Held: held, Conditions: conds}
	if nodes > 0 {
		p.Status.TargetImage = repo + "@" + newDg
	}
	f.status(p)
}

// upToDate gives pool name's status the current generation and UpToDate
// True, as the coordinator writes it once every node runs the target.
func (f *fixture) upToDate(name, msg string) {
	f.t.Helper()
	p := &fleetv1.BootcNodePool{}
	if err := f.c.Get(context.Background(), client.ObjectKey{Name: name}, p); err != nil {
		f.t.Fatal(err)
	}
	p.Status.ObservedGeneration = p.Generation
	for _, c := range []metav1.Condition{
		cond(fleetv1.PoolUpToDate, metav1.ConditionTrue, fleetv1.ReasonAllUpdated, msg),
		cond(fleetv1.PoolHalted, metav1.ConditionFalse, fleetv1.ReasonNotHalted, "0 of 1 allowed failure(s)"),
	} {
		c.ObservedGeneration = p.Generation
		p.Status.Conditions = append(p.Status.Conditions, c)
	}
	f.status(p)
}

func (f *fixture) node(i int, n nodeSpec, target string) {
	f.t.Helper()
	kn := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{"role": n.pool}}, Spec: corev1.NodeSpec{Unschedulable: n.cordon}}
	if n.hold != nil {
		kn.Annotations = map[string]string{fleetv1.AnnotationHold: *n.hold}
	}
	f.create(kn)
	ready := corev1.ConditionFalse
	if n.ready {
		ready = corev1.ConditionTrue
	}
	kn.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, Reason: "Fixture"}}
	kn.Status.NodeInfo.BootID = bootID(i)
	f.status(kn)

	bn := &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: fleetv1.BootcNodeSpec{Pool: n.pool, DesiredImage: target}}
	bn.SetRollout(n.state, n.reason)
	f.create(bn)
	dep := func(dg string, downloadOnly bool) *fleetv1.Deployment {
		v := map[string]string{oldDg: "41.20261101", newDg: "41.20261130"}[dg]
		return &fleetv1.Deployment{Image: repo + ":v2", Digest: dg, Version: v, Signature: fleetv1.SignatureContainerPolicy, DownloadOnly: downloadOnly}
	}
	bn.Status = fleetv1.BootcNodeStatus{BootID: bootID(i), Phase: n.phase, Reason: n.agentReason, Message: n.message, AgentVersion: "v0.9.0",
		Booted: dep(n.booted, false), LastReportTime: ptr.To(metav1.NewMicroTime(now.Add(-4 * time.Second)))}
	if n.staged != "" {
		bn.Status.Staged = dep(n.staged, true)
	}
	f.status(bn)
}

// slot writes a slot Lease as the coordinator does: a free slot, granted
// at acquired, advanced to phase Reboot at rebootAt (unless zero), marked
// failed with failure (if given).
func (f *fixture) slot(pool string, kind lease.Kind, idx int, holder string, boot int, img imageref.Pinned, acquired, rebootAt time.Time, failure ...string) {
	f.t.Helper()
	ref := plan.SlotRef{Name: lease.SlotName(pool, kind, idx), Kind: kind, Index: idx}
	l := plan.NewSlotLease(pool, ref)
	if holder != "" {
		plan.ApplyToLease(l, plan.SlotChange{Op: plan.OpGrant, Kind: kind, Node: holder, Image: img, BootID: bootID(boot)}, acquired, 20*time.Second)
		if kind == lease.KindReboot {
			plan.ApplyToLease(l, plan.SlotChange{Op: plan.OpCordon, Kind: kind, CordonedByUs: true}, acquired, 20*time.Second)
		}
		if !rebootAt.IsZero() {
			plan.ApplyToLease(l, plan.SlotChange{Op: plan.OpAdvance, Kind: kind}, rebootAt, 20*time.Second)
		}
		for _, fl := range failure {
			plan.ApplyToLease(l, plan.SlotChange{Op: plan.OpMarkFailed, Kind: kind, Failure: fl}, rebootAt, 20*time.Second)
		}
	}
	f.create(l)
}
