package kubectl

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// queueWorld is a pool as the real planner sees it, to check that the
// queue the plugin shows is the order the planner grants in.
type queueWorld struct {
	t     *testing.T
	pool  *fleetv1.BootcNodePool
	img   imageref.Pinned
	nodes []plan.Node
	bns   map[string]*fleetv1.BootcNode
	slot  plan.Slot // the pool's one slot of the kind under test
}

func newQueueWorld(t *testing.T, kind lease.Kind, names []string) *queueWorld {
	img, err := imageref.ParsePinned(repo + "@" + newDg)
	if err != nil {
		t.Fatal(err)
	}
	w := &queueWorld{t: t, img: img, bns: map[string]*fleetv1.BootcNode{},
		pool: &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: fleetv1.BootcNodePoolSpec{
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": "p"}}, Image: repo + ":v2",
			Rollout: fleetv1.RolloutSpec{MaxUnavailable: ptr.To(intstr.FromInt32(1)), MaxStaging: ptr.To(intstr.FromInt32(1))}}}}
	for i, name := range names {
		w.nodes = append(w.nodes, plan.Node{Name: name, InPool: true, Ready: true, BootID: bootID(i)})
		bn := &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: fleetv1.BootcNodeSpec{Pool: "p", DesiredImage: img.String(), RebootPolicy: fleetv1.RebootPolicyReboot},
			Status: fleetv1.BootcNodeStatus{BootID: bootID(i), Phase: fleetv1.PhaseWaiting, Booted: &fleetv1.Deployment{Image: repo + ":v2", Digest: oldDg}}}
		if kind == lease.KindReboot {
			bn.Status.Phase, bn.Status.Staged = fleetv1.PhaseStaged, &fleetv1.Deployment{Image: repo + ":v2", Digest: newDg, DownloadOnly: true}
		}
		w.bns[name] = bn
	}
	w.slot = plan.Slot{Name: lease.SlotName("p", kind, 0), Kind: kind, Index: 0}
	return w
}

func (w *queueWorld) node(name string) *plan.Node {
	for i := range w.nodes {
		if w.nodes[i].Name == name {
			return &w.nodes[i]
		}
	}
	w.t.Fatalf("no node %s", name)
	return nil
}

// give hands the slot to holder, as a grant the planner keeps (a reboot
// in phase Reboot, a fresh stage grant).
func (w *queueWorld) give(holder string) {
	n := w.node(holder)
	g := lease.Grant{ID: lease.ID{Lease: w.slot.Name, UID: "u", Transitions: 1}, Pool: "p", Kind: w.slot.Kind, Holder: holder, Image: w.img,
		BootID: n.BootID, Acquired: now, Renewed: now, Duration: time.Minute}
	if w.slot.Kind == lease.KindReboot {
		g.Phase = lease.PhaseReboot
	}
	w.slot.State, w.slot.Holder, w.slot.Grant = plan.SlotHeld, holder, g
}

// finish: the holder got what its grant was for, and the slot is free.
func (w *queueWorld) finish() {
	st := &w.bns[w.slot.Holder].Status
	if w.slot.Kind == lease.KindReboot {
		st.Phase, st.Booted, st.Staged = fleetv1.PhaseIdle, st.Staged, nil
		st.Booted.DownloadOnly = false
		w.node(w.slot.Holder).Unschedulable = false // whoever cordoned it is done too
	} else {
		st.Phase, st.Reason, st.Staged = fleetv1.PhaseStaged, "", &fleetv1.Deployment{Image: repo + ":v2", Digest: newDg, DownloadOnly: true}
	}
	w.slot = plan.Slot{Name: w.slot.Name, Kind: w.slot.Kind, Index: 0, State: plan.SlotFree}
}

// plan runs the planner, writes its rollout annotations on the BootcNodes
// and returns whom it granted the slot to ("" for nobody).
func (w *queueWorld) plan() string {
	in := plan.Input{Pool: w.pool, Target: w.img, Nodes: w.nodes, Slots: []plan.Slot{w.slot}, Now: now, LeaseDuration: time.Minute}
	for _, name := range w.names() {
		in.BootcNodes = append(in.BootcNodes, *w.bns[name])
	}
	out := plan.Plan(in)
	w.pool.Status = out.Status // the canaries, as the coordinator writes them
	for _, c := range append(out.CreateBootcNodes, out.UpdateBootcNodes...) {
		w.bns[c.Name].SetRollout(c.RolloutState, c.RolloutReason)
	}
	for _, c := range out.Changes {
		if c.Op == plan.OpGrant && c.Kind == w.slot.Kind {
			return c.Node
		}
	}
	return ""
}

func (w *queueWorld) names() []string {
	var out []string
	for _, n := range w.nodes {
		out = append(out, n.Name)
	}
	slices.Sort(out)
	return out
}

// queue is what the plugin shows, from the objects the API server would hold.
func (w *queueWorld) queue() []string { return w.view().queue(w.slot.Kind) }

// view is the plugin's view of the pool, from the objects the API server
// would hold.
func (w *queueWorld) view() *poolView {
	v := &poolView{now: now, pool: w.pool, budget: plan.ResolveBudget(w.pool.Spec.Rollout, len(w.nodes)), slots: plan.WithPhases([]plan.Slot{w.slot}),
		members: w.names(), nodes: map[string]*corev1.Node{}, bns: w.bns}
	for _, n := range w.nodes {
		kn := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{}}, Spec: corev1.NodeSpec{Unschedulable: n.Unschedulable}}
		if n.Zone != "" {
			kn.Labels[fleetv1.LabelZone] = n.Zone
		}
		if n.Canary {
			kn.Labels[fleetv1.LabelCanary] = ""
		}
		ready := corev1.ConditionFalse
		if n.Ready {
			ready = corev1.ConditionTrue
		}
		kn.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}
		if n.Held {
			kn.Annotations = map[string]string{fleetv1.AnnotationHold: n.HoldReason}
		}
		v.nodes[n.Name] = kn
	}
	return v
}

// TestQueueIsGrantOrder: with the slot busy, the plugin's queue is read;
// then the slot is freed again and again, and the real planner must grant
// it to the nodes in exactly that order, and to nobody after them.
func TestQueueIsGrantOrder(t *testing.T) {
	names := []string{"n5", "n1", "n3", "n6", "n2", "n4", "blk"}
	for _, tc := range []struct {
		kind  lease.Kind
		setup func(w *queueWorld)
		want  []string
	}{
		// Cordoned by someone else first (they cost no extra budget); held
		// never. (With maxUnavailable 1 the two cordoned nodes would use
		// the whole budget: the planner would grant nothing.)
		{lease.KindReboot, func(w *queueWorld) {
			w.pool.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(2))
			w.node("n4").Unschedulable, w.node("n2").Unschedulable = true, true
			w.node("n3").Held = true
		}, []string{"n2", "n4", "n1", "n5", "n6"}},
		// Nodes whose last stage failed wait behind the others; held never.
		{lease.KindStage, func(w *queueWorld) {
			w.bns["n1"].Status.Reason, w.bns["n5"].Status.Reason = fleetv1.ReasonStageFailed, fleetv1.ReasonStageFailed
			w.node("n6").Held = true
		}, []string{"n2", "n3", "n4", "n1", "n5"}},
		// Zone by zone (zoneOrder Sequential, the default): the zone under
		// way first (blk's), then in name order, no zone last.
		{lease.KindReboot, func(w *queueWorld) {
			for _, z := range [][2]string{{"blk", "z1"}, {"n1", "z2"}, {"n2", "z1"}, {"n3", "z2"}, {"n4", "z1"}} {
				w.node(z[0]).Zone = z[1]
			}
		}, []string{"n2", "n4", "n1", "n3", "n5", "n6"}},
		// The canaries first: n5, labelled, goes alone; then the rest.
		{lease.KindReboot, func(w *queueWorld) {
			w.pool.Spec.Rollout.Canary = &fleetv1.CanarySpec{Nodes: ptr.To(intstr.FromInt32(1))}
			w.node("n5").Canary = true
			w.node("n3").Held = true
		}, []string{"n5", "n1", "n2", "n4", "n6"}},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			w := newQueueWorld(t, tc.kind, names)
			tc.setup(w)
			w.give("blk")
			if g := w.plan(); g != "" {
				t.Fatalf("granted %s with the slot held", g)
			}
			q := w.queue()
			if !slices.Equal(q, tc.want) {
				t.Fatalf("plugin queue %q, want %q", q, tc.want)
			}
			for i, want := range q {
				w.finish()
				got := w.plan()
				if got != want {
					t.Fatalf("grant %d went to %q; the plugin showed %q next (queue %q)", i, got, want, q)
				}
				w.give(got)
				// The rest of the queue stays in order as it moves up.
				if rest := w.queue(); !slices.Equal(rest, q[i+1:]) {
					t.Fatalf("after granting %s the plugin's queue is %q, want %q", got, rest, q[i+1:])
				}
			}
			w.finish()
			if got := w.plan(); got != "" {
				t.Fatalf("granted %s, who was not in the plugin's queue %q", got, q)
			}
		})
	}
}
