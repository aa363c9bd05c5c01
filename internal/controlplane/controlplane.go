// Package controlplane starts a real kube-apiserver + etcd (controller-runtime's
// envtest) with the bootc-fleet CRDs installed, for the demo and, through
// tests/envtest, the tests of every package. The API server is
// production-shaped: --authorization-mode=Node,RBAC and the NodeRestriction
// admission plugin, as on kubeadm, EKS or GKE.
//
// The binaries come from KUBEBUILDER_ASSETS, which `make test` and `make demo`
// build once from the Go module proxy (tests/envtest/install-envtest.sh).
package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// The API server's --authorization-mode and --enable-admission-plugins.
const (
	AuthorizationMode = "Node,RBAC"
	// OwnerReferencesPermissionEnforcement is on in OpenShift: setting an
	// owner reference with blockOwnerDeletion needs update on the owner's
	// finalizers subresource, which the coordinator's RBAC must grant.
	AdmissionPlugins = "NodeRestriction,OwnerReferencesPermissionEnforcement"
)

// Env is a running API server with the CRDs installed.
type Env struct {
	Config *rest.Config
	Client client.Client
	Scheme *k8sruntime.Scheme
	env    *crenvtest.Environment
}

// Scheme returns a scheme with the built-in kinds and fleet.bootc.dev/v1alpha1.
func Scheme() *k8sruntime.Scheme {
	s := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := fleetv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// RepoRoot is the root of this repository (found from this file's path).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// CRDDir is where the generated CRD YAML lives.
func CRDDir() string { return filepath.Join(RepoRoot(), "packaging", "crd") }

// Available says whether an API server can be started, and why not.
func Available() (bool, string) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		return false, "KUBEBUILDER_ASSETS is not set (run `make test`, which builds kube-apiserver and etcd once)"
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return false, fmt.Sprintf("%s missing in KUBEBUILDER_ASSETS=%s", b, dir)
		}
	}
	return true, ""
}

// Start starts an API server the caller stops with Stop.
func Start() (*Env, error) {
	if ok, why := Available(); !ok {
		return nil, fmt.Errorf("no API server: %s", why)
	}
	s := Scheme()
	env := &crenvtest.Environment{
		CRDDirectoryPaths:        []string{CRDDir()},
		ErrorIfCRDPathMissing:    true,
		Scheme:                   s,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	// Production-shaped authorization and admission, as kubeadm, EKS and GKE
	// run them: node identities (system:node:<name>, group system:nodes) and
	// their RBAC are part of what the tests check, and on a real cluster the
	// Node authorizer and the NodeRestriction admission plugin stand between a
	// node's credentials and the API. NodeRestriction refuses a node every
	// create, update and delete of a Lease outside kube-node-lease, so a test
	// against a laxer server could pass with a protocol that fails on every
	// real cluster. tests/envtest/envtest_test.go checks both are on.
	//
	// controller-runtime's envtest (v0.25.2) sets no enable-admission-plugins
	// of its own (only disable-admission-plugins=ServiceAccount, kept), so
	// this adds NodeRestriction (and OwnerReferencesPermissionEnforcement) to
	// the API server's default plugins
	// (ValidatingAdmissionPolicy among them) rather than replacing any.
	args := env.ControlPlane.GetAPIServer().Configure()
	args.Set("authorization-mode", AuthorizationMode)
	args.Set("enable-admission-plugins", AdmissionPlugins)
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	e := &Env{Config: cfg, Client: c, Scheme: s, env: env}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lease.Namespace}}); err != nil {
		e.Stop()
		return nil, fmt.Errorf("creating namespace %s: %w", lease.Namespace, err)
	}
	return e, nil
}

// Stop stops the API server and etcd.
func (e *Env) Stop() {
	if e != nil && e.env != nil {
		_ = e.env.Stop()
	}
}

// AddUser returns a rest.Config authenticated as the given user and groups
// (a real client certificate signed by the API server's CA).
func (e *Env) AddUser(name string, groups ...string) (*rest.Config, error) {
	u, err := e.env.AddUser(crenvtest.User{Name: name, Groups: groups}, e.Config)
	if err != nil {
		return nil, err
	}
	return u.Config(), nil
}

// KubeconfigFor writes a kubeconfig file for the given user and returns its path.
func (e *Env) KubeconfigFor(dir, name string, groups ...string) (string, error) {
	u, err := e.env.AddUser(crenvtest.User{Name: name, Groups: groups}, e.Config)
	if err != nil {
		return "", err
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "kubeconfig-"+name)
	return p, os.WriteFile(p, kc, 0o600)
}

// AdminKubeconfig writes a kubeconfig for a cluster-admin user and returns its path.
func (e *Env) AdminKubeconfig(dir string) (string, error) {
	return e.KubeconfigFor(dir, "bootc-fleet-admin", "system:masters")
}
