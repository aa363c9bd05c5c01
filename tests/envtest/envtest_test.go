package envtest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

var env *envtest.Env

func TestMain(m *testing.M) { envtest.Main(m, &env) }

const nodeLeaseNS = "kube-node-lease"

// nodeRestrictionMessage is what the NodeRestriction admission plugin
// (plugin/pkg/admission/noderestriction, admitLease) answers a node that
// writes a Lease outside kube-node-lease: the whole message, so that an
// authorization denial (which would also carry the Node authorizer's reason
// "can only access leases in ...", after `User ... cannot ...`) cannot pass
// for it.
func nodeRestrictionMessage(name, reason string) string {
	return fmt.Sprintf(`leases.coordination.k8s.io %q is forbidden: %s`, name, reason)
}

const outsideNodeLeaseNS = `can only access leases in the "kube-node-lease" system namespace`

func wantNodeRestriction(t *testing.T, what string, err error, name, reason string) {
	t.Helper()
	want := nodeRestrictionMessage(name, reason)
	if !apierrors.IsForbidden(err) || err.Error() != want {
		t.Fatalf("%s: got %v, want Forbidden by NodeRestriction: %s", what, err, want)
	}
}

// TestProductionShapedControlPlane checks that the API server every test
// uses runs the Node authorizer and the NodeRestriction admission plugin, as
// real clusters do, so that a later change cannot quietly turn either off.
func TestProductionShapedControlPlane(t *testing.T) {
	if env == nil {
		envtest.SkipIfUnavailable(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := env.Client

	// node-x may write every Lease in bootc-fleet-system as far as RBAC is
	// concerned, so a refusal there is NodeRestriction's, not RBAC's.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "envtest-node-x-leases", Namespace: lease.Namespace},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"*"}}}}
	bind := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "envtest-node-x-leases", Namespace: lease.Namespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "system:node:node-x"}}}
	for _, o := range []client.Object{role, bind} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.Delete(context.Background(), o) })
	}
	slot := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "envtest-slot", Namespace: lease.Namespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("node-y")}}
	if err := admin.Create(ctx, slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), slot) })
	// The API server creates kube-node-lease itself, shortly after it starts.
	if err := waitFor(ctx, func() (bool, error) {
		err := admin.Get(ctx, client.ObjectKey{Name: nodeLeaseNS}, &corev1.Namespace{})
		return err == nil, client.IgnoreNotFound(err)
	}); err != nil {
		t.Fatalf("namespace %s: %v", nodeLeaseNS, err)
	}

	cfg, err := env.AddUser("system:node:node-x", "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	node, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// RBAC changes reach the authorizer through an informer: wait until the
	// API server says node-x may create and update Leases in bootc-fleet-system.
	for _, verb := range []string{"create", "update"} {
		if err := waitFor(ctx, func() (bool, error) {
			r := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: lease.Namespace, Verb: verb, Group: "coordination.k8s.io", Resource: "leases", Name: slot.Name}}}
			if err := node.Create(ctx, r); err != nil {
				return false, err
			}
			return r.Status.Allowed, nil
		}); err != nil {
			t.Fatalf("RBAC for node-x to %s leases in %s never took effect: %v", verb, lease.Namespace, err)
		}
	}

	// Outside kube-node-lease: refused by NodeRestriction despite RBAC.
	got := &coordinationv1.Lease{}
	if err := node.Get(ctx, client.ObjectKeyFromObject(slot), got); err != nil {
		t.Fatalf("node-x reading a Lease its RBAC allows: %v", err)
	}
	got.Spec.HolderIdentity = ptr.To("node-x")
	wantNodeRestriction(t, "update in "+lease.Namespace, node.Update(ctx, got), slot.Name, outsideNodeLeaseNS)
	wantNodeRestriction(t, "create in "+lease.Namespace, node.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "node-x", Namespace: lease.Namespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("node-x")}}), "node-x", outsideNodeLeaseNS)
	wantNodeRestriction(t, "delete in "+lease.Namespace, node.Delete(ctx, slot), slot.Name, outsideNodeLeaseNS)
	after := &coordinationv1.Lease{}
	if err := admin.Get(ctx, client.ObjectKeyFromObject(slot), after); err != nil || ptr.Deref(after.Spec.HolderIdentity, "") != "node-y" {
		t.Fatalf("lease changed despite the refusals: %v, holder %v", err, after.Spec.HolderIdentity)
	}

	// In kube-node-lease: node-x creates and renews its own heartbeat Lease.
	// No RBAC grants it (the bootstrap ClusterRoleBinding system:node has no
	// subjects); the Node authorizer does.
	own := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "node-x", Namespace: nodeLeaseNS},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("node-x"), LeaseDurationSeconds: ptr.To(int32(40)),
			RenewTime: &metav1.MicroTime{Time: time.Now()}}}
	if err := node.Create(ctx, own); err != nil {
		t.Fatalf("node-x creating its own Lease in %s: %v", nodeLeaseNS, err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), own) })
	own.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(time.Second)}
	if err := node.Update(ctx, own); err != nil {
		t.Fatalf("node-x renewing its own Lease in %s: %v", nodeLeaseNS, err)
	}
	// ... but not another node's: the Node authorizer lets a create through
	// (it cannot see the name), NodeRestriction checks the name.
	wantNodeRestriction(t, "create another node's Lease in "+nodeLeaseNS, node.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "node-y", Namespace: nodeLeaseNS},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("node-y")}}),
		"node-y", "can only access node lease with the same name as the requesting node")
	// The success above is the Node authorizer's, not RBAC's: a member of
	// system:nodes whose name is not system:node:<name> is not a node to the
	// Node authorizer, and RBAC refuses it the same create.
	cfg2, err := env.AddUser("node-z", "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	notNode, err := client.New(cfg2, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	err = notNode.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "node-z", Namespace: nodeLeaseNS}})
	if want := `cannot create resource "leases"`; !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("a non-node creating a Lease in %s: got %v, want RBAC Forbidden (%s)", nodeLeaseNS, err, want)
	}
}

// waitFor polls cond every 50ms until it holds, fails, or ctx ends.
func waitFor(ctx context.Context, cond func() (bool, error)) error {
	return wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) { return cond() })
}
