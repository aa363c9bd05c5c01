// Package envtest gives tests a real kube-apiserver + etcd with the
// bootc-fleet CRDs installed (internal/controlplane), production-shaped:
// --authorization-mode=Node,RBAC and the NodeRestriction admission plugin, as
// on kubeadm, EKS or GKE.
//
// The binaries come from KUBEBUILDER_ASSETS, which `make test` builds once
// from the Go module proxy (tests/envtest/install-envtest.sh). Without it a
// test skips with one line saying so, unless BOOTC_FLEET_REQUIRE_ENVTEST=1
// (set by `make test` and CI), where a missing API server is a failure.
package envtest

import (
	"context"
	"fmt"
	"os"
	"testing"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/internal/controlplane"
)

// The API server's --authorization-mode and --enable-admission-plugins.
const (
	AuthorizationMode = controlplane.AuthorizationMode
	AdmissionPlugins  = controlplane.AdmissionPlugins
)

// Env is a running API server with the CRDs installed.
type Env = controlplane.Env

// Scheme returns a scheme with the built-in kinds and fleet.bootc.dev/v1alpha1.
func Scheme() *k8sruntime.Scheme { return controlplane.Scheme() }

// RepoRoot is the root of this repository.
func RepoRoot() string { return controlplane.RepoRoot() }

// CRDDir is where the generated CRD YAML lives.
func CRDDir() string { return controlplane.CRDDir() }

// Available says whether an API server can be started, and why not.
func Available() (bool, string) { return controlplane.Available() }

// Apply creates or replaces every object of the given multi-document YAML
// files with server-side apply, as `kubectl apply --server-side` would.
func Apply(ctx context.Context, c client.Client, files ...string) error {
	return controlplane.Apply(ctx, c, files...)
}

// SkipIfUnavailable skips (or, with BOOTC_FLEET_REQUIRE_ENVTEST=1, fails) tb
// when no API server can be started.
func SkipIfUnavailable(tb testing.TB) {
	tb.Helper()
	if ok, why := Available(); !ok {
		if os.Getenv("BOOTC_FLEET_REQUIRE_ENVTEST") == "1" {
			tb.Fatalf("API server required but unavailable: %s", why)
		}
		tb.Skipf("skipping: no API server: %s", why)
	}
}

// Start starts an API server for one test (or benchmark) and stops it when
// the test ends. The namespace bootc-fleet-system exists.
func Start(tb testing.TB) *Env {
	tb.Helper()
	SkipIfUnavailable(tb)
	e, err := StartShared()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(e.Stop)
	return e
}

// StartShared starts an API server the caller stops with Stop (for TestMain).
func StartShared() (*Env, error) { return controlplane.Start() }

// Main runs a test binary's tests with one API server shared through *env,
// when one can be started. Without one, *env stays nil and tests that need
// it skip through SkipIfUnavailable (or, with BOOTC_FLEET_REQUIRE_ENVTEST=1,
// the binary fails at once).
func Main(m *testing.M, env **Env) {
	os.Exit(func() int {
		if ok, why := Available(); ok {
			e, err := StartShared()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer e.Stop()
			*env = e
		} else if os.Getenv("BOOTC_FLEET_REQUIRE_ENVTEST") == "1" {
			fmt.Fprintln(os.Stderr, "API server required but unavailable: "+why)
			return 1
		}
		return m.Run()
	}())
}
