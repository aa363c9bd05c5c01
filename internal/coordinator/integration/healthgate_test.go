package integration

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// TestHealthGateHoldsTheSlotUntilPodsAreReady: a pool with a host and a
// workloads check keeps a node's reboot slot until the node reported a
// healthy host in its new boot and its DaemonSet pod is Ready; the next
// node gets no reboot grant before.
func TestHealthGateHoldsTheSlotUntilPodsAreReady(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "hg", 2, v0)
	pods := gateDaemonSetPods(t, ctx, "hg-ds", []string{"hg-n00", "hg-n01"})
	go reportHealthyHosts(ctx, f)
	f.run(ctx, 1)
	startCoordinator(t, "hg", nil)
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = v1.String()
		p.Spec.Health = &fleetv1.HealthSpec{
			Host:      &fleetv1.HostHealthCheck{},
			Workloads: &fleetv1.WorkloadHealthCheck{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "hg-ds"}}},
		}
	})
	var first, second string
	eventually(t, 120*time.Second, "a node back on v1", func() (bool, string) {
		for _, name := range []string{"hg-n00", "hg-n01"} {
			if f.node(name) != nil && f.bootedOn(name, v1) {
				first, second = name, map[string]string{"hg-n00": "hg-n01", "hg-n01": "hg-n00"}[name]
				return true, ""
			}
		}
		return false, "none yet"
	})
	// Its pod is not Ready: the slot stays held, the other node waits.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if !f.holdsReboot(ctx, first) {
			t.Fatalf("%s's reboot slot was released while its pod was not Ready", first)
		}
		if f.holdsReboot(ctx, second) {
			t.Fatalf("%s got a reboot grant while %s had not passed its gate", second, first)
		}
	}
	setReady(t, ctx, pods[first])
	eventually(t, 60*time.Second, first+"'s slot released once its pod is Ready", func() (bool, string) {
		return !f.holdsReboot(ctx, first), "still held"
	})
	setReady(t, ctx, pods[second])
	f.allOn(t, v1, 120*time.Second)
	cancel()
	f.assertBudgetHeld(t)
	f.assertRebootsEach(t, 1)
}

func (f *fleet) bootedOn(name string, img imageref.Pinned) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodes[name].booted == img
}

// holdsReboot: node holds a reboot grant.
func (f *fleet) holdsReboot(ctx context.Context, node string) bool {
	for _, g := range f.grants(ctx, node) {
		if g.Kind == lease.KindReboot {
			return true
		}
	}
	return false
}

// gateDaemonSetPods creates a DaemonSet (no controller runs it) and one pod
// of it, not Ready, on each node: a drain leaves DaemonSet pods in place.
func gateDaemonSetPods(t *testing.T, ctx context.Context, name string, nodes []string) map[string]*corev1.Pod {
	t.Helper()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": name}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: name}, Spec: appsv1.DaemonSetSpec{
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example/c:1"}}}},
	}}
	if err := env.Client.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}
	out := map[string]*corev1.Pod{}
	for _, node := range nodes {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: name + "-" + node, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: ptr.To(false), Containers: []corev1.Container{{Name: "c", Image: "registry.example/c:1"}}}}
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.Now()}}}
		if err := env.Client.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		out[node] = p
	}
	return out
}

func setReady(t *testing.T, ctx context.Context, p *corev1.Pod) {
	t.Helper()
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		t.Fatal(err)
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	if err := env.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
}

// reportHealthyHosts plays the agents' host report: a running systemd, read
// in the boot the kubelet reports, merged into each BootcNode's status.
func reportHealthyHosts(ctx context.Context, f *fleet) {
	for ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		for _, name := range []string{"hg-n00", "hg-n01"} {
			var node corev1.Node
			var bn fleetv1.BootcNode
			if env.Client.Get(ctx, client.ObjectKey{Name: name}, &node) != nil || env.Client.Get(ctx, client.ObjectKey{Name: name}, &bn) != nil {
				continue
			}
			boot := node.Status.NodeInfo.BootID
			if h := bn.Status.Host; h != nil && h.BootID == boot {
				continue
			}
			patch, _ := json.Marshal(map[string]any{"status": map[string]any{"host": fleetv1.HostHealth{BootID: boot, SystemState: fleetv1.SystemRunning}}})
			if err := env.Client.Status().Patch(ctx, &bn, client.RawPatch("application/merge-patch+json", patch)); err != nil && ctx.Err() == nil {
				f.t.Logf("host report %s: %v", name, err)
			}
		}
	}
}
