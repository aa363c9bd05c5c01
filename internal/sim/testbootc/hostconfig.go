package testbootc

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// The host configuration pull mode reads, under the machine's root
// directory, with the lookups of the programs that read it on a real host.

// authFiles are the files bootc gives the image proxy as credentials, in
// the order it tries them as root: the first that exists is used
// (crates/ostree-ext/src/globals.rs, get_config_paths(root=true) and
// ConfigPaths::open_file: runtime, then persistent, then system). The man
// page crates/ostree-ext/man/ostree-container-auth.md says /etc first and
// /run second; the code, which this follows, tries /run first.
var authFiles = []string{"run/ostree/auth.json", "etc/ostree/auth.json", "usr/lib/ostree/auth.json"}

// AuthFiles are the host paths of authFiles, in bootc's order.
var AuthFiles = []string{"/run/ostree/auth.json", "/etc/ostree/auth.json", "/usr/lib/ostree/auth.json"}

// proxyAuthFile is how the image proxy names the auth data bootc passes it
// (containers-image-proxy-rs src/imageproxy.rs: a memfd copy passed as
// --authfile /proc/self/fd/<n>; the number is the proxy's choice).
const proxyAuthFile = "/proc/self/fd/3"

// credential is one user:password pair ("" when none applies).
type credential struct{ user, pass string }

// findAuthFile returns the auth.json bootc would pass, or "" when none
// exists (then bootc pulls anonymously: ostree-ext container/mod.rs,
// merge_default_container_proxy_opts sets auth_anonymous).
func findAuthFile(root string) (string, error) {
	for _, rel := range authFiles {
		p := filepath.Join(root, rel)
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("Loading global authfile: Opening %s auth file: %w", authKind(rel), err)
		}
		if fi.IsDir() {
			return "", fmt.Errorf("Loading global authfile: Opening %s auth file: Is a directory (os error 21)", authKind(rel))
		}
		return p, nil
	}
	return "", nil
}

func authKind(rel string) string {
	switch {
	case strings.HasPrefix(rel, "run/"):
		return "runtime"
	case strings.HasPrefix(rel, "etc/"):
		return "persistent"
	}
	return "system"
}

// credentialsFor looks up repo's credentials in the auth.json at path as
// containers/image does (pkg/docker/config/config.go: authKeysForKey, most
// specific namespace first, then the legacy host keys via
// normalizeAuthFileKey; decodeDockerAuth). The file follows
// containers-auth.json(5): {"auths":{"host[:port][/ns]":{"auth":"base64(user:pass)"}}}.
func credentialsFor(path, host, repo string) (credential, error) {
	if path == "" {
		return credential{}, nil
	}
	wrap := func(err error) error {
		return fmt.Errorf("getting username and password: reading JSON file %q: %w", proxyAuthFile, err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return credential{}, wrap(err)
	}
	var f struct {
		Auths map[string]struct {
			Auth          string `json:"auth"`
			IdentityToken string `json:"identitytoken"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return credential{}, wrap(fmt.Errorf("unmarshaling JSON at %q: %w", proxyAuthFile, err))
	}
	registry := normalizeRegistry(host)
	name := registry + "/" + repo
	keys := []string{}
	for k := name; ; {
		keys = append(keys, k)
		i := strings.LastIndex(k, "/")
		if i < 0 {
			break
		}
		k = k[:i]
	}
	for _, k := range keys {
		if a, ok := f.Auths[k]; ok {
			return decodeAuth(a.Auth)
		}
	}
	legacy := make([]string, 0, len(f.Auths))
	for k := range f.Auths {
		legacy = append(legacy, k)
	}
	sort.Strings(legacy)
	for _, k := range legacy {
		stripped := strings.TrimPrefix(strings.TrimPrefix(k, "http://"), "https://")
		if stripped != k {
			stripped, _, _ = strings.Cut(stripped, "/")
		}
		if normalizeRegistry(stripped) == registry {
			return decodeAuth(f.Auths[k].Auth)
		}
	}
	return credential{}, nil
}

func decodeAuth(s string) (credential, error) {
	decoded, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return credential{}, fmt.Errorf("getting username and password: %w", err)
	}
	user, pass, ok := strings.Cut(string(decoded), ":")
	if !ok {
		return credential{}, nil // "if it's invalid just skip, as docker does"
	}
	return credential{user: user, pass: strings.Trim(pass, "\x00")}, nil
}

// normalizeRegistry is config.go's normalizeRegistry.
func normalizeRegistry(r string) string {
	switch r {
	case "registry-1.docker.io", "index.docker.io":
		return "docker.io"
	}
	return r
}

// policyFiles are where containers/image and bootc look for the signature
// policy as root: /etc first, then the distribution default (bootc
// crates/ostree-ext/src/container/skopeo.rs, SYSTEM_POLICY_PATHS;
// containers/image signature/policy_config.go, DefaultPolicy through
// configfile). $CONTAINERS_POLICY_JSON and per-user files are not modelled.
var policyFiles = []string{"etc/containers/policy.json", "usr/share/containers/policy.json"}

// readPolicyFile returns the policy file's bytes and host path.
func readPolicyFile(root string) ([]byte, string, error) {
	for _, rel := range policyFiles {
		data, err := os.ReadFile(filepath.Join(root, rel))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, "/" + rel, err
		}
		return data, "/" + rel, nil
	}
	return nil, "", os.ErrNotExist
}

// bootcPolicyIsDefaultInsecure is bootc's own check before an enforced
// fetch (crates/ostree-ext/src/container/skopeo.rs,
// container_policy_is_default_insecure): only the default list matters, and
// only a default of exactly one insecureAcceptAnything is insecure.
func bootcPolicyIsDefaultInsecure(root string) (bool, error) {
	data, _, err := readPolicyFile(root)
	if errors.Is(err, os.ErrNotExist) {
		return false, errors.New("Resolving containers policy path: No containers policy.json found; checked $CONTAINERS_POLICY_JSON, user config dir, and system paths")
	}
	if err != nil {
		return false, fmt.Errorf("Resolving containers policy path: %w", err)
	}
	var p struct {
		Default *[]struct {
			Type string `json:"type"`
		} `json:"default"`
	}
	if err := json.Unmarshal(data, &p); err != nil {
		return false, err
	}
	return p.Default != nil && len(*p.Default) == 1 && (*p.Default)[0].Type == "insecureAcceptAnything", nil
}

// registriesD is the merged registries.d configuration (containers/image
// docker/registries_d.go, loadAndMergeConfig over /etc/containers/registries.d/*.yaml).
type registriesD struct {
	DefaultDocker *registryNamespace           `json:"default-docker"`
	Docker        map[string]registryNamespace `json:"docker"`
}

type registryNamespace struct {
	Lookaside              string `json:"lookaside,omitempty"`
	LookasideStaging       string `json:"lookaside-staging,omitempty"`
	SigStore               string `json:"sigstore,omitempty"`
	SigStoreStaging        string `json:"sigstore-staging,omitempty"`
	UseSigstoreAttachments *bool  `json:"use-sigstore-attachments,omitempty"`
}

// loadRegistriesD reads every *.yaml file of etc/containers/registries.d in
// name order; a namespace or default-docker defined twice is an error, as in
// loadAndMergeConfig.
func loadRegistriesD(root string) (registriesD, error) {
	dir := filepath.Join(root, "etc/containers/registries.d")
	merged := registriesD{Docker: map[string]registryNamespace{}}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return merged, nil
	}
	if err != nil {
		return merged, err
	}
	defaultFrom := ""
	from := map[string]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		host := "/etc/containers/registries.d/" + e.Name()
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return merged, err
		}
		var c registriesD
		if err := yaml.UnmarshalStrict(data, &c); err != nil {
			return merged, fmt.Errorf("parsing %s: %w", host, err)
		}
		if c.DefaultDocker != nil {
			if defaultFrom != "" {
				return merged, fmt.Errorf("Error parsing signature storage configuration: %q contains default-docker, also specified in %q", host, defaultFrom)
			}
			merged.DefaultDocker, defaultFrom = c.DefaultDocker, host
		}
		for ns, v := range c.Docker {
			if prev, ok := from[ns]; ok {
				return merged, fmt.Errorf("Error parsing signature storage configuration: %q contains configuration for %q, also specified in %q", host, ns, prev)
			}
			merged.Docker[ns], from[ns] = v, host
		}
	}
	return merged, nil
}

// useSigstoreAttachments is registries_d.go's useSigstoreAttachments: the
// full identity, then each parent namespace, then default-docker.
func (c registriesD) useSigstoreAttachments(identity string, namespaces []string) bool {
	for _, k := range append([]string{identity}, namespaces...) {
		if ns, ok := c.Docker[k]; ok && ns.UseSigstoreAttachments != nil {
			return *ns.UseSigstoreAttachments
		}
	}
	if c.DefaultDocker != nil && c.DefaultDocker.UseSigstoreAttachments != nil {
		return *c.DefaultDocker.UseSigstoreAttachments
	}
	return false
}

// policyNamespaces is docker/policyconfiguration/naming.go,
// DockerReferenceNamespaces: the repository, its parents, the host, then
// wildcarded parent domains (port stripped).
func policyNamespaces(name string) []string {
	var res []string
	for n := name; ; {
		res = append(res, n)
		i := strings.LastIndex(n, "/")
		if i < 0 {
			name = n
			break
		}
		n = n[:i]
	}
	if i := strings.Index(name, ":"); i >= 0 {
		name = name[:i]
	}
	for {
		i := strings.Index(name, ".")
		if i < 0 {
			break
		}
		name = name[i+1:]
		res = append(res, "*."+name)
	}
	return res
}
