package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
	"github.com/bootc-fleet/bootc-fleet/tests/testregistry"
)

// A private registry (TLS from a test CA, basic auth): the coordinator, as
// its ServiceAccount under the packaged RBAC, resolves a pool's image with
// the pool's pull secret, and names what is wrong when it cannot: no
// credentials or a wrong password (RegistryUnauthorized), a Secret that is
// missing or of the wrong type (ImagePullSecretInvalid). Then the same
// pools with credentials from a mounted file instead.
func TestPrivateRegistry(t *testing.T) {
	ctx := context.Background()
	reg := testregistry.Start(t)
	const user, password = "fleet", "fleet-secret"
	reg.AddUser(user, password, true)
	img, err := imageref.ParsePinned(reg.PushTagged(t, "fleet/private", "1"))
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, reg.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}

	root := envtest.RepoRoot()
	if err := envtest.Apply(ctx, env.Client, filepath.Join(root, "packaging/rbac/coordinator.yaml")); err != nil {
		t.Fatal(err)
	}
	cfg, err := env.AddUser("system:serviceaccount:bootc-fleet-system:bootc-fleet-coordinator", "system:serviceaccounts", "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	secret := func(name string, typ corev1.SecretType, data []byte) {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lease.Namespace}, Type: typ}
		if typ == corev1.SecretTypeDockerConfigJson {
			s.Data = map[string][]byte{corev1.DockerConfigJsonKey: data}
		} else {
			s.Data = map[string][]byte{"password": data}
		}
		if err := env.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), s) })
	}
	secret("pull-good", corev1.SecretTypeDockerConfigJson, reg.DockerConfig(user, password))
	secret("pull-wrong", corev1.SecretTypeDockerConfigJson, reg.DockerConfig(user, "not-"+password))
	secret("pull-opaque", corev1.SecretTypeOpaque, []byte(password))
	// The coordinator can read its namespace's Secrets by name, and nothing
	// else: not list them, not read another namespace's.
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets(lease.Namespace).List(ctx, metav1.ListOptions{}); err == nil || !strings.Contains(err.Error(), `cannot list resource "secrets"`) {
		t.Fatalf("listing Secrets as the coordinator: %v, want forbidden", err)
	}
	if _, err := cs.CoreV1().Secrets("default").Get(ctx, "anything", metav1.GetOptions{}); err == nil || !strings.Contains(err.Error(), `cannot get resource "secrets" in API group "" in the namespace "default"`) {
		t.Fatalf("reading a Secret in default as the coordinator: %v, want forbidden", err)
	}

	cases := []struct {
		pool, secret string
		want         string // "" resolves to img, else the start of the resolve error
	}{
		{"priv-good", "pull-good", ""},
		{"priv-none", "", "RegistryUnauthorized: "},
		{"priv-wrong", "pull-wrong", "RegistryUnauthorized: "},
		{"priv-missing", "pull-absent", fleetv1.ReasonImagePullSecretInvalid + ": spec.imagePullSecret: Secret bootc-fleet-system/pull-absent not found"},
		{"priv-opaque", "pull-opaque", fleetv1.ReasonImagePullSecretInvalid + `: spec.imagePullSecret: Secret bootc-fleet-system/pull-opaque has type "Opaque", want kubernetes.io/dockerconfigjson`},
	}
	fleets := map[string]*fleet{}
	// Each coordinator gets pools of its own, so no verdict of an earlier
	// one is read as its own.
	mkPool := func(pool, secret string) {
		f := newFleet(t, pool, 1, pinned(reg.Host+"/fleet/private", '0'))
		f.createPool(func(p *fleetv1.BootcNodePool) {
			p.Spec.Image = reg.Host + "/fleet/private:1"
			p.Spec.ImagePullSecret = secret
		})
		fleets[pool] = f
	}
	for _, c := range cases {
		mkPool(c.pool, c.secret)
	}
	check := func(t *testing.T, pool, want string) {
		f := fleets[pool]
		eventually(t, 60*time.Second, pool+" resolved as expected", func() (bool, string) {
			p := f.getPool()
			c := f.condition(fleetv1.PoolDegraded)
			if want == "" {
				return p.Status.TargetImage == img.String() && c.Reason != fleetv1.ReasonResolveFailed, p.Status.TargetImage + " " + c.Message
			}
			return c.Reason == fleetv1.ReasonResolveFailed && strings.Contains(c.Message, want), c.Message
		})
	}

	t.Run("pull secret", func(t *testing.T) {
		stop := startCoordinatorAs(t, cfg, "private", func(o *controller.Options) { o.RegistryCAFile = caFile })
		defer stop()
		for _, c := range cases {
			check(t, c.pool, c.want)
		}
		// Fixing the Secret fixes the pool, without a restart.
		var s corev1.Secret
		if err := env.Client.Get(ctx, clientKey(lease.Namespace, "pull-wrong"), &s); err != nil {
			t.Fatal(err)
		}
		s.Data[corev1.DockerConfigJsonKey] = reg.DockerConfig(user, password)
		if err := env.Client.Update(ctx, &s); err != nil {
			t.Fatal(err)
		}
		check(t, "priv-wrong", "")
	})

	t.Run("auth file", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "config.json")
		if err := os.WriteFile(file, reg.DockerConfig(user, password), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := controller.CheckRegistryAuthFile(file); err != nil {
			t.Fatal(err)
		}
		stop := startCoordinatorAs(t, cfg, "private-file", func(o *controller.Options) {
			o.RegistryCAFile = caFile
			o.RegistryAuthFile = file
		})
		defer stop()
		// The file serves pools without a Secret; a pool's own Secret still
		// comes first and still must exist.
		mkPool("privf-none", "")
		mkPool("privf-wrong", "pull-wrong-again")
		mkPool("privf-missing", "pull-absent")
		secret("pull-wrong-again", corev1.SecretTypeDockerConfigJson, reg.DockerConfig(user, "not-"+password))
		check(t, "privf-none", "")
		check(t, "privf-wrong", "RegistryUnauthorized: ")
		check(t, "privf-missing", fleetv1.ReasonImagePullSecretInvalid)
	})

	t.Run("without the CA", func(t *testing.T) {
		stop := startCoordinatorAs(t, cfg, "private-noca", nil)
		defer stop()
		check(t, "priv-good", "RegistryTLSFailure: ") // resolved before: this verdict is new
	})
}
