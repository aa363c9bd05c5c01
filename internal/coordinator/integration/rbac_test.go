package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// TestRolloutUnderPackagedRBAC runs the coordinator as its ServiceAccount
// with only packaging/rbac/coordinator.yaml granted, through a rollout that
// drains a pod and uses leader election: the packaged RBAC is enough.
func TestRolloutUnderPackagedRBAC(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	raw, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "packaging", "rbac", "coordinator.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := env.Client.Create(ctx, &u); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	// Its Node writes go through the packaged policy too.
	if err := envtest.Apply(ctx, env.Client, filepath.Join(envtest.RepoRoot(), "packaging/policy/coordinator-policy.yaml")); err != nil {
		t.Fatal(err)
	}
	cfg, err := env.AddUser("system:serviceaccount:bootc-fleet-system:bootc-fleet-coordinator", "system:serviceaccounts", "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}

	f := newFleet(t, "rbac", 3, v0)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app-0", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: "rbac-n01", AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
	}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	f.run(ctx, 1)
	c, err := controller.New(cfg, controller.Options{
		Name: "rbac", RequeueInterval: time.Second, LeaseDuration: time.Minute,
		LeaderElection: true, LeaderElectionID: "rbac-test-coordinator",
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("coordinator: %v", err)
		}
	}()
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = v1.String()
		p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(1))
	})
	f.allOn(t, v1, 180*time.Second)
	f.assertBudgetHeld(t)
	f.assertRebootsEach(t, 1)
	// Each Node tells its own story (kubectl describe node), written under
	// the packaged RBAC.
	for _, node := range []string{"rbac-n00", "rbac-n01", "rbac-n02"} {
		eventually(t, 30*time.Second, "Events on Node "+node, func() (bool, string) {
			got := nodeEvents(t, node)
			var pe []string
			var evs eventsv1.EventList
			_ = env.Client.List(context.Background(), &evs)
			for _, e := range evs.Items {
				if e.Regarding.Name == "rbac" || e.Regarding.Name == node {
					pe = append(pe, e.Regarding.Kind+"/"+e.Reason+":"+e.Note)
				}
			}
			onBN := objectEvents(t, "BootcNode", node)
			// A node's routine update is one Event, on its Node, once it
			// is done; its steps are not Events of their own (amendment 29).
			steps := got[fleetv1.EventStaged] + got[fleetv1.EventRebootGranted] + got[fleetv1.EventDrained] + got[fleetv1.EventNodeBack] +
				onBN[fleetv1.EventStaged] + onBN[fleetv1.EventRebootGranted] + onBN[fleetv1.EventDrained] + onBN[fleetv1.EventNodeBack]
			return got[fleetv1.EventNodeUpdated] == 1 && onBN[fleetv1.EventNodeUpdated] == 0 && steps == 0,
				fmt.Sprint(got, onBN, pe)
		})
	}
	var left corev1.Pod
	if err := env.Client.Get(ctx, clientKey("default", "app-0"), &left); !apierrors.IsNotFound(err) {
		t.Fatalf("pod on the drained node still there: %v", err)
	}
}

// nodeEvents counts the Events about Node name by reason.
func nodeEvents(t *testing.T, name string) map[string]int {
	t.Helper()
	return objectEvents(t, "Node", name)
}

// objectEvents counts the Events about the object kind/name by reason.
func objectEvents(t *testing.T, kind, name string) map[string]int {
	t.Helper()
	var evs eventsv1.EventList
	if err := env.Client.List(context.Background(), &evs); err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range evs.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Regarding.UID != "" {
			out[e.Reason]++
		}
	}
	return out
}
