package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// loosenCRDs installs, until the test ends, copies of the fleet CRDs without
// the constraints that keep undecodable values out (the pattern on
// lastReportTime, the int32 bound on rollout.maxUnavailable): the schemas
// of before, under which such objects were stored. The API server here
// (1.37) refuses an int32 field out of range whatever the schema says.
func loosenCRDs(t *testing.T, ctx context.Context) {
	t.Helper()
	loosen := map[string]func(s *apiextensionsv1.JSONSchemaProps){
		"bootcnodes.fleet.bootc.dev": func(s *apiextensionsv1.JSONSchemaProps) {
			st := s.Properties["status"]
			p := st.Properties["lastReportTime"]
			p.Pattern = ""
			st.Properties["lastReportTime"] = p
			s.Properties["status"] = st
		},
		"bootcnodepools.fleet.bootc.dev": func(s *apiextensionsv1.JSONSchemaProps) {
			spec := s.Properties["spec"]
			r := spec.Properties["rollout"]
			mu := r.Properties["maxUnavailable"]
			mu.XValidations = apiextensionsv1.ValidationRules{{Rule: "type(self) == int ? self >= 1 : self.matches('^([1-9][0-9]?|100)%$')"}}
			r.Properties["maxUnavailable"] = mu
			spec.Properties["rollout"] = r
			s.Properties["spec"] = spec
		},
	}
	for name, change := range loosen {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
			t.Fatal(err)
		}
		original := crd.Spec.DeepCopy()
		change(crd.Spec.Versions[0].Schema.OpenAPIV3Schema)
		if err := env.Client.Update(ctx, &crd); err != nil {
			t.Fatalf("loosening %s: %v", name, err)
		}
		t.Cleanup(func() {
			var cur apiextensionsv1.CustomResourceDefinition
			if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &cur); err != nil {
				t.Errorf("restoring %s: %v", name, err)
				return
			}
			cur.Spec = *original
			if err := env.Client.Update(context.Background(), &cur); err != nil {
				t.Errorf("restoring %s: %v", name, err)
			}
		})
	}
}

// rawPatch merge-patches an object as unstructured (no typed decoding).
func rawPatch(ctx context.Context, kind, name string, status bool, patch string) error {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(fleetv1.GroupVersion.WithKind(kind))
	u.SetName(name)
	if status {
		return env.Client.Status().Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(patch)))
	}
	return env.Client.Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(patch)))
}

func unstructuredCondition(ctx context.Context, pool, typ string) (map[string]any, bool) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(fleetv1.GroupVersion.WithKind("BootcNodePool"))
	if err := env.Client.Get(ctx, client.ObjectKey{Name: pool}, u); err != nil {
		return nil, false
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			return m, true
		}
	}
	return nil, false
}

// One undecodable pool and one undecodable BootcNode are stored (under the
// loose schemas of before) before a coordinator starts. The coordinator
// syncs anyway, rolls another pool out, and names each object, with its
// decode error, in the ObjectsReadable condition of the pool concerned and
// in a Warning Event UndecodableObject. Once the objects decode again, the
// conditions go. With a typed informer, its cache never synced and nothing
// was planned at all.
func TestUndecodableObjectsAreSetAsideAndNamed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	loosenCRDs(t, ctx)

	// A pool whose maxUnavailable overflows int32 (intstr decodes an int32).
	broken := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": fleetv1.GroupVersion.String(), "kind": "BootcNodePool",
		"metadata": map[string]any{"name": "undec-broken"},
		"spec": map[string]any{
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"test-pool": "undec-broken"}},
			"image":        v1.String(),
			"rollout":      map[string]any{"maxUnavailable": int64(3000000000)},
		},
	}}
	eventually(t, 30*time.Second, "the loose pool schema in force", func() (bool, string) {
		err := env.Client.Create(ctx, broken.DeepCopy())
		return err == nil, truncateErr(err)
	})
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), broken) })

	// A node of pool undec-lame whose agent wrote lastReportTime without
	// the six fractional digits metav1.MicroTime decodes.
	lame := newFleet(t, "undec-lame", 1, v0)
	lame.createPool(func(p *fleetv1.BootcNodePool) { p.Spec.Image = v1.String() })
	lameNode := "undec-lame-n00"
	bn := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": fleetv1.GroupVersion.String(), "kind": "BootcNode",
		"metadata": map[string]any{"name": lameNode},
		"spec":     map[string]any{"pool": "undec-lame"},
	}}
	if err := env.Client.Create(ctx, bn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), bn) })
	badStatus := `{"status":{"phase":"Idle","lastReportTime":"2024-01-01T12:00:00Z"}}`
	eventually(t, 30*time.Second, "the loose BootcNode schema in force", func() (bool, string) {
		err := rawPatch(ctx, "BootcNode", lameNode, true, badStatus)
		return err == nil, truncateErr(err)
	})
	if err := env.Client.Get(ctx, client.ObjectKey{Name: lameNode}, &fleetv1.BootcNode{}); err == nil {
		t.Fatal("the BootcNode decodes: the test stored nothing undecodable")
	} else {
		t.Logf("typed read of the stored BootcNode: %v", err)
	}

	// A healthy pool, then a coordinator started with both objects stored.
	ok := newFleet(t, "undec-ok", 3, v0)
	ok.run(ctx, 1)
	ok.createPool(func(p *fleetv1.BootcNodePool) { p.Spec.Image = v1.String() })
	startCoordinator(t, "undec", nil)

	ok.allOn(t, v1, 180*time.Second)
	cancel()
	ok.assertBudgetHeld(t)
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()

	eventually(t, 60*time.Second, "pool undec-lame naming its undecodable BootcNode", func() (bool, string) {
		c := meta.FindStatusCondition(lame.getPool().Status.Conditions, fleetv1.PoolObjectsReadable)
		if c == nil {
			return false, "no ObjectsReadable condition"
		}
		return c.Status == metav1.ConditionFalse && c.Reason == fleetv1.ReasonUndecodableObject &&
			strings.Contains(c.Message, "BootcNode "+lameNode) && strings.Contains(c.Message, "2024-01-01T12:00:00Z"), c.Message
	})
	eventually(t, 60*time.Second, "a Warning Event naming the BootcNode", func() (bool, string) {
		evs := events(t, "undec-lame", fleetv1.ReasonUndecodableObject)
		for _, e := range evs {
			if strings.Contains(e, "BootcNode "+lameNode) && strings.Contains(e, "cannot be decoded") {
				return true, ""
			}
		}
		return false, strings.Join(evs, " | ")
	})
	eventually(t, 60*time.Second, "pool undec-broken named on its own status", func() (bool, string) {
		c, found := unstructuredCondition(ctx, "undec-broken", fleetv1.PoolObjectsReadable)
		if !found {
			return false, "no ObjectsReadable condition"
		}
		msg, _ := c["message"].(string)
		return c["status"] == "False" && c["reason"] == fleetv1.ReasonUndecodableObject &&
			strings.Contains(msg, "BootcNodePool undec-broken") && strings.Contains(msg, "int32"), msg
	})
	// Naming it is one write, not a loop: the write changes the pool's
	// resourceVersion, which must not call for another.
	rv := func() string {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(fleetv1.GroupVersion.WithKind("BootcNodePool"))
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "undec-broken"}, u); err != nil {
			t.Fatal(err)
		}
		return u.GetResourceVersion()
	}
	before := rv()
	time.Sleep(3 * time.Second)
	if after := rv(); after != before {
		t.Errorf("the undecodable pool is written again and again: resourceVersion %s, 3s later %s", before, after)
	}
	eventually(t, 60*time.Second, "a Warning Event naming the pool", func() (bool, string) {
		evs := events(t, "undec-broken", fleetv1.ReasonUndecodableObject)
		return len(evs) > 0 && strings.Contains(evs[0], "BootcNodePool undec-broken"), strings.Join(evs, " | ")
	})
	c, _ := unstructuredCondition(ctx, "undec-broken", fleetv1.PoolObjectsReadable)
	t.Logf("undec-broken: %s; undec-lame: %s", conditionMessage(c), meta.FindStatusCondition(lame.getPool().Status.Conditions, fleetv1.PoolObjectsReadable).Message)
	if c := meta.FindStatusCondition(ok.getPool().Status.Conditions, fleetv1.PoolObjectsReadable); c != nil {
		t.Errorf("the healthy pool has an ObjectsReadable condition: %+v", *c)
	}

	// Both decode again: the conditions go, the lame pool plans its node.
	if err := rawPatch(ctx, "BootcNode", lameNode, true, `{"status":{"lastReportTime":"2024-01-01T12:00:00.000000Z"}}`); err != nil {
		t.Fatal(err)
	}
	if err := rawPatch(ctx, "BootcNodePool", "undec-broken", false, `{"spec":{"rollout":{"maxUnavailable":1}}}`); err != nil {
		t.Fatal(err)
	}
	for _, pool := range []string{"undec-lame", "undec-broken"} {
		eventually(t, 60*time.Second, "the ObjectsReadable condition of "+pool+" gone", func() (bool, string) {
			c, found := unstructuredCondition(ctx, pool, fleetv1.PoolObjectsReadable)
			return !found, conditionMessage(c)
		})
	}
	eventually(t, 60*time.Second, "the lame node planned: its BootcNode asks for the target", func() (bool, string) {
		var got fleetv1.BootcNode
		if err := env.Client.Get(ctx, client.ObjectKey{Name: lameNode}, &got); err != nil {
			return false, err.Error()
		}
		return got.Spec.DesiredImage == v1.String(), got.Spec.DesiredImage
	})

	// Undecodable again while watched: dropped from the cache, named again.
	if err := rawPatch(ctx, "BootcNode", lameNode, true, `{"status":{"lastReportTime":"2024-01-02T12:00:00+02:00"}}`); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "pool undec-lame naming its BootcNode again", func() (bool, string) {
		c := meta.FindStatusCondition(lame.getPool().Status.Conditions, fleetv1.PoolObjectsReadable)
		if c == nil {
			return false, "no ObjectsReadable condition"
		}
		return c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "2024-01-02T12:00:00+02:00"), c.Message
	})
}

func conditionMessage(m map[string]any) string {
	if m == nil {
		return ""
	}
	s, _ := m["message"].(string)
	return s
}
