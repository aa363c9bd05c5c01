// Package confinement checks, against a real API server with real client
// certificates, that a node's credentials reach only that node's objects:
// packaging/rbac/agent.yaml plus packaging/policy/agent-policy.yaml, on the
// production-shaped API server of tests/envtest (Node,RBAC authorization and
// the NodeRestriction admission plugin).
//
// A node writes no slot Lease at all. Three layers refuse it, in the order the
// API server applies them: RBAC (agent.yaml grants no Lease write), then
// NodeRestriction (no Lease write by a node outside kube-node-lease), then the
// Lease policy (no Lease write in bootc-fleet-system by the group
// system:nodes). Each is checked with the others out of the way.
package confinement

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
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

	// stray is a member of system:nodes whose user name is not
	// system:node:<name> (a misissued certificate, say). NodeRestriction and
	// the Node authorizer do not know it as a node; the policies, which match
	// the group, do. setup gives it RBAC to write slot Leases, so it shows
	// what the Lease policy alone refuses.
	stray = "bootc-fleet-stray"

	nodeRestriction = `can only access leases in the "kube-node-lease" system namespace`
	onlyCoordinator = "; only the coordinator grants, revokes and releases slots"
)

var (
	reboot0 = lease.SlotName(poolNm, lease.KindReboot, 0) // held by node-a
	reboot1 = lease.SlotName(poolNm, lease.KindReboot, 1) // held by node-b
	stage0  = lease.SlotName(poolNm, lease.KindStage, 0)  // free
)

var env *envtest.Env

func TestMain(m *testing.M) { envtest.Main(m, &env) }

// world is a pool with two nodes: node-a holds reboot slot 0, node-b holds
// reboot slot 1, stage slot 0 is free.
type world struct {
	admin, nodeA, nodeB, stray client.Client
}

func setup(t *testing.T) (context.Context, world) {
	t.Helper()
	if env == nil {
		envtest.SkipIfUnavailable(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	if err := applyPackaging(ctx); err != nil {
		t.Fatal(err)
	}
	admin := env.Client
	strayRole := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "stray-writes-leases", Namespace: lease.Namespace},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"*"}}}}
	strayBind := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "stray-writes-leases", Namespace: lease.Namespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: strayRole.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: stray}}}
	for _, o := range []client.Object{strayRole, strayBind} {
		if err := admin.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
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
	var stale coordinationv1.LeaseList
	if err := admin.List(ctx, &stale, client.InNamespace(lease.Namespace)); err != nil {
		t.Fatal(err)
	}
	for i := range stale.Items {
		_ = admin.Delete(ctx, &stale.Items[i])
		if err := waitGone(ctx, admin, &stale.Items[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []*coordinationv1.Lease{
		slot(lease.KindReboot, 0, "node-a", bootA, lease.PhaseDraining),
		slot(lease.KindReboot, 1, "node-b", bootB, lease.PhaseReboot),
		slot(lease.KindStage, 0, "", "", ""),
	} {
		if err := admin.Create(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	w := world{admin: admin, nodeA: user(t, "system:node:node-a"), nodeB: user(t, "system:node:node-b"), stray: user(t, stray)}
	if err := w.waitForPolicies(ctx); err != nil {
		t.Fatal(err)
	}
	return ctx, w
}

func applyPackaging(ctx context.Context) error {
	root := envtest.RepoRoot()
	return envtest.Apply(ctx, env.Client,
		filepath.Join(root, "packaging/rbac/agent.yaml"),
		filepath.Join(root, "packaging/policy/agent-policy.yaml"))
}

// user is a client authenticated as name in the group system:nodes.
func user(t *testing.T, name string) client.Client {
	t.Helper()
	cfg, err := env.AddUser(name, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// slot is slot i of kind, free, or granted as the coordinator grants it
// (the api/lease codec).
func slot(kind lease.Kind, i int, holder, bootID string, phase lease.Phase) *coordinationv1.Lease {
	l := lease.NewSlot(poolNm, kind, i)
	if holder == "" {
		return l
	}
	image, err := imageref.ParsePinned(img)
	if err != nil {
		panic(err)
	}
	now := time.Now()
	lease.Issue(l, lease.Terms{Kind: kind, Holder: holder, Image: image, BootID: bootID}, now, time.Minute)
	if phase == lease.PhaseReboot {
		lease.Advance(l, false, now)
	}
	return l
}

func waitGone(ctx context.Context, c client.Client, obj client.Object) error {
	return poll(ctx, func() (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
		return apierrors.IsNotFound(err), nil
	})
}

// poll polls cond every 50ms until it holds, fails, or ctx ends.
func poll(ctx context.Context, cond func() (bool, error)) error {
	return wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) { return cond() })
}

// probes are writes each policy refuses, sent as dry runs so that a probe
// the API server lets through (a policy not loaded yet, or removed) changes
// nothing: node-a writing node-b's status, and stray renewing a free slot.
func (w world) probes(ctx context.Context) (errStatus, errLease error) {
	errStatus = w.nodeA.Status().Patch(ctx, &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}},
		client.RawPatch(types.MergePatchType, []byte(`{"status":{"message":"probe"}}`)), client.DryRunAll)
	errLease = w.stray.Patch(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: stage0, Namespace: lease.Namespace}},
		renewPatch(), client.DryRunAll)
	return errStatus, errLease
}

// waitForPolicies waits until the API server enforces both policies: they
// (and RBAC changes) are loaded asynchronously after creation.
func (w world) waitForPolicies(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var errStatus, errLease error
	err := poll(ctx, func() (bool, error) {
		errStatus, errLease = w.probes(ctx)
		return isPolicyDenial(errStatus) && isPolicyDenial(errLease), nil
	})
	if err != nil {
		// Either may be nil (that write was let through), which %w would print
		// as a bad verb: they are printed, not wrapped.
		return fmt.Errorf("policies not enforced after a minute: status write: %v; lease write: %v", errStatus, errLease) //nolint:errorlint // may be nil
	}
	return nil
}

func isPolicyDenial(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy") &&
		strings.Contains(err.Error(), "bootc-fleet: node ")
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

// leaseVersions is every slot Lease's resourceVersion, as admin sees them.
func (w world) leaseVersions(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	var ls coordinationv1.LeaseList
	if err := w.admin.List(ctx, &ls, client.InNamespace(lease.Namespace)); err != nil {
		t.Fatal(err)
	}
	v := map[string]string{}
	for _, l := range ls.Items {
		v[l.Name] = l.ResourceVersion
	}
	return v
}

func (w world) wantLeasesUnchanged(t *testing.T, ctx context.Context, before map[string]string) {
	t.Helper()
	after := w.leaseVersions(t, ctx)
	if len(before) != 3 || fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("slot Leases changed despite the denials: before %v, after %v", before, after)
	}
}

func renewPatch() client.Patch {
	b, _ := json.Marshal(map[string]any{"spec": map[string]any{"renewTime": metav1.NewMicroTime(time.Now().Add(time.Second))}})
	return client.RawPatch(types.MergePatchType, b)
}

// leaseWrite is one way a node could try to write a slot Lease.
type leaseWrite struct {
	name  string
	verb  string // the RBAC verb
	lease string // the Lease's name ("" for a delete of the collection)
	op    string // the admission operation
	do    func(t *testing.T, c client.Client) error
}

// leaseWrites are the writes a node must never make: renew, grant to node-a or node-b,
// release, patch and delete each slot (its own, another node's, a free one),
// create a grant for itself or for another node, delete them all.
func (w world) leaseWrites(ctx context.Context) []leaseWrite {
	ref := func(name string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lease.Namespace}}
	}
	update := func(name string, mutate func(*coordinationv1.Lease)) func(*testing.T, client.Client) error {
		return func(t *testing.T, c client.Client) error { return c.Update(ctx, w.get(t, ctx, name, mutate)) }
	}
	renew := func(l *coordinationv1.Lease) { l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(time.Second)} }
	takeFor := func(node string) func(*coordinationv1.Lease) {
		return func(l *coordinationv1.Lease) {
			now := metav1.NewMicroTime(time.Now())
			l.Spec.HolderIdentity, l.Spec.AcquireTime, l.Spec.RenewTime = ptr.To(node), &now, &now
			l.Spec.LeaseDurationSeconds = ptr.To(int32(60))
			l.Labels[lease.LabelHolder] = node
			l.Annotations = map[string]string{lease.AnnotationImage: img, lease.AnnotationBootID: bootA}
		}
	}
	release := func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = nil; delete(l.Labels, lease.LabelHolder) }
	var ws []leaseWrite
	for _, name := range []string{reboot0, reboot1, stage0} {
		ws = append(ws,
			leaseWrite{"renew " + name, "update", name, "UPDATE", update(name, renew)},
			leaseWrite{"grant " + name + " to node-a", "update", name, "UPDATE", update(name, takeFor("node-a"))},
			leaseWrite{"grant " + name + " to node-b", "update", name, "UPDATE", update(name, takeFor("node-b"))},
			leaseWrite{"patch renewTime of " + name, "patch", name, "UPDATE", func(_ *testing.T, c client.Client) error { return c.Patch(ctx, ref(name), renewPatch()) }},
			leaseWrite{"delete " + name, "delete", name, "DELETE", func(_ *testing.T, c client.Client) error { return c.Delete(ctx, ref(name)) }},
		)
	}
	ws = append(ws,
		leaseWrite{"release " + reboot0, "update", reboot0, "UPDATE", update(reboot0, release)},
		leaseWrite{"advance the phase of " + reboot0, "update", reboot0, "UPDATE", update(reboot0, func(l *coordinationv1.Lease) {
			l.Annotations[lease.AnnotationPhase] = string(lease.PhaseReboot)
		})},
		leaseWrite{"change the image of " + reboot0, "update", reboot0, "UPDATE", update(reboot0, func(l *coordinationv1.Lease) {
			l.Annotations[lease.AnnotationImage] = other
		})},
		leaseWrite{"create a grant for itself", "create", "workers-stage-5", "CREATE", func(_ *testing.T, c client.Client) error {
			return c.Create(ctx, slot(lease.KindStage, 5, "node-a", bootA, ""))
		}},
		leaseWrite{"create a grant for node-b", "create", "workers-reboot-5", "CREATE", func(_ *testing.T, c client.Client) error {
			return c.Create(ctx, slot(lease.KindReboot, 5, "node-b", bootB, lease.PhaseReboot))
		}},
		leaseWrite{"apply a grant for node-b", "patch", "workers-reboot-6", "CREATE", func(_ *testing.T, c client.Client) error {
			l := slot(lease.KindReboot, 6, "node-b", bootB, lease.PhaseReboot)
			l.TypeMeta = metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"}
			l.Spec.AcquireTime, l.Spec.RenewTime = nil, nil
			u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(l)
			if err != nil {
				return err
			}
			return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(&unstructured.Unstructured{Object: u}), client.FieldOwner("forger"))
		}},
		leaseWrite{"delete every slot Lease", "deletecollection", "", "DELETE", func(_ *testing.T, c client.Client) error {
			return c.DeleteAllOf(ctx, &coordinationv1.Lease{}, client.InNamespace(lease.Namespace))
		}},
	)
	return ws
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

// wantRBACDenial wants the authorizers' refusal of user's verb on resource:
// `User "<user>" cannot <verb> resource "<resource>" in API group ...`.
func wantRBACDenial(t *testing.T, err error, user, verb, resource string) {
	t.Helper()
	want := fmt.Sprintf(`User %q cannot %s resource %q`, user, verb, resource)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want RBAC Forbidden (%s)", err, want)
	}
	if resource == "leases" && !strings.Contains(err.Error(), fmt.Sprintf(`in the namespace %q`, lease.Namespace)) {
		t.Fatalf("RBAC denial outside %s: %v", lease.Namespace, err)
	}
}

// wantNodeRestriction wants NodeRestriction's refusal: the admission
// plugin's whole message, which (unlike an authorizer's) has no `User ...
// cannot ...` in front of the reason.
func wantNodeRestriction(t *testing.T, err error, name string) {
	t.Helper()
	if name == "" { // a delete of the collection: admission names no Lease, and the API server says "Unknown"
		name = "Unknown"
	}
	want := fmt.Sprintf("leases.coordination.k8s.io %q is forbidden: %s", name, nodeRestriction)
	if !apierrors.IsForbidden(err) || err.Error() != want {
		t.Fatalf("got %v, want Forbidden by NodeRestriction: %s", err, want)
	}
}

// waitAllowed waits until the API server lets c do verb on resource in ns,
// or (allowed false) refuses it: RBAC changes reach the authorizer through
// an informer.
func waitAllowed(ctx context.Context, c client.Client, allowed bool, ns, verb, group, resource string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := poll(ctx, func() (bool, error) {
		r := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: group, Resource: resource}}}
		if err := c.Create(ctx, r); err != nil {
			return false, err
		}
		return r.Status.Allowed == allowed, nil
	})
	if err != nil {
		return fmt.Errorf("%s %s/%s in %q: allowed=%v not reached: %w", verb, group, resource, ns, allowed, err)
	}
	return nil
}

func TestNodeMayDoItsJob(t *testing.T) {
	ctx, w := setup(t)
	// Write its own status with a merge patch, as the agent does.
	patch := []byte(`{"status":{"phase":"Staged","bootID":"` + bootA + `","message":"ok"}}`)
	if err := w.nodeA.Status().Patch(ctx, &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}},
		client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatalf("patching its own status: %v", err)
	}
	// Read what it needs: its BootcNode, and the slot Leases (get, list, watch).
	bn := &fleetv1.BootcNode{}
	if err := w.nodeA.Get(ctx, client.ObjectKey{Name: "node-a"}, bn); err != nil || bn.Status.Phase != fleetv1.PhaseStaged {
		t.Fatalf("reading its BootcNode: %v (phase %q)", err, bn.Status.Phase)
	}
	var leases coordinationv1.LeaseList
	if err := w.nodeA.List(ctx, &leases, client.InNamespace(lease.Namespace), client.MatchingLabels{lease.LabelHolder: "node-a"}); err != nil || len(leases.Items) != 1 {
		t.Fatalf("listing its leases: %d, %v", len(leases.Items), err)
	}
	if err := w.nodeA.Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: reboot1}, &coordinationv1.Lease{}); err != nil {
		t.Fatalf("reading another node's lease: %v", err)
	}
	cfg, err := env.AddUser("system:node:node-a", "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	watch, err := wc.Watch(ctx, &coordinationv1.LeaseList{}, client.InNamespace(lease.Namespace))
	if err != nil {
		t.Fatalf("watching slot leases: %v", err)
	}
	watch.Stop()
}

// TestNodeCannotWriteSlotLeases: with the packaging as shipped, a node
// cannot write any slot Lease in any way, and the refusal is RBAC's.
func TestNodeCannotWriteSlotLeases(t *testing.T) {
	ctx, w := setup(t)
	w.wantEveryLeaseWriteRefusedByRBAC(t, ctx)
}

// wantEveryLeaseWriteRefusedByRBAC: each node's every write of every slot
// Lease is refused with the RBAC message, and no Lease changed.
func (w world) wantEveryLeaseWriteRefusedByRBAC(t *testing.T, ctx context.Context) {
	t.Helper()
	before := w.leaseVersions(t, ctx)
	for _, n := range []struct {
		user string
		c    client.Client
	}{{"system:node:node-a", w.nodeA}, {"system:node:node-b", w.nodeB}} {
		for _, lw := range w.leaseWrites(ctx) {
			t.Run(n.user+"/"+lw.name, func(t *testing.T) { wantRBACDenial(t, lw.do(t, n.c), n.user, lw.verb, "leases") })
		}
	}
	w.wantLeasesUnchanged(t, ctx, before)
}

func TestNodeDeniedByPolicy(t *testing.T) {
	ctx, w := setup(t)
	err := w.nodeA.Status().Patch(ctx, &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}},
		client.RawPatch(types.MergePatchType, []byte(`{"status":{"phase":"Idle"}}`)))
	wantPolicyDenial(t, err, "may only write the status of BootcNode node-a, not node-b")
	bn := &fleetv1.BootcNode{}
	if err := w.admin.Get(ctx, client.ObjectKey{Name: "node-b"}, bn); err != nil || bn.Status.Phase == fleetv1.PhaseIdle {
		t.Fatalf("node-b's status changed despite the denial: %v, phase %q", err, bn.Status.Phase)
	}
}

func TestNodeDeniedByRBAC(t *testing.T) {
	ctx, w := setup(t)
	const u = "system:node:node-a"
	p := &fleetv1.BootcNodePool{}
	if err := w.admin.Get(ctx, client.ObjectKey{Name: poolNm}, p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Rollout.Paused = true
	wantRBACDenial(t, w.nodeA.Update(ctx, p), u, "update", "bootcnodepools")
	wantRBACDenial(t, w.nodeA.Delete(ctx, p), u, "delete", "bootcnodepools")
	bn := &fleetv1.BootcNode{}
	if err := w.admin.Get(ctx, client.ObjectKey{Name: "node-a"}, bn); err != nil {
		t.Fatal(err)
	}
	bn.Spec.DesiredImage = other
	wantRBACDenial(t, w.nodeA.Update(ctx, bn), u, "update", "bootcnodes")
	wantRBACDenial(t, w.nodeA.Patch(ctx, bn, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"desiredImage":"`+other+`"}}`))), u, "patch", "bootcnodes")
	wantRBACDenial(t, w.nodeA.Delete(ctx, bn), u, "delete", "bootcnodes")
	wantRBACDenial(t, w.nodeA.Status().Update(ctx, bn), u, "update", "bootcnodes/status")
}

// TestRBACAloneRefusesLeaseWrites removes the admission policies and shows
// that RBAC by itself refuses every slot Lease write by a node: no node can
// forge a grant for itself or another, even on a cluster without the
// policies. The policies are restored afterwards for the other tests.
func TestRBACAloneRefusesLeaseWrites(t *testing.T) {
	ctx, w := setup(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := applyPackaging(ctx); err != nil {
			t.Errorf("restoring the policies: %v", err)
			return
		}
		if err := w.waitForPolicies(ctx); err != nil {
			t.Errorf("restoring the policies: %v", err)
		}
	})
	for _, name := range []string{"bootc-fleet-agent-bootcnodes", "bootc-fleet-agent-leases"} {
		for _, o := range []client.Object{
			&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name}},
			&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}},
		} {
			if err := w.admin.Delete(ctx, o); err != nil {
				t.Fatalf("deleting %T %s: %v", o, name, err)
			}
		}
	}
	// Wait until neither policy applies: both probes (dry runs) go through.
	var errStatus, errLease error
	if err := poll(ctx, func() (bool, error) {
		errStatus, errLease = w.probes(ctx)
		return errStatus == nil && errLease == nil, nil
	}); err != nil {
		t.Fatalf("policies still apply after their deletion: status write: %v; lease write: %v", errStatus, errLease)
	}

	w.wantEveryLeaseWriteRefusedByRBAC(t, ctx)
}

// TestWhenRBACIsTooWide widens RBAC by mistake and checks that the next
// layers still refuse what a node must never do: NodeRestriction every
// Lease write by a node outside kube-node-lease, the Lease policy every slot
// Lease write by any member of system:nodes (stray, which NodeRestriction
// does not know as a node, stands in for a cluster without the plugin), the
// BootcNode policy every BootcNode write but the node's own status.
func TestWhenRBACIsTooWide(t *testing.T) {
	ctx, w := setup(t)
	wide := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "too-wide"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"fleet.bootc.dev", "coordination.k8s.io"}, Resources: []string{"*"}, Verbs: []string{"*"}},
	}}
	bind := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "too-wide"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "too-wide"},
		Subjects: []rbacv1.Subject{
			{APIGroup: rbacv1.GroupName, Kind: "User", Name: "system:node:node-a"},
			{APIGroup: rbacv1.GroupName, Kind: "User", Name: stray},
		}}
	for _, o := range []client.Object{wide, bind} {
		if err := w.admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, o := range []client.Object{bind, wide} {
			if err := w.admin.Delete(ctx, o); err != nil {
				t.Errorf("deleting %s: %v", o.GetName(), err)
			}
		}
		// Leave RBAC as the next test expects it.
		if err := waitAllowed(ctx, w.nodeA, false, lease.Namespace, "update", "coordination.k8s.io", "leases"); err != nil {
			t.Error(err)
		}
	})
	for _, c := range []client.Client{w.nodeA, w.stray} {
		for _, verb := range []string{"create", "update", "patch", "delete", "deletecollection"} {
			if err := waitAllowed(ctx, c, true, lease.Namespace, verb, "coordination.k8s.io", "leases"); err != nil {
				t.Fatal(err)
			}
		}
		for _, verb := range []string{"create", "update", "delete"} {
			if err := waitAllowed(ctx, c, true, "", verb, "fleet.bootc.dev", "bootcnodes"); err != nil {
				t.Fatal(err)
			}
		}
	}

	before := w.leaseVersions(t, ctx)
	for _, lw := range w.leaseWrites(ctx) {
		t.Run("node-a/"+lw.name, func(t *testing.T) { wantNodeRestriction(t, lw.do(t, w.nodeA), lw.lease) })
	}
	for _, lw := range w.leaseWrites(ctx) {
		t.Run("stray/"+lw.name, func(t *testing.T) {
			what := "slot Lease " + lw.lease
			if lw.lease == "" { // a delete of the collection: refused at its first Lease, which admission sees without a name
				what = "slot Leases"
			}
			wantPolicyDenial(t, lw.do(t, w.stray), fmt.Sprintf("bootc-fleet: node %s may not write %s (%s)%s", stray, what, lw.op, onlyCoordinator))
		})
	}
	w.wantLeasesUnchanged(t, ctx, before)

	bn := &fleetv1.BootcNode{}
	if err := w.admin.Get(ctx, client.ObjectKey{Name: "node-a"}, bn); err != nil {
		t.Fatal(err)
	}
	bn.Spec.DesiredImage = other
	wantPolicyDenial(t, w.nodeA.Update(ctx, bn), "may only write BootcNode status, not UPDATE the object")
	wantPolicyDenial(t, w.nodeA.Delete(ctx, bn), "may only write BootcNode status, not DELETE the object")
	wantPolicyDenial(t, w.nodeA.Create(ctx, &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a2"}, Spec: fleetv1.BootcNodeSpec{Pool: poolNm}}),
		"may only write BootcNode status, not CREATE the object")

	// BootcNodePools and their status: no node writes them, whatever RBAC says.
	pool := &fleetv1.BootcNodePool{}
	if err := w.admin.Get(ctx, client.ObjectKey{Name: poolNm}, pool); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, func() (bool, error) { // the policy loads asynchronously, like the others
		p := pool.DeepCopy()
		p.Spec.Rollout.Paused = true
		return isPolicyDenial(w.nodeA.Update(ctx, p, client.DryRunAll)), nil
	}); err != nil {
		t.Fatalf("the BootcNodePool policy was never enforced: %v", err)
	}
	poolWrites := []struct {
		op string
		do func(c client.Client) error
	}{
		{"UPDATE", func(c client.Client) error {
			p := pool.DeepCopy()
			p.Spec.Rollout.Paused = true
			return c.Update(ctx, p)
		}},
		{"UPDATE", func(c client.Client) error {
			return c.Patch(ctx, pool.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"image":"`+other+`"}}`)))
		}},
		{"DELETE", func(c client.Client) error { return c.Delete(ctx, pool.DeepCopy()) }},
		{"CREATE", func(c client.Client) error {
			return c.Create(ctx, &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: "node-made"},
				Spec: fleetv1.BootcNodePoolSpec{Image: other, NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}}})
		}},
	}
	for _, c := range []struct {
		name string
		cl   client.Client
		user string
	}{{"node-a", w.nodeA, "node-a"}, {"stray", w.stray, stray}} {
		for _, pw := range poolWrites {
			what := "BootcNodePool " + poolNm
			if pw.op == "CREATE" {
				what = "BootcNodePool node-made"
			}
			wantPolicyDenial(t, pw.do(c.cl), fmt.Sprintf("bootc-fleet: node %s may not write %s (%s)", c.user, what, pw.op))
		}
		p := pool.DeepCopy()
		p.Status.Updated = 99
		wantPolicyDenial(t, c.cl.Status().Update(ctx, p), fmt.Sprintf("bootc-fleet: node %s may not write BootcNodePool %s status (UPDATE)", c.user, poolNm))
	}
	after := &fleetv1.BootcNodePool{}
	if err := w.admin.Get(ctx, client.ObjectKey{Name: poolNm}, after); err != nil || after.ResourceVersion != pool.ResourceVersion {
		t.Fatalf("the pool changed despite the denials: %v (resourceVersion %s -> %s)", err, pool.ResourceVersion, after.ResourceVersion)
	}

	// The kubelet's heartbeat Lease in kube-node-lease is not a slot Lease:
	// the node still creates and renews its own (the Node authorizer allows
	// it, NodeRestriction checks the name, the policy does not match it).
	if err := poll(ctx, func() (bool, error) { // the API server creates kube-node-lease soon after it starts
		err := w.admin.Get(ctx, client.ObjectKey{Name: "kube-node-lease"}, &corev1.Namespace{})
		return err == nil, client.IgnoreNotFound(err)
	}); err != nil {
		t.Fatalf("namespace kube-node-lease: %v", err)
	}
	hb := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Namespace: "kube-node-lease"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("node-a"), RenewTime: &metav1.MicroTime{Time: time.Now()}}}
	if err := w.nodeA.Create(ctx, hb); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("its heartbeat lease was refused: %v", err)
	}
	if err := w.nodeA.Get(ctx, client.ObjectKeyFromObject(hb), hb); err != nil {
		t.Fatal(err)
	}
	hb.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(time.Second)}
	if err := w.nodeA.Update(ctx, hb); err != nil {
		t.Fatalf("renewing its heartbeat lease was refused: %v", err)
	}
	// And a Lease elsewhere is not a slot Lease either: the policy lets
	// stray (which NodeRestriction does not restrict) write one in default.
	elsewhere := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "not-a-slot", Namespace: "default"}}
	if err := w.stray.Create(ctx, elsewhere); err != nil {
		t.Fatalf("a lease outside %s was refused: %v", lease.Namespace, err)
	}
	t.Cleanup(func() { _ = w.admin.Delete(context.Background(), elsewhere) })
	// ... while NodeRestriction refuses a node a Lease in any namespace but
	// kube-node-lease, even one named after it.
	wantNodeRestriction(t, w.nodeA.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Namespace: "default"}}), "node-a")
}
