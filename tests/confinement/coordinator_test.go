package confinement

// The coordinator's own identity, confined as tightly as a node's: Secrets
// by name in its namespace only, and Node writes that are cordons only.

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/drain"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The coordinator reads a pool's pull secret by name in its own namespace,
// and nothing more: as its ServiceAccount under the packaged RBAC it cannot
// list Secrets there or read one anywhere else. A node can read none of
// them (the Node authorizer gives a kubelet only the Secrets its pods use).
func TestSecretsReadOnlyByNameInTheCoordinatorsNamespace(t *testing.T) {
	ctx, w := setup(t)
	root := envtest.RepoRoot()
	if err := envtest.Apply(ctx, env.Client, filepath.Join(root, "packaging/rbac/coordinator.yaml")); err != nil {
		t.Fatal(err)
	}
	const sa = "system:serviceaccount:bootc-fleet-system:bootc-fleet-coordinator"
	cfg, err := env.AddUser(sa, "system:serviceaccounts", "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	coord, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{lease.Namespace, "default"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pull", Namespace: ns}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"registry.example":{"auth":"dTpw"}}}`)}}
		if err := w.admin.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	if err := waitAllowed(ctx, coord, true, lease.Namespace, "get", "", "secrets"); err != nil {
		t.Fatal(err)
	}
	var s corev1.Secret
	if err := coord.Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: "pull"}, &s); err != nil {
		t.Fatalf("the coordinator cannot read a pull secret in %s: %v", lease.Namespace, err)
	}
	wantRBACDenial(t, coord.List(ctx, &corev1.SecretList{}, client.InNamespace(lease.Namespace)), sa, "list", "secrets")
	wantRBACDenial(t, coord.Get(ctx, client.ObjectKey{Namespace: "default", Name: "pull"}, &s), sa, "get", "secrets")
	wantRBACDenial(t, coord.List(ctx, &corev1.SecretList{}), sa, "list", "secrets")
	wantRBACDenial(t, coord.Update(ctx, s.DeepCopy()), sa, "update", "secrets")
	// A node: the Node authorizer's own refusal.
	err = w.nodeA.Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: "pull"}, &s)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `User "system:node:node-a" cannot get resource "secrets"`) ||
		!strings.Contains(err.Error(), "no relationship found between node 'node-a' and this object") {
		t.Fatalf("node reading a pull secret: %v", err)
	}
}

// The coordinator's Node writes are cordons and autoscaler marks only: as
// its ServiceAccount, under the packaged RBAC and coordinator-policy.yaml, a
// cordon with its marks, the uncordon, and the autoscaler marks on a Node
// someone else cordoned pass, and every other change to a Node is refused
// with the policy's message.
func TestCoordinatorNodeWritesAreCordonsOnly(t *testing.T) {
	ctx, _ := setup(t)
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
	if err := poll(ctx, func() (bool, error) {
		probe++
		_, err := cs.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType,
			[]byte(fmt.Sprintf(`{"metadata":{"labels":{"probe":"%d"}}}`, probe)), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"), nil
	}); err != nil {
		t.Fatalf("the Node policy was never enforced: %v", err)
	}
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
	if _, _, err := d.Cordon(ctx, node.Name, "pool-reboot-0#1/uid", nil); err != nil {
		t.Fatalf("the coordinator's cordon was refused: %v", err)
	}
	got := &corev1.Node{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node.Name}, got); err != nil || !got.Spec.Unschedulable || got.Annotations[lease.NodeAnnotationCordonedFor] == "" {
		t.Fatalf("after the cordon: %v, unschedulable %v, annotations %v", err, got.Spec.Unschedulable, got.Annotations)
	}
	// The autoscaler marks and their record went with the cordon (amendment 28).
	if got.Annotations[lease.NodeAnnotationDoNotDisrupt] != "true" || got.Annotations[lease.NodeAnnotationScaleDownDisabled] != "true" ||
		got.Annotations[lease.NodeAnnotationAutoscalerMarks] == "" {
		t.Fatalf("after the cordon, annotations %v: want both autoscaler marks and their record", got.Annotations)
	}
	if _, err := d.Uncordon(ctx, node.Name, nil); err != nil {
		t.Fatalf("the coordinator's uncordon was refused: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node.Name}, got); err != nil || got.Spec.Unschedulable || got.Annotations["someone/else"] != "x" || got.Labels["keep"] != "me" {
		t.Fatalf("after the uncordon: %v, %+v", err, got.ObjectMeta)
	}
	for _, k := range []string{lease.NodeAnnotationDoNotDisrupt, lease.NodeAnnotationScaleDownDisabled, lease.NodeAnnotationAutoscalerMarks} {
		if v, ok := got.Annotations[k]; ok {
			t.Fatalf("after the uncordon: %s=%q left on the Node", k, v)
		}
	}

	// A Node an administrator cordoned and told Karpenter it may disrupt:
	// held without a cordon of ours, and given back its own value.
	if err := patchAsAdmin(ctx, node.Name, `{"metadata":{"annotations":{"karpenter.sh/do-not-disrupt":"false"}},"spec":{"unschedulable":true}}`); err != nil {
		t.Fatal(err)
	}
	if _, err := d.MarkAutoscalers(ctx, node.Name, "pool-reboot-0", nil); err != nil {
		t.Fatalf("the coordinator's autoscaler marks were refused: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node.Name}, got); err != nil || got.Annotations[lease.NodeAnnotationDoNotDisrupt] != "true" ||
		got.Annotations[lease.NodeAnnotationScaleDownDisabled] != "true" || !got.Spec.Unschedulable {
		t.Fatalf("held: %v, %+v", err, got.ObjectMeta)
	}
	denied("someone else's annotation with the marks", `{"metadata":{"annotations":{"karpenter.sh/do-not-disrupt":"true","someone/else":null}}}`, "may change only its annotation")
	if _, err := d.MarkAutoscalers(ctx, node.Name, "", nil); err != nil {
		t.Fatalf("the coordinator's release of the autoscaler marks was refused: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node.Name}, got); err != nil || got.Annotations[lease.NodeAnnotationDoNotDisrupt] != "false" ||
		got.Annotations["someone/else"] != "x" || !got.Spec.Unschedulable {
		t.Fatalf("released: %v, %+v; want the administrator's do-not-disrupt=false and cordon back", err, got.ObjectMeta)
	}
	if v, ok := got.Annotations[lease.NodeAnnotationScaleDownDisabled]; ok {
		t.Fatalf("released: %s=%q left on the Node", lease.NodeAnnotationScaleDownDisabled, v)
	}
}

// patchAsAdmin merge-patches a Node with the test's own (unconfined) client.
func patchAsAdmin(ctx context.Context, node, p string) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	return env.Client.Patch(ctx, n, client.RawPatch(types.MergePatchType, []byte(p)))
}
