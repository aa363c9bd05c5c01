// Package confinement checks, against a real API server with real client
// certificates, that a node's credentials reach only that node's objects:
// packaging/rbac/agent.yaml plus packaging/policy/agent-policy.yaml.
package confinement

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

const (
	img    = "quay.io/example/os@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	other  = "quay.io/example/os@sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	bootA  = "6b7e6b3c-0c1d-4a8e-9c57-3c1f0d1e2a3b"
	bootB  = "11111111-2222-4333-8444-555555555555"
	poolNm = "workers"
)

var env *envtest.Env

func TestMain(m *testing.M) { envtest.Main(m, &env) }

// world is a pool with two nodes: node-a holds reboot slot 0, node-b holds
// reboot slot 1, stage slot 0 is free.
type world struct {
	admin, nodeA client.Client
}

func setup(t *testing.T, ns string) (context.Context, world) {
	t.Helper()
	if env == nil {
		envtest.SkipIfUnavailable(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	root := envtest.RepoRoot()
	if err := envtest.Apply(ctx, env.Client,
		filepath.Join(root, "packaging/rbac/agent.yaml"),
		filepath.Join(root, "packaging/policy/agent-policy.yaml")); err != nil {
		t.Fatal(err)
	}
	admin := env.Client
	for _, n := range []string{"node-a", "node-b"} {
		bn := &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: n}, Spec: fleetv1.BootcNodeSpec{Pool: poolNm, DesiredImage: img}}
		if err := admin.Create(ctx, bn); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	p := &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: poolNm}, Spec: fleetv1.BootcNodePoolSpec{
		NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": poolNm}}, Image: "quay.io/example/os:1"}}
	if err := admin.Create(ctx, p); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, l := range []*coordinationv1.Lease{
		slot(lease.KindReboot, 0, "node-a", bootA, lease.PhaseDraining),
		slot(lease.KindReboot, 1, "node-b", bootB, lease.PhaseReboot),
		slot(lease.KindStage, 0, "", "", ""),
	} {
		_ = admin.Delete(ctx, l)
		if err := waitGone(ctx, admin, l); err != nil {
			t.Fatal(err)
		}
		if err := admin.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := env.AddUser("system:node:node-a", "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	nodeA, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w := world{admin: admin, nodeA: nodeA}
	w.waitForPolicies(t, ctx)
	return ctx, w
}

func slot(kind lease.Kind, i int, holder, bootID string, phase lease.Phase) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: lease.SlotName(poolNm, kind, i), Namespace: lease.Namespace,
		Labels: map[string]string{lease.LabelPool: poolNm, lease.LabelSlot: string(kind)},
	}}
	if holder == "" {
		return l
	}
	now := metav1.NewMicroTime(time.Now())
	l.Labels[lease.LabelHolder] = holder
	l.Annotations = map[string]string{lease.AnnotationImage: img, lease.AnnotationBootID: bootID}
	if phase != "" {
		l.Annotations[lease.AnnotationPhase] = string(phase)
	}
	l.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To(int32(60)),
		AcquireTime: &now, RenewTime: &now, LeaseTransitions: ptr.To(int32(1))}
	return l
}

func waitGone(ctx context.Context, c client.Client, obj client.Object) error {
	for {
		err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s still exists: %w", obj.GetName(), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitForPolicies waits until the API server enforces both policies: they are
// loaded asynchronously after creation.
func (w world) waitForPolicies(t *testing.T, ctx context.Context) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		errStatus := w.nodeA.Status().Patch(ctx, &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}},
			client.RawPatch(types.MergePatchType, []byte(`{"status":{"message":"probe"}}`)))
		errLease := w.nodeA.Update(ctx, w.get(t, ctx, lease.SlotName(poolNm, lease.KindStage, 0), func(l *coordinationv1.Lease) {
			l.Spec.HolderIdentity = ptr.To("node-a")
		}))
		if isPolicyDenial(errStatus) && isPolicyDenial(errLease) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("policies not enforced after 30s: status write: %v; lease write: %v", errStatus, errLease)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func isPolicyDenial(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "bootc-fleet: node ")
}

// get reads a Lease as admin and applies mutate to the copy the node will send.
func (w world) get(t *testing.T, ctx context.Context, name string, mutate func(l *coordinationv1.Lease)) *coordinationv1.Lease {
	t.Helper()
	l := &coordinationv1.Lease{}
	if err := w.admin.Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: name}, l); err != nil {
		t.Fatal(err)
	}
	mutate(l)
	return l
}

func wantPolicyDenial(t *testing.T, err error, message string) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Fatalf("got %v, want Forbidden by policy", err)
	}
	if !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") || !strings.Contains(err.Error(), message) {
		t.Fatalf("denied, but not by the policy with %q: %v", message, err)
	}
}

func wantRBACDenial(t *testing.T, err error, verb, resource string) {
	t.Helper()
	want := fmt.Sprintf(`cannot %s resource "%s"`, verb, resource)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want RBAC Forbidden (%s)", err, want)
	}
}

func TestNodeMayDoItsJob(t *testing.T) {
	ctx, w := setup(t, "job")
	// Renew its own lease: only renewTime changes.
	renewed := time.Now().Add(time.Second).Truncate(time.Microsecond)
	l := w.get(t, ctx, lease.SlotName(poolNm, lease.KindReboot, 0), func(l *coordinationv1.Lease) {
		l.Spec.RenewTime = &metav1.MicroTime{Time: renewed}
	})
	if err := w.nodeA.Update(ctx, l); err != nil {
		t.Fatalf("renewing its own lease: %v", err)
	}
	// Write its own status with a merge patch, as the agent does.
	patch := []byte(`{"status":{"phase":"Staged","bootID":"` + bootA + `","message":"ok"}}`)
	if err := w.nodeA.Status().Patch(ctx, &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}},
		client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatalf("patching its own status: %v", err)
	}
	// Read what it needs.
	var leases coordinationv1.LeaseList
	if err := w.nodeA.List(ctx, &leases, client.InNamespace(lease.Namespace), client.MatchingLabels{lease.LabelHolder: "node-a"}); err != nil || len(leases.Items) != 1 {
		t.Fatalf("listing its leases: %d, %v", len(leases.Items), err)
	}
	bn := &fleetv1.BootcNode{}
	if err := w.nodeA.Get(ctx, client.ObjectKey{Name: "node-a"}, bn); err != nil || bn.Status.Phase != fleetv1.PhaseStaged {
		t.Fatalf("reading its BootcNode: %v (phase %q)", err, bn.Status.Phase)
	}
	got := w.get(t, ctx, l.Name, func(*coordinationv1.Lease) {})
	if !got.Spec.RenewTime.Time.Equal(renewed) {
		t.Fatalf("renewTime = %v, want %v", got.Spec.RenewTime, renewed)
	}
}

func TestNodeDeniedByPolicy(t *testing.T) {
	ctx, w := setup(t, "policy")
	reboot0 := lease.SlotName(poolNm, lease.KindReboot, 0)
	cases := []struct {
		name    string
		do      func() error
		message string
	}{
		{"write another node's status", func() error {
			return w.nodeA.Status().Patch(ctx, &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}},
				client.RawPatch(types.MergePatchType, []byte(`{"status":{"phase":"Idle"}}`)))
		}, "may only write the status of BootcNode node-a, not node-b"},
		{"take a free slot", func() error {
			return w.nodeA.Update(ctx, w.get(t, ctx, lease.SlotName(poolNm, lease.KindStage, 0), func(l *coordinationv1.Lease) {
				l.Spec.HolderIdentity = ptr.To("node-a")
			}))
		}, "may only renew slot Leases it holds; workers-stage-0 is held by nobody"},
		{"take another node's slot", func() error {
			return w.nodeA.Update(ctx, w.get(t, ctx, lease.SlotName(poolNm, lease.KindReboot, 1), func(l *coordinationv1.Lease) {
				l.Spec.HolderIdentity = ptr.To("node-a")
				l.Labels[lease.LabelHolder] = "node-a"
			}))
		}, "workers-reboot-1 is held by node-b"},
		{"renew another node's slot", func() error {
			return w.nodeA.Update(ctx, w.get(t, ctx, lease.SlotName(poolNm, lease.KindReboot, 1), func(l *coordinationv1.Lease) {
				l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			}))
		}, "workers-reboot-1 is held by node-b"},
		{"release its own slot", func() error {
			return w.nodeA.Update(ctx, w.get(t, ctx, reboot0, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil }))
		}, "may not hand over or release slot Lease workers-reboot-0"},
		{"change its grant's image", func() error {
			return w.nodeA.Update(ctx, w.get(t, ctx, reboot0, func(l *coordinationv1.Lease) { l.Annotations[lease.AnnotationImage] = other }))
		}, "may change only spec.renewTime of slot Lease workers-reboot-0"},
		{"advance its grant's phase", func() error {
			return w.nodeA.Update(ctx, w.get(t, ctx, reboot0, func(l *coordinationv1.Lease) {
				l.Annotations[lease.AnnotationPhase] = string(lease.PhaseReboot)
			}))
		}, "may change only spec.renewTime of slot Lease workers-reboot-0"},
		{"change its grant's boot ID", func() error {
			return w.nodeA.Update(ctx, w.get(t, ctx, reboot0, func(l *coordinationv1.Lease) { l.Annotations[lease.AnnotationBootID] = bootB }))
		}, "may change only spec.renewTime"},
		{"extend leaseDurationSeconds", func() error {
			return w.nodeA.Update(ctx, w.get(t, ctx, reboot0, func(l *coordinationv1.Lease) { l.Spec.LeaseDurationSeconds = ptr.To(int32(86400)) }))
		}, "may change only spec.renewTime"},
		{"reset leaseTransitions", func() error {
			return w.nodeA.Update(ctx, w.get(t, ctx, reboot0, func(l *coordinationv1.Lease) { l.Spec.LeaseTransitions = ptr.To(int32(7)) }))
		}, "may change only spec.renewTime"},
		{"add a finalizer to its lease", func() error {
			return w.nodeA.Update(ctx, w.get(t, ctx, reboot0, func(l *coordinationv1.Lease) { l.Finalizers = []string{"example.com/keep"} }))
		}, "may change only spec.renewTime"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { wantPolicyDenial(t, tc.do(), tc.message) })
	}
	// Nothing changed.
	l := w.get(t, ctx, reboot0, func(*coordinationv1.Lease) {})
	if l.Annotations[lease.AnnotationPhase] != string(lease.PhaseDraining) || *l.Spec.LeaseDurationSeconds != 60 || l.Annotations[lease.AnnotationImage] != img {
		t.Fatalf("lease changed despite denials: %+v %+v", l.Annotations, l.Spec)
	}
}

func TestNodeDeniedByRBAC(t *testing.T) {
	ctx, w := setup(t, "rbac")
	reboot0 := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: lease.SlotName(poolNm, lease.KindReboot, 0), Namespace: lease.Namespace}}
	wantRBACDenial(t, w.nodeA.Delete(ctx, reboot0), "delete", "leases")
	wantRBACDenial(t, w.nodeA.Create(ctx, slot(lease.KindStage, 5, "node-a", bootA, "")), "create", "leases")
	p := &fleetv1.BootcNodePool{}
	if err := w.admin.Get(ctx, client.ObjectKey{Name: poolNm}, p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Rollout.Paused = true
	wantRBACDenial(t, w.nodeA.Update(ctx, p), "update", "bootcnodepools")
	wantRBACDenial(t, w.nodeA.Delete(ctx, p), "delete", "bootcnodepools")
	bn := &fleetv1.BootcNode{}
	if err := w.admin.Get(ctx, client.ObjectKey{Name: "node-a"}, bn); err != nil {
		t.Fatal(err)
	}
	bn.Spec.DesiredImage = other
	wantRBACDenial(t, w.nodeA.Update(ctx, bn), "update", "bootcnodes")
	wantRBACDenial(t, w.nodeA.Patch(ctx, bn, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"desiredImage":"`+other+`"}}`))), "patch", "bootcnodes")
	wantRBACDenial(t, w.nodeA.Delete(ctx, bn), "delete", "bootcnodes")
	wantRBACDenial(t, w.nodeA.Status().Update(ctx, bn), "update", "bootcnodes/status")
}

// TestPolicyHoldsWhenRBACIsTooWide widens RBAC for node-a by mistake and
// checks the policies still refuse what a node must never do.
func TestPolicyHoldsWhenRBACIsTooWide(t *testing.T) {
	ctx, w := setup(t, "wide")
	wide := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "too-wide"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"fleet.bootc.dev", "coordination.k8s.io"}, Resources: []string{"*"}, Verbs: []string{"*"}},
	}}
	bind := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "too-wide"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "too-wide"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "system:node:node-a"}}}
	for _, o := range []client.Object{wide, bind} {
		if err := w.admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.admin.Delete(context.Background(), o) })
	}
	reboot0 := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: lease.SlotName(poolNm, lease.KindReboot, 0), Namespace: lease.Namespace}}
	// RBAC changes take effect asynchronously: wait until the delete is no
	// longer refused by RBAC, then it must be refused by the policy.
	deadline := time.Now().Add(20 * time.Second)
	var err error
	for {
		err = w.nodeA.Delete(ctx, reboot0)
		if !strings.Contains(fmt.Sprint(err), "cannot delete resource") || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	wantPolicyDenial(t, err, "may not DELETE slot Lease workers-reboot-0")
	wantPolicyDenial(t, w.nodeA.Create(ctx, slot(lease.KindStage, 5, "node-a", bootA, "")), "may not CREATE slot Lease workers-stage-5")

	bn := &fleetv1.BootcNode{}
	if err := w.admin.Get(ctx, client.ObjectKey{Name: "node-a"}, bn); err != nil {
		t.Fatal(err)
	}
	bn.Spec.DesiredImage = other
	wantPolicyDenial(t, w.nodeA.Update(ctx, bn), "may only write BootcNode status, not UPDATE the object")
	wantPolicyDenial(t, w.nodeA.Delete(ctx, bn), "may only write BootcNode status, not DELETE the object")
	wantPolicyDenial(t, w.nodeA.Create(ctx, &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a2"}, Spec: fleetv1.BootcNodeSpec{Pool: poolNm}}),
		"may only write BootcNode status, not CREATE the object")

	// The kubelet's heartbeat Leases in kube-node-lease are not slot Leases: untouched.
	hb := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Namespace: "default"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("node-a")}}
	if err := w.nodeA.Create(ctx, hb); err != nil {
		t.Fatalf("a lease outside bootc-fleet-system was refused: %v", err)
	}
}
