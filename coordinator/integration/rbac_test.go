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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/coordinator/controller"
	"github.com/bootc-fleet/bootc-fleet/coordinator/drain"
	"github.com/bootc-fleet/bootc-fleet/coordinator/plan"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
	"github.com/go-logr/logr"
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
			return got[plan.EventRebootGranted] > 0 && got[plan.EventDrained] > 0 && got[plan.EventNodeUpdated] > 0 && got[plan.EventStaged] > 0, fmt.Sprint(got, pe)
		})
	}
	var left corev1.Pod
	if err := env.Client.Get(ctx, clientKey("default", "app-0"), &left); !apierrors.IsNotFound(err) {
		t.Fatalf("pod on the drained node still there: %v", err)
	}
}

// The coordinator's Node writes are cordons only: as its ServiceAccount,
// under the packaged RBAC and coordinator-policy.yaml, a cordon with its mark
// and the uncordon pass, and every other change to a Node is refused with
// the policy's message.
func TestCoordinatorNodeWritesAreCordonsOnly(t *testing.T) {
	ctx := context.Background()
	root := envtest.RepoRoot()
	if err := envtest.Apply(ctx, env.Client, filepath.Join(root, "packaging/rbac/coordinator.yaml"), filepath.Join(root, "packaging/policy/coordinator-policy.yaml")); err != nil {
		t.Fatal(err)
	}
	cfg, err := env.AddUser("system:serviceaccount:bootc-fleet-system:bootc-fleet-coordinator", "system:serviceaccounts", "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "policy-n00", Labels: map[string]string{"keep": "me"},
		Annotations: map[string]string{"someone/else": "x"}}}
	if err := env.Client.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), node) })
	patch := func(p string) error {
		_, err := cs.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, []byte(p), metav1.PatchOptions{})
		return err
	}
	// The policy loads asynchronously: wait until a dry-run label change is refused.
	probe := 0
	eventually(t, time.Minute, "the Node policy enforced", func() (bool, string) {
		probe++
		_, err := cs.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType,
			[]byte(fmt.Sprintf(`{"metadata":{"labels":{"probe":"%d"}}}`, probe)), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"), truncateErr(err)
	})
	denied := func(what, p, message string) {
		t.Helper()
		err := patch(p)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), message) {
			t.Errorf("%s: %v, want Forbidden with the message %q", what, err, message)
		}
	}
	denied("a label", `{"metadata":{"labels":{"keep":"changed"}}}`, "may not change the labels of Node policy-n00")
	denied("someone else's annotation", `{"metadata":{"annotations":{"someone/else":null}}}`, "may change only its annotation fleet.bootc.dev/cordoned-for")
	denied("a new annotation", `{"metadata":{"annotations":{"mine/too":"y"}}}`, "may change only its annotation")
	denied("a taint", `{"spec":{"taints":[{"key":"k","effect":"NoSchedule"}]}}`, "may change only spec.unschedulable")
	denied("a cordon with a taint", `{"spec":{"unschedulable":true,"taints":[{"key":"k","effect":"NoSchedule"}]}}`, "may change only spec.unschedulable")

	d := drain.New(cs, logr.Discard())
	if _, err := d.Cordon(ctx, node.Name, "pool-reboot-0#1/uid"); err != nil {
		t.Fatalf("the coordinator's cordon was refused: %v", err)
	}
	got := &corev1.Node{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node.Name}, got); err != nil || !got.Spec.Unschedulable || got.Annotations[lease.NodeAnnotationCordonedFor] == "" {
		t.Fatalf("after the cordon: %v, unschedulable %v, annotations %v", err, got.Spec.Unschedulable, got.Annotations)
	}
	if err := d.Uncordon(ctx, node.Name); err != nil {
		t.Fatalf("the coordinator's uncordon was refused: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node.Name}, got); err != nil || got.Spec.Unschedulable || got.Annotations["someone/else"] != "x" || got.Labels["keep"] != "me" {
		t.Fatalf("after the uncordon: %v, %+v", err, got.ObjectMeta)
	}
}

// nodeEvents counts the Events about Node name by reason.
func nodeEvents(t *testing.T, name string) map[string]int {
	t.Helper()
	var evs eventsv1.EventList
	if err := env.Client.List(context.Background(), &evs); err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range evs.Items {
		if e.Regarding.Kind == "Node" && e.Regarding.Name == name && e.Regarding.UID != "" {
			out[e.Reason]++
		}
	}
	return out
}
