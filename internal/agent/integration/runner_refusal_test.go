package integration_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
)

// A request the API server refuses shows on the node's BootcNode, with the
// server's message, and on the agent's STATUS= line; it clears once the
// request is allowed. Here the identity may read and report its BootcNode
// but may not list Leases (as with a half-applied RBAC).
func TestRefusedRequestsShowOnTheBootcNode(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const node, user = "mem-refused", "bootc-fleet-test-refused"
	m, err := testbootc.NewBooted(imgV1)
	if err != nil {
		t.Fatal(err)
	}
	bindings := []*rbacv1.ClusterRoleBinding{}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{fleetv1.GroupVersion.Group}, Resources: []string{"bootcnodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{fleetv1.GroupVersion.Group}, Resources: []string{"bootcnodes/status"}, Verbs: []string{"patch"}},
	}}
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}}
	if err := sharedEnv().Client.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := sharedEnv().Client.Create(ctx, b); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	bindings = append(bindings, b)
	t.Cleanup(func() {
		for _, b := range bindings {
			_ = sharedEnv().Client.Delete(context.Background(), b)
		}
		_ = sharedEnv().Client.Delete(context.Background(), role)
	})
	h := &harness{t: t, node: node, m: m, bootc: newMemBootc(m), host: &memHost{m: m}, notify: &memNotifier{}, state: t.TempDir()}
	h.k = &testcoord.Coordinator{C: sharedEnv().Client, Pool: "pool-" + node}
	// The Role a later binding refers to.
	if err := envtest.Apply(ctx, sharedEnv().Client, filepath.Join(envtest.RepoRoot(), "packaging/rbac/agent.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := h.k.EnsureBootcNode(ctx, node, imgV2, ""); err != nil {
		t.Fatal(err)
	}
	rc, err := sharedEnv().AddUser(user)
	if err != nil {
		t.Fatal(err)
	}
	actx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(actx, agent.Config{NodeName: node, RESTConfig: rc, StateDir: h.state,
			PollInterval: 5 * time.Second, RereadInterval: 100 * time.Millisecond, Version: "test"},
			agent.Deps{Bootc: h.bootc, Host: h.host, Notifier: h.notify, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	}()
	defer func() { stop(); <-done }()

	st := h.wait("APIAccess=False naming the refused Lease list", func(s fleetv1.BootcNodeStatus) bool {
		c := meta.FindStatusCondition(s.Conditions, fleetv1.ConditionAPIAccess)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == fleetv1.ReasonRequestRefused &&
			strings.Contains(c.Message, "leases") && strings.Contains(c.Message, "forbidden")
	})
	t.Logf("condition: %s", meta.FindStatusCondition(st.Conditions, fleetv1.ConditionAPIAccess).Message)
	if !h.notify.has("READY=1") {
		t.Errorf("READY=1 not sent while the API server refuses: boot would wait for it; notifications %q", h.notify.lines)
	}
	// STATUS= follows the BootcNode write (the agent sends it once the
	// patch returned), so it may come a moment after the condition shows.
	h.until("STATUS= says what the agent waits for", func() bool {
		return h.notify.hasAll("STATUS=Waiting for the API server", "forbidden")
	})
	if n, _ := h.bootc.counts(); n != 0 {
		t.Fatal("staged without its grants listed")
	}

	// Allowed at last: the agent lists its grants, reports, and the
	// condition clears.
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: lease.Namespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "bootc-fleet-agent"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}}
	if err := sharedEnv().Client.Create(ctx, rb); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sharedEnv().Client.Delete(context.Background(), rb) })
	h.wait("APIAccess=True and a full report", func(s fleetv1.BootcNodeStatus) bool {
		c := meta.FindStatusCondition(s.Conditions, fleetv1.ConditionAPIAccess)
		return c != nil && c.Status == metav1.ConditionTrue && s.Phase == fleetv1.PhaseWaiting && s.BootID == m.BootID()
	})
}

// A host whose bootc status keeps failing does not hold boot: READY=1 goes
// out after ReadyGrace, with STATUS= saying why nothing happens, and
// nothing is staged.
func TestReadyAfterGraceWhenBootcStatusKeepsFailing(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	const node = "mem-nostatus"
	m, err := testbootc.NewBooted(imgV1)
	if err != nil {
		t.Fatal(err)
	}
	m.Configure(func(k *testbootc.Knobs) {
		k.StatusFailure = &testbootc.Failure{ExitCode: 1, Stderr: "error: opening sysroot: simulated failure"}
	})
	h := &harness{t: t, node: node, m: m, bootc: newMemBootc(m), host: &memHost{m: m}, notify: &memNotifier{}, state: t.TempDir()}
	h.k = &testcoord.Coordinator{C: sharedEnv().Client, Pool: "pool-" + node}
	ctx := context.Background()
	if err := h.k.EnsureBootcNode(ctx, node, imgV2, ""); err != nil {
		t.Fatal(err)
	}
	if err := envtest.Apply(ctx, sharedEnv().Client, filepath.Join(envtest.RepoRoot(), "packaging/rbac/agent.yaml")); err != nil {
		t.Fatal(err)
	}
	rc, err := sharedEnv().AddUser("system:node:"+node, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	actx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	started := time.Now()
	go func() {
		done <- agent.Run(actx, agent.Config{NodeName: node, RESTConfig: rc, StateDir: h.state, ReadyGrace: 2 * time.Second,
			PollInterval: 5 * time.Second, RereadInterval: 100 * time.Millisecond, Version: "test"},
			agent.Deps{Bootc: h.bootc, Host: h.host, Notifier: h.notify, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	}()
	defer func() { stop(); <-done }()
	h.until("READY=1", func() bool { return h.notify.has("READY=1") })
	if took := time.Since(started); took < 2*time.Second {
		t.Fatalf("READY=1 after %s, before the grace ran out, with bootc status failing", took)
	}
	h.wait("Degraded StatusUnavailable", testcoord.PhaseIs(fleetv1.PhaseDegraded, fleetv1.ReasonStatusUnavailable))
	if !h.notify.hasAll("STATUS=Degraded: ", "simulated failure") {
		t.Errorf("STATUS= does not say why: %q", h.notify.lines)
	}
	if n, _ := h.bootc.counts(); n != 0 {
		t.Fatal("staged without a readable status")
	}
}
