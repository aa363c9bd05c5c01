// Package packaging installs bootc-fleet the two ways the README shows,
// `kubectl apply -k packaging/` and `helm install bootc-fleet packaging/chart`,
// each on an empty real API server (Node authorizer, NodeRestriction), and
// checks they make the same objects, object by object; the chart's generated
// parts cannot drift from packaging/ unnoticed (`make verify` also checks
// them), nor its Deployment from packaging/coordinator/deployment.yaml.
//
// Needs KUBEBUILDER_ASSETS with kube-apiserver, etcd and kubectl (`make test`
// builds them) and builds helm once (packaging/install-helm.sh).
package packaging

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	tenv "github.com/bootc-fleet/bootc-fleet/tests/envtest"
	"github.com/bootc-fleet/bootc-fleet/tests/release"
)

var (
	root      = tenv.RepoRoot()
	helmOnce  sync.Once
	helmPath  string
	helmError error
)

// tools returns kubectl (from KUBEBUILDER_ASSETS) and helm (built once).
func tools(t *testing.T) (kubectl, helm string) {
	t.Helper()
	tenv.SkipIfUnavailable(t)
	kubectl = filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		if os.Getenv("BOOTC_FLEET_REQUIRE_ENVTEST") == "1" {
			t.Fatalf("kubectl missing in KUBEBUILDER_ASSETS (build it with ENVTEST_KUBECTL=1, as `make test` does): %v", err)
		}
		t.Skipf("skipping: no kubectl in KUBEBUILDER_ASSETS: %v", err)
	}
	helmOnce.Do(func() {
		out, err := exec.Command("bash", filepath.Join(root, "packaging", "install-helm.sh")).Output()
		helmPath, helmError = strings.TrimSpace(string(out)), err
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			helmError = fmt.Errorf("%w\n%s", err, ee.Stderr)
		}
	})
	if helmError != nil {
		t.Fatalf("building helm: %v", helmError)
	}
	return kubectl, helmPath
}

// cluster is an empty API server configured as tests/envtest configures
// every other (production authorization and admission), with no CRDs and no
// namespace: the installs under test create them.
type cluster struct {
	kubeconfig string
}

func start(t *testing.T, name string) cluster {
	t.Helper()
	env := &envtest.Environment{ControlPlaneStartTimeout: 2 * time.Minute, ControlPlaneStopTimeout: time.Minute}
	args := env.ControlPlane.GetAPIServer().Configure()
	args.Set("authorization-mode", tenv.AuthorizationMode)
	args.Set("enable-admission-plugins", tenv.AdmissionPlugins)
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting the %s API server: %v", name, err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	u, err := env.AddUser(envtest.User{Name: "bootc-fleet-admin", Groups: []string{"system:masters"}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "kubeconfig-"+name)
	if err := os.WriteFile(p, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return cluster{kubeconfig: p}
}

// run runs a command from the repository root with KUBECONFIG pointing at c.
func (c cluster) run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig, "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(name), strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.Bytes()
}

type object = map[string]any

// key names an object: kind, namespace and name.
func key(o object) string {
	md, _ := o["metadata"].(object)
	ns, _ := md["namespace"].(string)
	name, _ := md["name"].(string)
	kind, _ := o["kind"].(string)
	return kind + " " + ns + "/" + name
}

// documents splits multi-document YAML into objects.
func documents(t *testing.T, b []byte) map[string]object {
	t.Helper()
	out := map[string]object{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if len(o) == 0 {
			continue
		}
		k := key(o)
		if _, dup := out[k]; dup {
			t.Errorf("%s rendered twice", k)
		}
		out[k] = o
	}
	return out
}

// list turns `kubectl ... -o json` output (one object or a List) into objects.
func list(t *testing.T, b []byte) map[string]object {
	t.Helper()
	var o object
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatalf("kubectl output: %v\n%s", err, b)
	}
	out := map[string]object{}
	items, ok := o["items"].([]any)
	if !ok {
		items = []any{o}
	}
	for _, it := range items {
		obj := it.(object)
		out[key(obj)] = obj
	}
	return out
}

// installedBy are the marks an installer leaves that are not part of the
// object: kubectl's last-applied configuration, Helm's release annotations
// and managed-by label.
var installedBy = map[string][]string{
	"annotations": {"kubectl.kubernetes.io/last-applied-configuration", "meta.helm.sh/release-name", "meta.helm.sh/release-namespace", "deprecated.daemonset.template.generation"},
	"labels":      {"app.kubernetes.io/managed-by"},
}

// normalize drops what the server assigns per object (identity, versions,
// timestamps, status, a Service's cluster IPs) and the installers' marks, so
// two installs of the same objects compare equal.
func normalize(o object) object {
	b, _ := json.Marshal(o)
	var c object
	_ = json.Unmarshal(b, &c)
	delete(c, "status")
	md, _ := c["metadata"].(object)
	for _, f := range []string{"uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"} {
		delete(md, f)
	}
	for field, keys := range installedBy {
		m, _ := md[field].(object)
		for _, k := range keys {
			delete(m, k)
		}
		if m != nil && len(m) == 0 {
			delete(md, field)
		}
	}
	if c["kind"] == "Service" {
		spec, _ := c["spec"].(object)
		for _, f := range []string{"clusterIP", "clusterIPs"} {
			delete(spec, f)
		}
	}
	return c
}

// get reads the live objects of keys from c.
func (c cluster) get(t *testing.T, kubectl string, rendered map[string]object) map[string]object {
	t.Helper()
	live := map[string]object{}
	for k, o := range rendered {
		md := o["metadata"].(object)
		args := []string{"get", "-o", "json", strings.ToLower(o["kind"].(string)) + "." + group(o), md["name"].(string)}
		if ns, _ := md["namespace"].(string); ns != "" {
			args = append(args, "-n", ns)
		}
		live[k] = list(t, c.run(t, kubectl, args...))[k]
	}
	return live
}

// group is the API group of o ("" for core, written as kubectl's "v1" form).
func group(o object) string {
	gv := o["apiVersion"].(string)
	if i := strings.Index(gv, "/"); i >= 0 {
		return gv[:i]
	}
	return ""
}

// same reports every object that differs between a and b (and every one
// that only one has).
func same(t *testing.T, what string, a, b map[string]object) {
	t.Helper()
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		x, inA := a[k]
		y, inB := b[k]
		switch {
		case !inA || !inB:
			t.Errorf("%s: %s is only in one (kustomize: %v, helm: %v)", what, k, inA, inB)
		case !reflect.DeepEqual(normalize(x), normalize(y)):
			xa, _ := yaml.Marshal(normalize(x))
			ya, _ := yaml.Marshal(normalize(y))
			t.Errorf("%s: %s differs\n--- kustomize:\n%s--- helm:\n%s", what, k, xa, ya)
		}
	}
}

func TestKustomizeAndHelmInstallTheSameObjects(t *testing.T) {
	kubectl, helm := tools(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The README's commands are the ones run here.
	for _, cmd := range []string{"kubectl apply -k packaging/", "helm install bootc-fleet packaging/chart"} {
		if !bytes.Contains(readme, []byte("\n"+cmd+"\n")) {
			t.Errorf("README.md does not show %q on a line of its own", cmd)
		}
	}

	var kc, hc cluster
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); kc = start(t, "kustomize") }()
	go func() { defer wg.Done(); hc = start(t, "helm") }()
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	kRendered := documents(t, kc.run(t, kubectl, "kustomize", "packaging/"))
	hRendered := documents(t, hc.run(t, helm, "template", "bootc-fleet", "packaging/chart"))
	same(t, "rendered", kRendered, hRendered)
	var kinds []string
	for k := range kRendered {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	t.Logf("%d objects: %s", len(kinds), strings.Join(kinds, "; "))
	for _, want := range []string{"Namespace /bootc-fleet-system", "Deployment bootc-fleet-system/bootc-fleet-coordinator", "Service bootc-fleet-system/bootc-fleet-coordinator-metrics",
		"CustomResourceDefinition /bootcnodepools.fleet.bootc.dev", "CustomResourceDefinition /bootcnodes.fleet.bootc.dev", "ClusterRole /bootc-fleet-coordinator", "ClusterRole /bootc-fleet-agent"} {
		if _, ok := kRendered[want]; !ok {
			t.Errorf("packaging/ renders no %s", want)
		}
	}
	vap := 0
	for k := range kRendered {
		if strings.HasPrefix(k, "ValidatingAdmissionPolicy ") {
			vap++
		}
	}
	if vap == 0 {
		t.Errorf("packaging/ renders no ValidatingAdmissionPolicy")
	}
	v, err := release.Version()
	if err != nil {
		t.Fatal(err)
	}
	dep := kRendered["Deployment bootc-fleet-system/bootc-fleet-coordinator"]
	b, _ := json.Marshal(dep)
	if want := `"image":"quay.io/bootc-fleet/bootc-fleet-coordinator:` + v + `"`; !bytes.Contains(b, []byte(want)) {
		t.Errorf("the kustomization does not pin the coordinator image to the release %s: %s", v, b)
	}
	for _, want := range []string{`"--leader-elect"`, `"livenessProbe"`, `"readinessProbe"`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("the coordinator Deployment has no %s", want)
		}
	}

	// The installs, as the README says: each on its own empty server.
	kc.run(t, kubectl, "apply", "-k", "packaging/")
	hc.run(t, helm, "install", "bootc-fleet", "packaging/chart")
	kLive, hLive := kc.get(t, kubectl, kRendered), hc.get(t, kubectl, hRendered)
	same(t, "installed", kLive, hLive)
	for k, o := range hLive {
		if l, _ := o["metadata"].(object)["labels"].(object); l["app.kubernetes.io/managed-by"] != "Helm" {
			t.Errorf("%s was not installed by helm (no app.kubernetes.io/managed-by: Helm)", k)
		}
	}

	// Each rendering, server-side dry-run over the other's install, changes
	// nothing: a kustomize install can move to the chart and back.
	same(t, "helm's rendering applied (--dry-run=server) over kustomize's install", kLive,
		list(t, kc.run(t, kubectl, "apply", "--dry-run=server", "-o", "json", "-f", writeTemp(t, hc.run(t, helm, "template", "bootc-fleet", "packaging/chart")))))
	same(t, "kustomize's rendering applied (--dry-run=server) over helm's install", list(t, hc.run(t, kubectl, "apply", "--dry-run=server", "-o", "json", "-k", "packaging/")), hLive)
}

func writeTemp(t *testing.T, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rendered.yaml")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The values a user sets render into a Deployment the API server accepts.
func TestChartValues(t *testing.T) {
	kubectl, helm := tools(t)
	c := start(t, "values")
	c.run(t, kubectl, "apply", "-k", "packaging/")
	out := c.run(t, helm, "template", "bootc-fleet", "packaging/chart",
		"--set", "replicas=3", "--set", "logLevel=debug", "--set", "image.tag=v9.9.9", "--set", "image.pullPolicy=Always",
		"--set", "registries.insecure={registry.lab:5000,10.0.0.5}",
		"--set", "registries.caBundle.configMap=registry-ca", "--set", "registries.auth.secret=registry-auth",
		"--set", "imagePullSecrets[0].name=quay-pull", "--set", "resources.limits.memory=1Gi",
		"--set", "extraArgs={--workers=8}")
	objs := list(t, c.run(t, kubectl, "apply", "--dry-run=server", "-o", "json", "-f", writeTemp(t, out)))
	dep := objs["Deployment bootc-fleet-system/bootc-fleet-coordinator"]
	if dep == nil {
		t.Fatalf("no Deployment in the dry-run output")
	}
	var d struct {
		Spec struct {
			Replicas int `json:"replicas"`
			Template struct {
				Spec struct {
					ImagePullSecrets []struct{ Name string } `json:"imagePullSecrets"`
					Containers       []struct {
						Image           string   `json:"image"`
						ImagePullPolicy string   `json:"imagePullPolicy"`
						Args            []string `json:"args"`
						Resources       struct {
							Limits map[string]string `json:"limits"`
						} `json:"resources"`
						VolumeMounts []struct {
							Name, MountPath string
						} `json:"volumeMounts"`
					} `json:"containers"`
					Volumes []struct {
						Name      string
						ConfigMap *struct{ Name string } `json:"configMap"`
						Secret    *struct {
							SecretName string `json:"secretName"`
						} `json:"secret"`
					} `json:"volumes"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	b, _ := json.Marshal(dep)
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	ps := d.Spec.Template.Spec
	if d.Spec.Replicas != 3 || len(ps.Containers) != 1 || len(ps.ImagePullSecrets) != 1 || ps.ImagePullSecrets[0].Name != "quay-pull" {
		t.Fatalf("replicas %d, %d containers, imagePullSecrets %+v; want 3, 1, [quay-pull]", d.Spec.Replicas, len(ps.Containers), ps.ImagePullSecrets)
	}
	ctr := ps.Containers[0]
	if ctr.Image != "quay.io/bootc-fleet/bootc-fleet-coordinator:v9.9.9" || ctr.ImagePullPolicy != "Always" || ctr.Resources.Limits["memory"] != "1Gi" {
		t.Errorf("image %q pullPolicy %q memory limit %q", ctr.Image, ctr.ImagePullPolicy, ctr.Resources.Limits["memory"])
	}
	args := strings.Join(ctr.Args, " ")
	for _, want := range []string{"--leader-elect", "--log-level=debug", "--insecure-registry=registry.lab:5000", "--insecure-registry=10.0.0.5",
		"--registry-ca-file=/etc/bootc-fleet/registry-ca/ca.crt", "--registry-auth-file=/etc/bootc-fleet/registry-auth/.dockerconfigjson", "--workers=8"} {
		if !strings.Contains(" "+args+" ", " "+want+" ") {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	mounts := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	vols := map[string]string{}
	for _, v := range ps.Volumes {
		switch {
		case v.ConfigMap != nil:
			vols[v.Name] = "configMap " + v.ConfigMap.Name
		case v.Secret != nil:
			vols[v.Name] = "secret " + v.Secret.SecretName
		}
	}
	if mounts["registry-ca"] != "/etc/bootc-fleet/registry-ca" || mounts["registry-auth"] != "/etc/bootc-fleet/registry-auth" ||
		vols["registry-ca"] != "configMap registry-ca" || vols["registry-auth"] != "secret registry-auth" {
		t.Errorf("mounts %v volumes %v", mounts, vols)
	}
}

// Every flag the chart can render is one the coordinator has.
func TestChartFlagsExist(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bootc-fleet-coordinator")
	build := exec.Command("go", "build", "-o", bin, "./cmd/bootc-fleet-coordinator")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the coordinator: %v\n%s", err, out)
	}
	help, _ := exec.Command(bin, "--help").CombinedOutput() // flag's -help exits 0 or 2 by Go version
	raw, err := os.ReadFile(filepath.Join(root, "packaging/chart/templates/coordinator/deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	flags := regexp.MustCompile(`(?m)^\s*- (--[a-z-]+)`).FindAllStringSubmatch(string(raw), -1)
	if len(flags) < 5 {
		t.Fatalf("found only %d flags in the chart's Deployment", len(flags))
	}
	for _, f := range flags {
		if !strings.Contains(string(help), "  -"+strings.TrimPrefix(f[1], "--")+" ") && !strings.Contains(string(help), "  -"+strings.TrimPrefix(f[1], "--")+"\n") {
			t.Errorf("the chart renders %s, which bootc-fleet-coordinator --help does not list", f[1])
		}
	}
}

// The committed pins agree with the release CHANGELOG.md names.
func TestReleasePins(t *testing.T) {
	v, err := release.Version()
	if err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal([]byte(read("packaging/chart/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	if chart.AppVersion != v || "v"+chart.Version != v {
		t.Errorf("Chart.yaml version %q appVersion %q, want %q and %q", chart.Version, chart.AppVersion, strings.TrimPrefix(v, "v"), v)
	}
	if k := read("packaging/kustomization.yaml"); !strings.Contains(k, "newTag: "+v+"\n") || strings.Contains(k, "latest") {
		t.Errorf("packaging/kustomization.yaml does not pin newTag: %s:\n%s", v, k)
	}
	for _, p := range []string{"docs/image.md", "packaging/image/Containerfile"} {
		for _, m := range regexp.MustCompile(`bootc-fleet-agent:([0-9A-Za-z_.-]*[0-9A-Za-z_])`).FindAllStringSubmatch(read(p), -1) {
			if m[1] != v {
				t.Errorf("%s names bootc-fleet-agent:%s, want the release %s", p, m[1], v)
			}
		}
	}
}

// The README shows the same bootc Containerfile as docs/image.md, which
// tests/image builds.
func TestReadmeShowsTheTestedContainerfile(t *testing.T) {
	block := regexp.MustCompile("(?s)```dockerfile\n(.*?)```")
	var got []string
	for _, p := range []string{"README.md", "docs/image.md"} {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		m := block.FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s has no ```dockerfile block", p)
		}
		got = append(got, string(m[1]))
	}
	if got[0] != got[1] {
		t.Errorf("README.md's Containerfile:\n%s\ndiffers from docs/image.md's (the one tests/image builds):\n%s", got[0], got[1])
	}
}
