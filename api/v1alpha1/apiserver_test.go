package v1alpha1_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

var env *envtest.Env

func TestMain(m *testing.M) { envtest.Main(m, &env) }

func needEnv(t *testing.T) (context.Context, client.Client) {
	t.Helper()
	if env == nil {
		envtest.SkipIfUnavailable(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx, env.Client
}

func pool(name string, mutate func(obj map[string]any)) *unstructured.Unstructured {
	obj := map[string]any{
		"apiVersion": "fleet.bootc.dev/v1alpha1",
		"kind":       "BootcNodePool",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"pool": name}},
			"image":        "quay.io/example/os:42",
		},
	}
	if mutate != nil {
		mutate(obj)
	}
	return &unstructured.Unstructured{Object: obj}
}

func spec(obj map[string]any) map[string]any { return obj["spec"].(map[string]any) }

func rollout(obj map[string]any) map[string]any {
	s := spec(obj)
	if s["rollout"] == nil {
		s["rollout"] = map[string]any{}
	}
	return s["rollout"].(map[string]any)
}

func TestCRDsEstablished(t *testing.T) {
	ctx, c := needEnv(t)
	for _, name := range []string{"bootcnodepools.fleet.bootc.dev", "bootcnodes.fleet.bootc.dev"} {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			t.Fatalf("get CRD %s: %v", name, err)
		}
		established := false
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				established = true
			}
		}
		if !established || crd.Spec.Scope != apiextensionsv1.ClusterScoped {
			t.Fatalf("CRD %s: established=%v scope=%s", name, established, crd.Spec.Scope)
		}
	}
}

func TestValidPoolGetsDefaults(t *testing.T) {
	ctx, c := needEnv(t)
	for name, img := range map[string]string{
		"valid-tag":            "quay.io/example/os:42",
		"valid-digest":         "localhost:5000/os@" + digest,
		"valid-tag-and-digest": "registry.example.com:8443/a/b:1@" + digest,
		"valid-localhost":      "localhost/os:1",
		"valid-ip-port":        "127.0.0.1:5000/fleet/os:1",
	} {
		u := pool(name, func(o map[string]any) { spec(o)["image"] = img })
		if err := c.Create(ctx, u); err != nil {
			t.Fatalf("create pool with image %q: %v", img, err)
		}
	}
	got := &fleetv1.BootcNodePool{}
	if err := c.Get(ctx, client.ObjectKey{Name: "valid-tag"}, got); err != nil {
		t.Fatal(err)
	}
	r := got.Spec.Rollout
	if r.MaxUnavailable == nil || *r.MaxUnavailable != intstr.FromInt32(1) ||
		r.MaxStaging == nil || *r.MaxStaging != intstr.FromString("25%") ||
		r.DrainTimeout == nil || r.DrainTimeout.Duration != 10*time.Minute ||
		r.RebootTimeout == nil || r.RebootTimeout.Duration != 15*time.Minute ||
		r.StageTimeout == nil || r.StageTimeout.Duration != time.Hour ||
		r.HaltAfterFailures == nil || *r.HaltAfterFailures != 1 || r.Paused ||
		got.Spec.RebootPolicy != fleetv1.RebootPolicyReboot {
		t.Fatalf("defaults not applied: %+v policy=%q", r, got.Spec.RebootPolicy)
	}
}

func TestValidRolloutValues(t *testing.T) {
	ctx, c := needEnv(t)
	cases := map[string]func(r map[string]any){
		"int-3":           func(r map[string]any) { r["maxUnavailable"] = 3 },
		"pct-100":         func(r map[string]any) { r["maxUnavailable"] = "100%"; r["maxStaging"] = "1%" },
		"durations":       func(r map[string]any) { r["drainTimeout"] = "90s"; r["rebootTimeout"] = "1h30m" },
		"stage-min":       func(r map[string]any) { r["stageTimeout"] = "1m" },
		"stage-max":       func(r map[string]any) { r["stageTimeout"] = "24h" },
		"soft-and-paused": func(r map[string]any) { r["paused"] = true; r["haltAfterFailures"] = 3 },
	}
	for name, f := range cases {
		u := pool("ok-"+name, func(o map[string]any) { f(rollout(o)) })
		if name == "soft-and-paused" {
			spec(u.Object)["rebootPolicy"] = "AllowSoftReboot"
		}
		if err := c.Create(ctx, u); err != nil {
			t.Errorf("%s: rejected: %v", name, err)
		}
	}
}

func TestInvalidPoolsRejectedNamingTheField(t *testing.T) {
	ctx, c := needEnv(t)
	cases := []struct {
		name   string
		mutate func(o map[string]any)
		field  string // must appear in the error
	}{
		{"empty image", func(o map[string]any) { spec(o)["image"] = "" }, "spec.image"},
		{"image with space", func(o map[string]any) { spec(o)["image"] = "quay.io/os :1" }, "spec.image"},
		{"image with shell substitution", func(o map[string]any) { spec(o)["image"] = "quay.io/$(reboot)/os:1" }, "spec.image"},
		{"image with semicolon", func(o map[string]any) { spec(o)["image"] = "quay.io/os:1;reboot" }, "spec.image"},
		{"image without tag or digest", func(o map[string]any) { spec(o)["image"] = "quay.io/example/os" }, "spec.image"},
		{"image with short digest", func(o map[string]any) { spec(o)["image"] = "quay.io/os@sha256:abcd" }, "spec.image"},
		{"image option injection", func(o map[string]any) { spec(o)["image"] = "--apply" }, "spec.image"},
		{"missing image", func(o map[string]any) { delete(spec(o), "image") }, "spec.image"},
		{"image without registry host", func(o map[string]any) { spec(o)["image"] = "fedora/fedora-bootc:42" }, "spec.image: Invalid value: \"fedora/fedora-bootc:42\": must name its registry host"},
		{"image of one component", func(o map[string]any) { spec(o)["image"] = "os:42" }, "must name its registry host"},
		{"empty selector", func(o map[string]any) { spec(o)["nodeSelector"] = map[string]any{} }, "spec.nodeSelector"},
		{"maxUnavailable 0", func(o map[string]any) { rollout(o)["maxUnavailable"] = 0 }, "spec.rollout.maxUnavailable"},
		{"maxUnavailable negative", func(o map[string]any) { rollout(o)["maxUnavailable"] = -2 }, "spec.rollout.maxUnavailable"},
		{"maxUnavailable 0%", func(o map[string]any) { rollout(o)["maxUnavailable"] = "0%" }, "spec.rollout.maxUnavailable"},
		{"maxUnavailable 101%", func(o map[string]any) { rollout(o)["maxUnavailable"] = "101%" }, "spec.rollout.maxUnavailable"},
		{"maxUnavailable word", func(o map[string]any) { rollout(o)["maxUnavailable"] = "all" }, "spec.rollout.maxUnavailable"},
		{"maxStaging 0", func(o map[string]any) { rollout(o)["maxStaging"] = 0 }, "spec.rollout.maxStaging"},
		{"maxStaging 250%", func(o map[string]any) { rollout(o)["maxStaging"] = "250%" }, "spec.rollout.maxStaging"},
		{"drainTimeout zero", func(o map[string]any) { rollout(o)["drainTimeout"] = "0s" }, "spec.rollout.drainTimeout"},
		{"drainTimeout negative", func(o map[string]any) { rollout(o)["drainTimeout"] = "-5m" }, "spec.rollout.drainTimeout"},
		{"rebootTimeout unparsable", func(o map[string]any) { rollout(o)["rebootTimeout"] = "thirty" }, "spec.rollout.rebootTimeout"},
		{"stageTimeout below 1m", func(o map[string]any) { rollout(o)["stageTimeout"] = "59s" }, "spec.rollout.stageTimeout"},
		{"stageTimeout above 24h", func(o map[string]any) { rollout(o)["stageTimeout"] = "24h1m" }, "spec.rollout.stageTimeout"},
		{"stageTimeout unparsable", func(o map[string]any) { rollout(o)["stageTimeout"] = "an hour" }, "spec.rollout.stageTimeout"},
		{"haltAfterFailures 0", func(o map[string]any) { rollout(o)["haltAfterFailures"] = 0 }, "spec.rollout.haltAfterFailures"},
		{"unknown rebootPolicy", func(o map[string]any) { spec(o)["rebootPolicy"] = "Sometimes" }, "spec.rebootPolicy"},
		{"imagePullSecret not a name", func(o map[string]any) { spec(o)["imagePullSecret"] = "../other/secret" }, "spec.imagePullSecret"},
		{"imagePullSecret upper case", func(o map[string]any) { spec(o)["imagePullSecret"] = "Pull" }, "spec.imagePullSecret"},
		{"window timeZone Local", func(o map[string]any) {
			rollout(o)["windows"] = []any{map[string]any{"start": "02:00", "duration": "1h", "timeZone": "Local"}}
		}, "spec.rollout.windows[0].timeZone"},
		{"requireSignedImages a string", func(o map[string]any) { spec(o)["requireSignedImages"] = "yes" }, "spec.requireSignedImages"},
		{"name too long", func(o map[string]any) {
			o["metadata"].(map[string]any)["name"] = strings.Repeat("p", 51)
		}, "metadata.name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := pool("bad-"+strings.ReplaceAll(strings.ToLower(tc.name), " ", "-"), tc.mutate)
			err := c.Create(ctx, u)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create = %v, want Invalid", err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error does not name %s: %v", tc.field, err)
			}
		})
	}
}

func bootcNode(name, desired string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "fleet.bootc.dev/v1alpha1",
		"kind":       "BootcNode",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{"pool": "workers", "desiredImage": desired},
	}}
}

func TestBootcNodeDesiredImage(t *testing.T) {
	ctx, c := needEnv(t)
	if err := c.Create(ctx, bootcNode("node-pinned", "quay.io/example/os@"+digest)); err != nil {
		t.Fatalf("digest-pinned desiredImage rejected: %v", err)
	}
	if err := c.Create(ctx, bootcNode("node-empty", "")); err != nil {
		t.Fatalf("empty desiredImage rejected: %v", err)
	}
	for name, img := range map[string]string{
		"node-tag":        "quay.io/example/os:42",
		"node-tag-digest": "quay.io/example/os:42@" + digest,
		"node-shell":      "quay.io/os@" + digest + "`id`",
	} {
		err := c.Create(ctx, bootcNode(name, img))
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.desiredImage") {
			t.Errorf("desiredImage %q: got %v, want Invalid naming spec.desiredImage", img, err)
		}
	}
	bad := bootcNode("node-bad-phase", "")
	if err := c.Create(ctx, bad); err != nil {
		t.Fatal(err)
	}
	bad.Object["status"] = map[string]any{"phase": "Exploding"}
	err := c.Status().Update(ctx, bad)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "status.phase") {
		t.Fatalf("status.phase Exploding: got %v", err)
	}
	// What an agent lists as its grants is bounded and shaped by the schema.
	grant := func(f func(g map[string]any)) map[string]any {
		g := map[string]any{"lease": "workers-stage-0", "uid": "6b7e6b3c-0c1d-4a8e-9c57-3c1f0d1e2a3b", "leaseTransitions": int64(1)}
		f(g)
		return g
	}
	for what, g := range map[string]map[string]any{
		"status.grants[0].uid":              grant(func(g map[string]any) { g["uid"] = strings.Repeat("u", 65) }),
		"status.grants[0].released":         grant(func(g map[string]any) { g["released"] = "not a reason" }),
		"status.grants[0].leaseTransitions": grant(func(g map[string]any) { g["leaseTransitions"] = int64(0) }),
	} {
		if err := c.Get(ctx, client.ObjectKeyFromObject(bad), bad); err != nil {
			t.Fatal(err)
		}
		bad.Object["status"] = map[string]any{"grants": []any{g}}
		err := c.Status().Update(ctx, bad)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), what) {
			t.Errorf("%s: got %v, want Invalid naming it", what, err)
		}
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(bad), bad); err != nil {
		t.Fatal(err)
	}
	bad.Object["status"] = map[string]any{"grants": []any{grant(func(g map[string]any) { g["released"] = "StageFailed" })}}
	if err := c.Status().Update(ctx, bad); err != nil {
		t.Fatalf("a valid released grant rejected: %v", err)
	}
	// The soft-reboot count is systemd's uint32.
	for _, n := range []int64{-1, 1 << 32} {
		if err := c.Get(ctx, client.ObjectKeyFromObject(bad), bad); err != nil {
			t.Fatal(err)
		}
		bad.Object["status"] = map[string]any{"softRebootCount": n}
		if err := c.Status().Update(ctx, bad); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "status.softRebootCount") {
			t.Errorf("softRebootCount %d: got %v, want Invalid naming it", n, err)
		}
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(bad), bad); err != nil {
		t.Fatal(err)
	}
	bad.Object["status"] = map[string]any{"softRebootCount": int64(1<<32 - 1)}
	if err := c.Status().Update(ctx, bad); err != nil {
		t.Fatalf("softRebootCount 4294967295 rejected: %v", err)
	}
	// Everything else an agent writes is shaped and bounded too: it is the
	// outside input the coordinator copies into pool conditions and Events.
	dep := func(k, v string) map[string]any { return map[string]any{"image": "quay.io/example/os:1", k: v} }
	for what, st := range map[string]map[string]any{
		"status.bootID":           {"bootID": "not-a-boot-id"},
		"status.reason":           {"reason": "not CamelCase"},
		"status.message":          {"message": strings.Repeat("m", fleetv1.MaxStatusMessage+1)},
		"status.agentVersion":     {"agentVersion": strings.Repeat("v", 129)},
		"status.booted.digest":    {"booted": dep("digest", "sha256:abc")},
		"status.staged.image":     {"staged": dep("image", strings.Repeat("i", 1025))},
		"status.rollback.version": {"rollback": dep("version", strings.Repeat("1", 257))},
	} {
		if err := c.Get(ctx, client.ObjectKeyFromObject(bad), bad); err != nil {
			t.Fatal(err)
		}
		bad.Object["status"] = st
		if err := c.Status().Update(ctx, bad); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), what) {
			t.Errorf("%s: got %v, want Invalid naming it", what, truncateErr(err))
		}
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(bad), bad); err != nil {
		t.Fatal(err)
	}
	bad.Object["status"] = map[string]any{"bootID": "6b7e6b3c-0c1d-4a8e-9c57-3c1f0d1e2a3b", "reason": "WaitingForStageGrant",
		"message": strings.Repeat("m", fleetv1.MaxStatusMessage), "booted": dep("digest", digest)}
	if err := c.Status().Update(ctx, bad); err != nil {
		t.Fatalf("a status at the bounds rejected: %v", truncateErr(err))
	}
}

func truncateErr(err error) string {
	if err == nil {
		return "<nil>"
	}
	return text.Truncate(err.Error(), 400)
}

func TestStatusWriteKeepsGeneration(t *testing.T) {
	ctx, c := needEnv(t)
	p := &fleetv1.BootcNodePool{
		ObjectMeta: metav1.ObjectMeta{Name: "gen"},
		Spec: fleetv1.BootcNodePoolSpec{
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "gen"}},
			Image:        "quay.io/example/os:42",
		},
	}
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	gen := p.Generation
	p.Status.Nodes, p.Status.Updated, p.Status.TargetImage = 4, 2, "quay.io/example/os@"+digest
	if err := c.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	if p.Generation != gen || p.Status.Nodes != 4 {
		t.Fatalf("status write: generation %d -> %d, nodes %d", gen, p.Generation, p.Status.Nodes)
	}
	p.Spec.Rollout.Paused = true
	if err := c.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	if p.Generation != gen+1 {
		t.Fatalf("spec write: generation %d -> %d, want +1", gen, p.Generation)
	}

	n := &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: "gen-node"}, Spec: fleetv1.BootcNodeSpec{Pool: "gen"}}
	if err := c.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	ngen := n.Generation
	n.Status.Phase, n.Status.BootID, n.Status.SoftRebootCount = fleetv1.PhaseIdle, "6b7e6b3c-0c1d-4a8e-9c57-3c1f0d1e2a3b", 1
	if err := c.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	if n.Generation != ngen {
		t.Fatalf("BootcNode status write bumped generation %d -> %d", ngen, n.Generation)
	}
}

// TestPrinterColumns asks for a Table, as kubectl get does.
func TestPrinterColumns(t *testing.T) {
	ctx, c := needEnv(t)
	p := pool("table", func(o map[string]any) { rollout(o)["maxUnavailable"] = 2 })
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	bn := bootcNode("table-node", "quay.io/example/os@"+digest)
	// The coordinator's view, from its annotations (Why is priority 1: in
	// the Table, shown by -o wide).
	bn.SetAnnotations(map[string]string{fleetv1.AnnotationRolloutState: fleetv1.RolloutWaitingForRebootSlot,
		fleetv1.AnnotationRolloutReason: "staged; waiting for a reboot slot"})
	if err := c.Create(ctx, bn); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		resource string
		columns  []string
		row      []string // cells that must appear in the first matching row
		name     string
	}{
		{"bootcnodepools", []string{"Name", "Image", "Nodes", "Updated", "Staging", "Rebooting", "Degraded", "Quiet", "Target", "Age"}, []string{"table", "quay.io/example/os:42"}, "table"},
		{"bootcnodes", []string{"Name", "Pool", "Phase", "Booted", "Desired", "Rollout", "Why", "Reason", "Age"},
			[]string{"table-node", "workers", "quay.io/example/os@" + digest, fleetv1.RolloutWaitingForRebootSlot, "staged; waiting for a reboot slot"}, "table-node"},
	}
	rc, err := rest.RESTClientFor(restConfigFor(env.Config))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		raw, err := rc.Get().AbsPath("/apis/fleet.bootc.dev/v1alpha1", tc.resource, tc.name).
			SetHeader("Accept", "application/json;as=Table;g=meta.k8s.io;v=v1").DoRaw(ctx)
		if err != nil {
			t.Fatalf("%s: %v", tc.resource, err)
		}
		var table metav1.Table
		if err := json.Unmarshal(raw, &table); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, col := range table.ColumnDefinitions {
			got = append(got, col.Name)
		}
		if strings.Join(got, ",") != strings.Join(tc.columns, ",") {
			t.Errorf("%s columns = %v, want %v", tc.resource, got, tc.columns)
		}
		if len(table.Rows) != 1 {
			t.Fatalf("%s: %d rows", tc.resource, len(table.Rows))
		}
		cells := make([]string, 0, len(table.Rows[0].Cells))
		for _, cell := range table.Rows[0].Cells {
			b, _ := json.Marshal(cell)
			cells = append(cells, strings.Trim(string(b), `"`))
		}
		for _, want := range tc.row {
			if !contains(cells, want) {
				t.Errorf("%s row %v lacks %q", tc.resource, cells, want)
			}
		}
	}
}

func restConfigFor(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &fleetv1.GroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = unstructuredCodecs{}
	return c
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestCRDPatternsMatchImageref keeps the CRD's image patterns and the Go
// validation the programs use identical.
func TestCRDPatternsMatchImageref(t *testing.T) {
	read := func(file string) *apiextensionsv1.CustomResourceDefinition {
		b, err := os.ReadFile(filepath.Join(envtest.CRDDir(), file))
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(b, crd); err != nil {
			t.Fatal(err)
		}
		return crd
	}
	poolSchema := read("fleet.bootc.dev_bootcnodepools.yaml").Spec.Versions[0].Schema.OpenAPIV3Schema
	if got := poolSchema.Properties["spec"].Properties["image"].Pattern; got != imageref.Pattern {
		t.Errorf("BootcNodePool spec.image pattern\n got %s\nwant %s", got, imageref.Pattern)
	}
	nodeSchema := read("fleet.bootc.dev_bootcnodes.yaml").Spec.Versions[0].Schema.OpenAPIV3Schema
	if got := nodeSchema.Properties["spec"].Properties["desiredImage"].Pattern; got != "^$|"+imageref.PinnedPattern {
		t.Errorf("BootcNode spec.desiredImage pattern\n got %s\nwant %s", got, imageref.PinnedPattern)
	}
	var hostRule bool
	for _, r := range poolSchema.Properties["spec"].Properties["image"].XValidations {
		hostRule = hostRule || r.Rule == imageref.HostRule
	}
	if !hostRule {
		t.Errorf("BootcNodePool spec.image lacks the rule imageref.HostRule %q", imageref.HostRule)
	}
	if got := poolSchema.Properties["spec"].Properties["image"].MaxLength; got == nil || *got != imageref.MaxLength {
		t.Errorf("spec.image maxLength = %v, want %d", got, imageref.MaxLength)
	}
}
