package integration

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// A node's agent (its own identity, under the packaged RBAC and policies)
// writes a 1 MiB reason into its status. The schema refuses the write
// naming the field, the node's status stays what it was, and the pool's
// status keeps moving: the rollout completes.
func TestOversizedNodeReportIsRefusedAndThePoolGoesOn(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root := envtest.RepoRoot()
	if err := envtest.Apply(ctx, env.Client, filepath.Join(root, "packaging/rbac/agent.yaml"), filepath.Join(root, "packaging/policy/agent-policy.yaml")); err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, "huge", 3, v0)
	f.run(ctx, 1)
	startCoordinator(t, "huge", nil)
	f.createPool(func(p *fleetv1.BootcNodePool) { p.Spec.Image = v1.String() })

	node := "huge-n00"
	cfg, err := env.AddUser("system:node:"+node, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	agent, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the node's BootcNode", func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKey{Name: node}, &fleetv1.BootcNode{})
		return err == nil, "not created yet"
	})
	huge := strings.Repeat("A", 1<<20)
	var lastErr error
	eventually(t, 60*time.Second, "the write refused by the schema", func() (bool, string) {
		// RBAC and the policies load asynchronously; wait for the schema's answer.
		lastErr = agent.Status().Patch(ctx, &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: node}},
			client.RawPatch(types.MergePatchType, []byte(`{"status":{"reason":"`+huge+`"}}`)))
		return apierrors.IsInvalid(lastErr), truncateErr(lastErr)
	})
	if !strings.Contains(lastErr.Error(), "status.reason") {
		t.Fatalf("the refusal does not name status.reason: %s", truncateErr(lastErr))
	}
	bn := &fleetv1.BootcNode{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: node}, bn); err != nil {
		t.Fatal(err)
	}
	if len(bn.Status.Reason) > 64 {
		t.Fatalf("the oversized reason was stored (%d bytes)", len(bn.Status.Reason))
	}
	f.allOn(t, v1, 180*time.Second)
	eventually(t, 60*time.Second, "pool status: 3 updated, UpToDate", func() (bool, string) {
		c := f.condition(fleetv1.PoolUpToDate)
		return f.getPool().Status.Updated == 3 && c.Status == metav1.ConditionTrue, c.Message
	})
}

func truncateErr(err error) string {
	if err == nil {
		return "<nil>"
	}
	return text.Truncate(err.Error(), 300)
}
