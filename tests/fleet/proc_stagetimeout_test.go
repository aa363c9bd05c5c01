package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/tests/testregistry"
)

// Amendment 19 with every real part: a maxStaging 1 pool whose first stage
// hangs on a registry that stops sending the manifest mid-body (the test
// registry's stall, as a stalled registry or proxy does) moves on. The
// stalled node's agent cancels its test bootc at the pool's stageTimeout,
// reports StageTimedOut and lets go of the grant; another node stages and
// is updated first; the stalled node gets its turn again and converges.
func TestProcFleetStalledPullGivesTheSlotOn(t *testing.T) {
	reg := testregistry.Start(t)
	reg.AddUser("node", "node-secret", true)
	reg.AddUser("coordinator", "coordinator-secret", true)
	f := startProcFleet(t, sim.ProcOptions{Nodes: 3, StageTime: 200 * time.Millisecond, Private: &sim.PrivateRegistry{
		Host: reg.Host, CAPEM: reg.CAPEM,
		Push: func(tag string) (string, error) { return reg.PushTagged(t, "os", tag), nil },
		NodeRoot: func(_, root string) error {
			reg.WriteCA(t, root)
			reg.WriteAuth(t, root, "etc/ostree/auth.json", "node", "node-secret")
			testregistry.WritePolicy(t, root, `{"default":[{"type":"insecureAcceptAnything"}]}`)
			return nil
		},
		PullSecret: "fleet-pull",
	}})
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "fleet-pull", Namespace: lease.Namespace}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: reg.DockerConfig("coordinator", "coordinator-secret")}}
	if err := f.Env.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Env.Client.Delete(context.Background(), secret) })

	// On the booted image first, so the stage timeout is set before any stage.
	if err := f.CreatePool(ctx, "v1", 1, 1); err != nil {
		t.Fatal(err)
	}
	const stageTimeout = time.Minute // the schema's minimum
	p := &fleetv1.BootcNodePool{}
	if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: f.Pool}, p); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(p.DeepCopy())
	p.Spec.Rollout.StageTimeout = &metav1.Duration{Duration: stageTimeout}
	if err := f.Env.Client.Patch(ctx, p, patch); err != nil {
		t.Fatal(err)
	}
	reg.StallManifests("node", 1)
	v2, err := f.Push("v2")
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := f.SetPoolImage(ctx, "v2"); err != nil {
		t.Fatal(err)
	}

	// Watch every node until the fleet converged: who timed out, and the
	// order in which nodes booted v2.
	var stalled string
	var timedOutAt time.Duration
	var firstUpdated string
	deadline := time.Now().Add(8 * time.Minute)
	for {
		ok, pending := f.Converged(ctx, v2)
		for _, n := range f.Nodes {
			var bn fleetv1.BootcNode
			if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &bn); err != nil {
				continue
			}
			if bn.Status.Reason == fleetv1.ReasonStageTimedOut && stalled == "" {
				stalled, timedOutAt = n.Name, time.Since(began)
				t.Logf("%s reported %s after %s: %s", n.Name, bn.Status.Reason, timedOutAt.Round(time.Second), bn.Status.Message)
			}
			if firstUpdated == "" && bn.Status.Booted != nil && bn.Status.Booted.Digest != "" && strings.HasSuffix(v2, "@"+bn.Status.Booted.Digest) {
				firstUpdated = n.Name
				t.Logf("%s booted v2 first, after %s", n.Name, time.Since(began).Round(time.Second))
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			st, _ := f.PoolStatus(ctx)
			t.Fatalf("not converged on v2: %s (stalled %q)\npool status: %+v", pending, stalled, st)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if got := reg.Stalled(); got != 1 {
		t.Fatalf("the registry stalled %d pulls, want 1", got)
	}
	if stalled == "" {
		t.Fatal("no node reported StageTimedOut: the stalled pull was not bounded by stageTimeout")
	}
	if timedOutAt < stageTimeout {
		t.Fatalf("%s timed out after %s, before stageTimeout %s", stalled, timedOutAt, stageTimeout)
	}
	if firstUpdated == stalled {
		t.Fatalf("%s, whose pull stalled, was updated first: the slot did not move on", stalled)
	}
	for _, v := range f.Check(ctx, v2) {
		t.Errorf("%s", v)
	}
}
