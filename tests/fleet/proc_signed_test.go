package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/tests/testregistry"
)

// The whole product on a private registry (TLS from a test CA, basic auth)
// with signed images: the coordinator process resolves the tag with the
// pool's pull secret and trusts the CA from --registry-ca-file; each node's
// test bootc pulls for real with its own auth.json and enforces its
// sigstore policy, as --enforce-container-sigpolicy asks. A signed image
// rolls out, verified on every node; an unsigned one is rejected by the
// first node that stages it, which halts the pool with no reboot at all.
func TestProcFleetPrivateSignedImages(t *testing.T) {
	reg := testregistry.Start(t)
	key := testregistry.NewKey(t)
	reg.AddUser("node", "node-secret", true)
	reg.AddUser("coordinator", "coordinator-secret", true)
	unsigned := map[string]bool{"v3": true}
	f := startProcFleet(t, sim.ProcOptions{Nodes: 3, StageTime: 200 * time.Millisecond, Private: &sim.PrivateRegistry{
		Host: reg.Host, CAPEM: reg.CAPEM,
		Push: func(tag string) (string, error) {
			ref := reg.PushTagged(t, "os", tag)
			if !unsigned[tag] {
				reg.Sign(t, ref, "", key)
			}
			return ref, nil
		},
		NodeRoot: func(_, root string) error {
			reg.WriteCA(t, root)
			reg.WriteAuth(t, root, "etc/ostree/auth.json", "node", "node-secret")
			reg.WriteSigstorePolicy(t, root, key)
			return nil
		},
		PullSecret: "fleet-pull", RequireSignedImages: true,
	}})
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "fleet-pull", Namespace: lease.Namespace}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: reg.DockerConfig("coordinator", "coordinator-secret")}}
	if err := f.Env.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Env.Client.Delete(context.Background(), secret) })

	v2, err := f.Push("v2")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.CreatePool(ctx, "v2", 1, 1); err != nil {
		t.Fatal(err)
	}
	waitConverged(t, f, v2, 3*time.Minute)
	for _, v := range f.Check(ctx, v2) {
		t.Errorf("%s", v)
	}
	for _, n := range f.Nodes {
		var bn fleetv1.BootcNode
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &bn); err != nil {
			t.Fatal(err)
		}
		if !bn.Spec.RequireSignedImages || !bn.Status.Booted.Verified() {
			t.Errorf("%s: requireSignedImages %v, booted %+v; want it booted verified (ContainerPolicy)", n.Name, bn.Spec.RequireSignedImages, bn.Status.Booted)
		}
	}
	before := f.Reboots()

	if _, err := f.Push("v3"); err != nil {
		t.Fatal(err)
	}
	if err := f.SetPoolImage(ctx, "v3"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := f.PoolStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c := meta.FindStatusCondition(st.Conditions, fleetv1.PoolHalted)
		if c != nil && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, "(SignatureRejected)") && st.Failures >= 1 {
			t.Logf("pool halted: %s", c.Message)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool not halted on the unsigned image: %+v", st)
		}
		time.Sleep(250 * time.Millisecond)
	}
	var rejected []string
	for _, n := range f.Nodes {
		var bn fleetv1.BootcNode
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &bn); err != nil {
			t.Fatal(err)
		}
		if bn.Status.Reason == fleetv1.ReasonSignatureRejected {
			rejected = append(rejected, n.Name)
			if !strings.Contains(bn.Status.Message, "A signature was required, but no signature exists") {
				t.Errorf("%s: message %q lacks bootc's reason", n.Name, bn.Status.Message)
			}
			// The rollout annotations are written in the background, a
			// second after the state settles (amendment 16).
			name := n.Name
			waitDeadline := time.Now().Add(60 * time.Second)
			for {
				var cur fleetv1.BootcNode
				if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: name}, &cur); err != nil {
					t.Fatal(err)
				}
				got := cur.Annotations[fleetv1.AnnotationRolloutState]
				if got == fleetv1.RolloutFailed {
					break
				}
				if time.Now().After(waitDeadline) {
					t.Errorf("%s: rollout state %q, want %s", name, got, fleetv1.RolloutFailed)
					break
				}
				time.Sleep(250 * time.Millisecond)
			}
		}
	}
	if len(rejected) == 0 {
		t.Fatal("no node reports SignatureRejected")
	}
	// Give a wrong grant time to happen: nothing reboots, nothing stages v3.
	time.Sleep(5 * time.Second)
	after := f.Reboots()
	for _, n := range f.Nodes {
		if after[n.Name] != before[n.Name] {
			t.Errorf("%s rebooted %d more times after the unsigned image", n.Name, after[n.Name]-before[n.Name])
		}
		m, err := n.Bootc.Machine()
		if err != nil {
			t.Fatal(err)
		}
		if st := m.State(); st.Booted == nil || st.Booted.Image != v2 || (st.Staged != nil && st.Staged.Image != v2) {
			t.Errorf("%s: booted %+v staged %+v, want v2 booted and nothing else", n.Name, st.Booted, st.Staged)
		}
	}
	t.Logf("rejected by %v", rejected)
}
