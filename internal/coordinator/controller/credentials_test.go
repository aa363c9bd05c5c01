package controller

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

func TestParseDockerConfig(t *testing.T) {
	for _, c := range []struct {
		name, doc, want string // want: "" ok, else a substring of the error
	}{
		{"basic", `{"auths":{"registry.example:5000":{"auth":"dTpw"}}}`, ""},
		{"username and password", `{"auths":{"registry.example":{"username":"u","password":"p"}}}`, ""},
		{"empty", ``, "has no .dockerconfigjson"},
		{"not JSON", `auths`, "is not a docker config JSON document"},
		{"no auths", `{"credsStore":"desktop"}`, `names no registry ("auths" is empty)`},
		{"empty auths", `{"auths":{}}`, `names no registry`},
		{"too large", `{"auths":{"a":{"auth":"` + strings.Repeat("x", maxDockerConfig) + `"}}}`, "larger than"},
	} {
		t.Run(c.name, func(t *testing.T) {
			kc, err := parseDockerConfig("test", []byte(c.doc))
			if c.want == "" {
				if err != nil || kc == nil {
					t.Fatalf("err %v", err)
				}
				return
			}
			var ce *errCredentials
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.As(err, &ce) {
				t.Fatalf("err %v, want an errCredentials containing %q", err, c.want)
			}
			if credentialsReason(err) != fleetv1.ReasonImagePullSecretInvalid {
				t.Fatalf("reason %q", credentialsReason(err))
			}
		})
	}
}

// The file's credentials are matched by registry host, like the kubelet
// matches a pull secret's.
func TestAuthFileMatchesItsRegistry(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(file, []byte(`{"auths":{"registry.example:5000":{"username":"u","password":"p"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	kc, err := (&registryAuth{file: file}).fromFile()
	if err != nil {
		t.Fatal(err)
	}
	for ref, want := range map[string]string{
		"registry.example:5000/os:1": "u:p",
		"other.example/os:1":         "",
	} {
		r, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		a, err := kc.Resolve(r.Context())
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := a.Authorization()
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if a != authn.Anonymous && cfg.Username != "" {
			got = cfg.Username + ":" + cfg.Password
		}
		if got != want {
			t.Errorf("%s: credentials %q, want %q", ref, got, want)
		}
	}
	if err := CheckRegistryAuthFile(filepath.Join(t.TempDir(), "absent.json")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("absent file: %v", err)
	}
}
