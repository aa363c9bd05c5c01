package kubectl

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

var env *envtest.Env

func TestMain(m *testing.M) { envtest.Main(m, &env) }

// run runs the plugin in-process, as the binary does, against the kubeconfig
// kc, with the fixed clock; it returns what a terminal would show.
func run(t *testing.T, kc string, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := Run(ctx, Options{Out: &out, ErrOut: &errOut, Now: func() time.Time { return now }, Version: "v0.0.0-test"},
		append([]string{"--kubeconfig=" + kc}, args...))
	shown := make([]string, len(args))
	for i, a := range args {
		shown[i] = a
		if strings.ContainsAny(a, " \n#\"") {
			shown[i] = strconv.Quote(a)
		}
	}
	s := "$ kubectl bootc-fleet " + strings.Join(shown, " ") + "\n" + out.String()
	if errOut.Len() > 0 {
		s += "[stderr]\n" + errOut.String()
	}
	return s + fmt.Sprintf("[exit %d]\n", code)
}

// golden compares got with testdata/name.golden (or, with -update, writes it).
func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test ./coordinator/kubectl -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (rerun with -update if the change is intended)\n--- got\n%s--- want\n%s", p, got, want)
	}
}

// TestGolden runs every command against a real API server holding the
// fixture (fixture_test.go) and compares what it prints with the golden
// files. The steps run in order: the changes at the end are checked on the
// API server and undone.
func TestGolden(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	seed(t, env.Client)
	dir := t.TempDir()
	admin, err := env.AdminKubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	nobody, err := env.KubeconfigFor(dir, "nobody")
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		kc   string
		args []string
		// check, when set, looks at the API server after the step.
		check func(t *testing.T)
	}{
		{"version", admin, []string{"--version"}, nil},
		{"status", admin, []string{"status"}, nil},
		{"status-web", admin, []string{"status", "web"}, nil},
		{"status-db", admin, []string{"status", "db"}, nil},
		{"status-json", admin, []string{"status", "-o", "json"}, nil},
		{"status-web-yaml", admin, []string{"status", "web", "-o", "yaml"}, nil},
		{"explain-draining-pdb-events", admin, []string{"explain", "node-a"}, nil},
		{"explain-waiting-reboot", admin, []string{"explain", "node-d"}, nil},
		{"explain-waiting-stage-failed", admin, []string{"explain", "node-f"}, nil},
		{"explain-held-json", admin, []string{"explain", "node-h", "-o", "json"}, nil},
		{"explain-failed", admin, []string{"explain", "db-1"}, nil},
		{"status-app-just-granted", admin, []string{"status", "app"}, nil},
		{"explain-just-granted", admin, []string{"explain", "app-1"}, nil},
		{"explain-just-released", admin, []string{"explain", "app-3", "-o", "yaml"}, nil},
		{"status-done-watch", admin, []string{"status", "done", "--watch"}, nil},
		{"wait-done", admin, []string{"wait", "done"}, nil},
		{"wait-halted", admin, []string{"wait", "db"}, nil},
		{"wait-for-halted", admin, []string{"wait", "db", "--for", "Halted"}, nil},
		{"wait-timeout", admin, []string{"wait", "web", "--timeout", "1s"}, nil},
		{"error-wait-bad-for", admin, []string{"wait", "web", "--for", "Ready"}, nil},
		{"error-wait-not-found", admin, []string{"wait", "nosuch"}, nil},
		{"error-rbac-wait", nobody, []string{"wait", "web"}, nil},
		{"error-pool-not-found", admin, []string{"status", "nosuch"}, nil},
		{"error-node-not-found", admin, []string{"explain", "nosuch"}, nil},
		{"error-not-a-fleet-node", admin, []string{"explain", "plain"}, nil},
		{"error-bad-name", admin, []string{"explain", "Node_A"}, nil},
		{"error-bad-output", admin, []string{"status", "-o", "wide"}, nil},
		{"error-rbac", nobody, []string{"status"}, nil},
		{"error-rbac-pause", nobody, []string{"pause", "web"}, nil},
		{"error-bad-reason", admin, []string{"hold", "node-b", "--reason", "line one\nline two"}, nil},
		{"error-long-reason", admin, []string{"hold", "node-b", "--reason", strings.Repeat("x", MaxHoldReason+1)}, nil},
		{"error-hold-not-found", admin, []string{"hold", "nosuch"}, nil},
		{"pause", admin, []string{"pause", "web"}, func(t *testing.T) { wantPaused(t, "web", true) }},
		{"pause-again", admin, []string{"pause", "web"}, func(t *testing.T) { wantPaused(t, "web", true) }},
		{"status-paused", admin, []string{"status"}, nil},
		{"resume", admin, []string{"resume", "web"}, func(t *testing.T) { wantPaused(t, "web", false) }},
		{"resume-again", admin, []string{"resume", "web"}, func(t *testing.T) { wantPaused(t, "web", false) }},
		{"hold", admin, []string{"hold", "node-b", "--reason", "firmware update, ticket #42"}, func(t *testing.T) { wantHold(t, "node-b", ptrTo("firmware update, ticket #42")) }},
		{"hold-again", admin, []string{"hold", "node-b", "--reason", "firmware update, ticket #42"}, nil},
		{"hold-keeps-reason", admin, []string{"hold", "node-b"}, func(t *testing.T) { wantHold(t, "node-b", ptrTo("firmware update, ticket #42")) }},
		{"hold-new-reason", admin, []string{"hold", "node-b", "--reason="}, func(t *testing.T) { wantHold(t, "node-b", ptrTo("")) }},
		{"release", admin, []string{"release", "node-b"}, func(t *testing.T) { wantHold(t, "node-b", nil) }},
		{"release-again", admin, []string{"release", "node-b"}, func(t *testing.T) { wantHold(t, "node-b", nil) }},
		{"hold-unmanaged", admin, []string{"hold", "plain", "--reason", "lab machine"}, func(t *testing.T) { wantHold(t, "plain", ptrTo("lab machine")) }},
	}
	for _, s := range steps {
		ok := t.Run(s.name, func(t *testing.T) {
			golden(t, s.name, run(t, s.kc, s.args...))
			if s.check != nil {
				s.check(t)
			}
		})
		if !ok && s.check != nil {
			t.Fatalf("step %s failed; later steps depend on it", s.name)
		}
	}
	// Last: these move pool app.
	t.Run("watch-and-wait", func(t *testing.T) { watchAndWait(t, admin) })
}

func ptrTo(s string) *string { return &s }

func wantPaused(t *testing.T, pool string, want bool) {
	t.Helper()
	p := &fleetv1.BootcNodePool{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: pool}, p); err != nil {
		t.Fatal(err)
	}
	if p.Spec.Rollout.Paused != want {
		t.Errorf("pool %s spec.rollout.paused = %t, want %t", pool, p.Spec.Rollout.Paused, want)
	}
	// The merge patch touches nothing else of the spec.
	if p.Spec.Rollout.MaxUnavailable == nil || p.Spec.Rollout.MaxUnavailable.IntValue() != 2 || p.Spec.Image != repo+":v2" {
		t.Errorf("pool %s spec changed beyond paused: %+v", pool, p.Spec)
	}
}

func wantHold(t *testing.T, node string, want *string) {
	t.Helper()
	n := &corev1.Node{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: node}, n); err != nil {
		t.Fatal(err)
	}
	got, ok := n.Annotations[fleetv1.AnnotationHold]
	switch {
	case want == nil && ok:
		t.Errorf("node %s still has %s=%q", node, fleetv1.AnnotationHold, got)
	case want != nil && (!ok || got != *want):
		t.Errorf("node %s: %s=%q (present %t), want %q", node, fleetv1.AnnotationHold, got, ok, *want)
	}
}
