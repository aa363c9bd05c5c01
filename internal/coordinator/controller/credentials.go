package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	kauth "github.com/google/go-containerregistry/pkg/authn/kubernetes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// maxDockerConfig bounds a credentials document (a Secret is at most 1 MiB).
const maxDockerConfig = 1 << 20

// registryAuth finds the credentials a pool's image is resolved with: the
// pool's spec.imagePullSecret, then the file mounted into the Deployment.
// Secrets are read one by name, uncached, at each resolution, so the
// coordinator needs only get on Secrets of its own namespace and never
// holds every Secret of that namespace in memory (docs/security.md).
type registryAuth struct {
	reader    client.Reader // the API reader: no informer on Secrets
	namespace string
	file      string // --registry-auth-file; "" for none
}

// errCredentials is a credentials problem a person must fix.
type errCredentials struct{ msg string }

func (e *errCredentials) Error() string { return e.msg }

// keychain returns the credentials for pool's image, nil for anonymous.
func (a *registryAuth) keychain(ctx context.Context, pool *fleetv1.BootcNodePool) (authn.Keychain, error) {
	var chain []authn.Keychain
	if name := pool.Spec.ImagePullSecret; name != "" {
		kc, err := a.fromSecret(ctx, name)
		if err != nil {
			return nil, err
		}
		chain = append(chain, kc)
	}
	if a.file != "" {
		kc, err := a.fromFile()
		if err != nil {
			return nil, err
		}
		chain = append(chain, kc)
	}
	if len(chain) == 0 {
		return nil, nil
	}
	return authn.NewMultiKeychain(chain...), nil
}

func (a *registryAuth) fromSecret(ctx context.Context, name string) (authn.Keychain, error) {
	var s corev1.Secret
	err := a.reader.Get(ctx, client.ObjectKey{Namespace: a.namespace, Name: name}, &s)
	switch {
	case apierrors.IsNotFound(err):
		return nil, &errCredentials{fmt.Sprintf("spec.imagePullSecret: Secret %s/%s not found (it must be in the coordinator's namespace)", a.namespace, name)}
	case apierrors.IsForbidden(err):
		return nil, &errCredentials{fmt.Sprintf("spec.imagePullSecret: reading Secret %s/%s was refused: %v", a.namespace, name, err)}
	case err != nil:
		return nil, fmt.Errorf("spec.imagePullSecret: reading Secret %s/%s: %w", a.namespace, name, err)
	}
	where := fmt.Sprintf("spec.imagePullSecret: Secret %s/%s", a.namespace, name)
	if s.Type != corev1.SecretTypeDockerConfigJson {
		return nil, &errCredentials{fmt.Sprintf("%s has type %q, want %s", where, s.Type, corev1.SecretTypeDockerConfigJson)}
	}
	return parseDockerConfig(where, s.Data[corev1.DockerConfigJsonKey])
}

// fromFile reads the mounted file at each resolution, so a Secret volume's
// update (an atomic symlink swap) is picked up without a restart.
func (a *registryAuth) fromFile() (authn.Keychain, error) {
	where := "--registry-auth-file " + a.file
	f, err := os.Open(a.file)
	if err != nil {
		return nil, &errCredentials{fmt.Sprintf("%s: %v", where, err)}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxDockerConfig+1))
	if err != nil {
		return nil, &errCredentials{fmt.Sprintf("%s: %v", where, err)}
	}
	return parseDockerConfig(where, b)
}

// parseDockerConfig checks a .dockerconfigjson document (docker's
// config.json: {"auths": {"host": {"auth": "..."}}}) and turns it into a
// keychain matching hosts as the kubelet does (go-containerregistry's
// pkg/authn/kubernetes).
func parseDockerConfig(where string, b []byte) (authn.Keychain, error) {
	if len(b) == 0 {
		return nil, &errCredentials{where + " has no " + corev1.DockerConfigJsonKey}
	}
	if len(b) > maxDockerConfig {
		return nil, &errCredentials{fmt.Sprintf("%s is larger than %d bytes", where, maxDockerConfig)}
	}
	var doc struct {
		Auths map[string]json.RawMessage `json:"auths"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, &errCredentials{fmt.Sprintf("%s is not a docker config JSON document: %v", where, err)}
	}
	if len(doc.Auths) == 0 {
		return nil, &errCredentials{where + ` names no registry ("auths" is empty)`}
	}
	s := corev1.Secret{Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{corev1.DockerConfigJsonKey: b}}
	kc, err := kauth.NewFromPullSecrets(context.Background(), []corev1.Secret{s})
	if err != nil {
		return nil, &errCredentials{fmt.Sprintf("%s: %v", where, err)}
	}
	return kc, nil
}

// credentialsReason is the condition reason for a keychain error.
func credentialsReason(err error) string {
	var ce *errCredentials
	if errors.As(err, &ce) {
		return fleetv1.ReasonImagePullSecretInvalid
	}
	return fleetv1.ReasonResolveFailed
}

// secretNamespace is where pools' pull secrets live: the coordinator's own
// namespace, the one its slot Leases are in.
const secretNamespace = lease.Namespace

// CheckRegistryAuthFile reports whether path holds usable credentials, so
// a wrong --registry-auth-file stops the coordinator at start.
func CheckRegistryAuthFile(path string) error {
	_, err := (&registryAuth{file: path}).fromFile()
	return err
}
