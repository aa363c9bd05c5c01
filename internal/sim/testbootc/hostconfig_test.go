package testbootc

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Table tests of the pull-mode pieces that follow containers/image.

func TestPolicyNamespaces(t *testing.T) {
	got := policyNamespaces("registry.example.com:5000/fleet/os")
	want := []string{"registry.example.com:5000/fleet/os", "registry.example.com:5000/fleet", "registry.example.com:5000", "*.example.com", "*.com"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("policyNamespaces = %q, want %q (naming.go, DockerReferenceNamespaces)", got, want)
	}
}

// The most specific scope wins (policy_eval.go, requirementsForImageRef).
func TestPolicyScopes(t *testing.T) {
	p, err := parsePolicy([]byte(`{
	  "default": [{"type": "reject"}],
	  "transports": {"docker": {
	    "": [{"type": "insecureAcceptAnything"}],
	    "r.example.com": [{"type": "reject"}],
	    "r.example.com/fleet": [{"type": "insecureAcceptAnything"}],
	    "r.example.com/fleet/os@sha256:` + strings.Repeat("a", 64) + `": [{"type": "reject"}],
	    "*.other.com": [{"type": "reject"}]
	  }}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, digest string
		want         string
	}{
		{"r.example.com/fleet/os", strings.Repeat("a", 64), "reject"},                 // exact identity
		{"r.example.com/fleet/os", strings.Repeat("b", 64), "insecureAcceptAnything"}, // namespace
		{"r.example.com/other", strings.Repeat("b", 64), "reject"},                    // host
		{"x.other.com/a", strings.Repeat("b", 64), "reject"},                          // wildcard
		{"quay.io/a", strings.Repeat("b", 64), "insecureAcceptAnything"},              // transport default
	} {
		reqs := p.requirementsFor(tc.name+"@sha256:"+tc.digest, policyNamespaces(tc.name))
		if len(reqs) != 1 || reqs[0].Type != tc.want {
			t.Errorf("%s@%s: %+v, want %s", tc.name, tc.digest[:4], reqs, tc.want)
		}
	}
	p, err = parsePolicy([]byte(`{"default": [{"type": "insecureAcceptAnything"}]}`))
	if err != nil || len(p.requirementsFor("quay.io/a@sha256:x", nil)) != 1 {
		t.Fatalf("default only: %+v, %v", p, err)
	}
}

func TestParsePolicyRefuses(t *testing.T) {
	for _, tc := range []struct{ policy, want string }{
		{`{}`, "Default policy is missing"},
		{`{"default": []}`, "List of verification policy requirements must not be empty"},
		{`{"default": [{"type": "trustMe"}]}`, `Unknown policy requirement type "trustMe"`},
		{`{"default": [{"type": "reject"}], "other": 1}`, `Unknown key "other"`},
		{`{"default": [{"type": "sigstoreSigned"}]}`, "exactly one of keyPath, keyPaths, keyData, keyDatas, fulcio, and pki must be specified"},
		{`not json`, "invalid character"},
	} {
		if _, err := parsePolicy([]byte(tc.policy)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parsePolicy(%s) = %v, want %q", tc.policy, err, tc.want)
		}
	}
}

func TestSignedByIsNotModelled(t *testing.T) {
	p, err := parsePolicy([]byte(`{"default": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/etc/pki/k.gpg"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	err = p.allows(context.Background(), t.TempDir(), policyImage{name: "r.io/a", ref: "r.io/a@sha256:x"})
	if err == nil || !strings.Contains(err.Error(), "signedBy (GPG) policy requirements are not modelled") {
		t.Fatalf("allows = %v", err)
	}
}

func TestCredentialsLookup(t *testing.T) {
	b := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		name, auths, want string
	}{
		{"host", `{"r.io:5000": {"auth": "` + b("u:host") + `"}}`, "u:host"},
		{"namespace beats host", `{"r.io:5000": {"auth": "` + b("u:host") + `"}, "r.io:5000/fleet": {"auth": "` + b("u:ns") + `"}}`, "u:ns"},
		{"repository beats namespace", `{"r.io:5000/fleet": {"auth": "` + b("u:ns") + `"}, "r.io:5000/fleet/os": {"auth": "` + b("u:repo") + `"}}`, "u:repo"},
		{"legacy https key", `{"https://r.io:5000/v1/": {"auth": "` + b("u:legacy") + `"}}`, "u:legacy"},
		{"other host", `{"q.io": {"auth": "` + b("u:q") + `"}}`, ":"},
		{"no colon is skipped", `{"r.io:5000": {"auth": "` + b("nocolon") + `"}}`, ":"},
		{"NUL padding trimmed", `{"r.io:5000": {"auth": "` + b("u:p\x00\x00") + `"}}`, "u:p"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "auth.json")
			if err := os.WriteFile(p, []byte(`{"auths": `+tc.auths+`}`), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := credentialsFor(p, "r.io:5000", "fleet/os")
			if err != nil || c.user+":"+c.pass != tc.want {
				t.Fatalf("credentialsFor = %q:%q, %v; want %q", c.user, c.pass, err, tc.want)
			}
		})
	}
	p := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(p, []byte(`{"auths": [}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := credentialsFor(p, "r.io", "a"); err == nil || !strings.HasPrefix(err.Error(), `getting username and password: reading JSON file "/proc/self/fd/3": unmarshaling JSON at`) {
		t.Fatalf("malformed auth.json: %v", err)
	}
}

// registryHTTPResponseToError (docker/errors.go) texts.
func TestRegistryErrorTexts(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   string
	}{
		{401, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, "authentication required"},
		{401, `{"errors":[{"code":"UNAUTHORIZED","message":"incorrect username or password"}]}`, "unauthorized: incorrect username or password"},
		{401, `not json`, "authentication required"},
		{401, `{"details":"token expired"}`, "unauthorized: token expired"},
		{403, `{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}`, "requested access to the resource is denied"},
		{403, `{"errors":[{"code":"DENIED","message":"no pull for you"}]}`, "denied: no pull for you"},
		{403, `<html>forbidden</html>`, `StatusCode: 403, "<html>forbidden</html>"`},
		{404, `{"errors":[{"code":"MANIFEST_UNKNOWN","message":"Unknown manifest"}]}`, "manifest unknown: Unknown manifest"},
		{400, `{"errors":[{"code":"SOMETHING_NEW","message":"x"}]}`, "unknown: x"},
	} {
		res := &http.Response{StatusCode: tc.status, Body: io.NopCloser(strings.NewReader(tc.body))}
		if got := registryHTTPResponseToError(res).Error(); got != tc.want {
			t.Errorf("%d %s: %q, want %q", tc.status, tc.body, got, tc.want)
		}
	}
}

func TestSplitReference(t *testing.T) {
	for in, want := range map[string][2]string{
		"r.io:5000/fleet/os":            {"r.io:5000/fleet/os", ""},
		"r.io:5000/fleet/os:1":          {"r.io:5000/fleet/os", ":1"},
		"r.io/os@sha256:abc":            {"r.io/os", "@sha256:abc"},
		"busybox":                       {"docker.io/library/busybox", ""},
		"library/busybox:latest":        {"docker.io/library/busybox", ":latest"},
		"localhost/os":                  {"localhost/os", ""},
		"r.io:5000/os:1@sha256:" + "ab": {"r.io:5000/os", ":1@sha256:ab"},
	} {
		n, s, err := splitReference(in)
		if err != nil || n != want[0] || s != want[1] {
			t.Errorf("splitReference(%q) = %q %q %v, want %q", in, n, s, err, want)
		}
	}
}
