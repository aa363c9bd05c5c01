package testbootc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
)

// Pull mode (Knobs.Pull): switch and upgrade --download-only fetch the
// image's manifest from the registry its reference names, with the host's
// credentials, CA certificates, registries.d and signature policy under
// the machine's root directory (Knobs.Root, or <state dir>/root). Layers
// are not fetched (SwitchDelay plays the download time). The steps and
// their error contexts are bootc's (crates/lib/src/cli.rs: "Switching",
// "Switching (ostree)", "Upgrading"; crates/ostree-ext/src/container/store.rs:
// "Creating importer", "Preparing import", "Fetching manifest",
// prepare_internal), and the image proxy's (containers-image-proxy-rs
// src/imageproxy.rs: "failed to invoke method <Method>: <error>";
// skopeo's json-proxy handler.go, openImageImpl).

// SigContainerPolicy is how bootc writes ImageSignature::ContainerPolicy
// (crates/lib/src/spec.rs, camelCase). An unverified fetch
// (SignatureSource::ContainerPolicyAllowInsecure) is written as no
// signature at all (crates/lib/src/status.rs, From<OstreeImageReference>).
const SigContainerPolicy = "containerPolicy"

// pullTarget is what bootc fetches: the reference and its signature source.
type pullTarget struct {
	ref imageref.Pinned
	sig string // SigContainerPolicy or "" (unverified)
}

// splitRepository splits repo into registry host and path as the docker
// reference grammar does (a first component with '.', ':' or "localhost"
// is a host; otherwise docker.io, with library/ for one component).
func splitRepository(repo string) (host, path string) {
	first, rest, ok := strings.Cut(repo, "/")
	if ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return first, rest
	}
	if !ok {
		return "docker.io", "library/" + repo
	}
	return "docker.io", repo
}

// fetchImage runs bootc's import preparation for t with the host under
// root and the images already in the ostree repository (reference ->
// manifest digest). It returns the digest of the manifest bootc would
// import (the host platform's for an index).
func fetchImage(ctx context.Context, root string, t pullTarget, images map[string]string) (string, error) {
	// new_importer: the auth file, then the proxy's Initialize, which
	// builds the policy context (skopeo getPolicyContext).
	authPath, err := findAuthFile(root)
	if err != nil {
		return "", fmt.Errorf("Creating importer: %w", err)
	}
	policy, err := loadPolicy(root)
	if err != nil {
		return "", fmt.Errorf("Creating importer: failed to invoke method Initialize: %w", err)
	}
	// prepare_internal: bootc refuses an insecure default before anything
	// else when enforcing, then a digest already present needs no fetch
	// (no registry request, so no policy check either).
	if t.sig == SigContainerPolicy {
		insecure, err := bootcPolicyIsDefaultInsecure(root)
		if err != nil {
			return "", fmt.Errorf("Preparing import: Fetching manifest: %w", err)
		}
		if insecure {
			return "", errors.New("Preparing import: Fetching manifest: containers-policy.json specifies a default of `insecureAcceptAnything`; refusing usage")
		}
	}
	if d, ok := images[t.ref.String()]; ok && d == t.ref.Digest {
		return d, nil
	}
	d, err := openImage(ctx, root, authPath, policy, t.ref)
	if err != nil {
		return "", fmt.Errorf("Preparing import: Fetching manifest: failed to invoke method OpenImage: %w", err)
	}
	return d, nil
}

// openImage is the proxy's OpenImage: fetch the manifest by digest, check
// the policy on it and, for an index, on the host platform's instance.
// The top-level failure counts only if the instance also fails (handler.go).
func openImage(ctx context.Context, root, authPath string, policy *signaturePolicy, ref imageref.Pinned) (string, error) {
	host, repo := splitRepository(ref.Repository)
	name := host + "/" + repo
	regConf, err := loadRegistriesD(root)
	if err != nil {
		return "", err
	}
	cred, err := credentialsFor(authPath, host, repo)
	if err != nil {
		return "", err
	}
	c, err := newRegistryClient(root, host, cred)
	if err != nil {
		return "", err
	}
	top, mt, err := c.manifest(ctx, repo, ref.Digest)
	if err != nil {
		return "", err
	}
	identity := name + "@" + ref.Digest
	attachments := regConf.useSigstoreAttachments(identity, policyNamespaces(name))
	image := func(manifest []byte, digest string) policyImage {
		return policyImage{name: name, ref: identity, manifest: manifest,
			signatures: func(ctx context.Context) ([]sigstoreSignature, error) {
				if !attachments {
					return nil, nil
				}
				return sigstoreAttachments(ctx, c, name, repo, digest)
			}}
	}
	// UnparsedImage.Manifest checks the digest of what the registry sent.
	if sha256Digest(top) != ref.Digest {
		return "", fmt.Errorf("Manifest does not match provided manifest digest %s", ref.Digest)
	}
	topErr := policy.allows(ctx, root, image(top, ref.Digest))
	if !isIndex(mt, top) {
		if topErr != nil {
			return "", topErr
		}
		return ref.Digest, nil
	}
	inst, err := chooseInstance(mt, top)
	if err != nil {
		return "", err
	}
	body, _, err := c.manifest(ctx, repo, inst)
	if err != nil {
		return "", err
	}
	if sha256Digest(body) != inst {
		return "", fmt.Errorf("Manifest does not match provided manifest digest %s", inst)
	}
	if instErr := policy.allows(ctx, root, image(body, inst)); instErr != nil && topErr != nil {
		return "", instErr
	}
	return inst, nil
}

// sigstoreAttachments fetches the signatures of digest: the OCI manifest at
// tag sha256-<hex>.sig, each layer a payload (docker_image_src.go,
// appendSignaturesFromSigstoreAttachments; docker_client.go,
// getSigstoreAttachmentManifest). No attachment manifest means no signatures.
func sigstoreAttachments(ctx context.Context, c *registryClient, name, repo, digest string) ([]sigstoreSignature, error) {
	tag := strings.Replace(digest, ":", "-", 1) + ".sig"
	body, mt, err := c.manifest(ctx, repo, tag)
	if err != nil {
		var re *registryError
		if errors.As(err, &re) && re.manifestUnknown() {
			return nil, nil
		}
		return nil, err
	}
	if mt != mediaOCIManifest {
		return nil, fmt.Errorf("unexpected MIME type for sigstore attachment manifest %s:%s: %q", name, tag, mt)
	}
	var m struct {
		Layers []struct {
			MediaType   string            `json:"mediaType"`
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("parsing manifest %s:%s: %w", name, tag, err)
	}
	var out []sigstoreSignature
	for _, l := range m.Layers {
		payload, err := c.blob(ctx, repo, l.Digest, maxSignatureBody)
		if err != nil {
			return nil, err
		}
		out = append(out, sigstoreSignature{mediaType: l.MediaType, payload: payload, annotations: l.Annotations})
	}
	return out, nil
}

func isIndex(mt string, body []byte) bool {
	if mt == mediaOCIIndex || mt == mediaDockerList {
		return true
	}
	if mt != "" && mt != "application/json" && mt != "text/plain" {
		return false
	}
	var probe struct {
		MediaType string            `json:"mediaType"`
		Manifests []json.RawMessage `json:"manifests"`
	}
	return json.Unmarshal(body, &probe) == nil && (probe.MediaType == mediaOCIIndex || probe.MediaType == mediaDockerList || probe.Manifests != nil)
}

// chooseInstance picks the host platform's manifest from an index as
// containers/image's ChooseInstance does for linux/GOARCH (the first
// matching entry; the default variant of the architecture or none).
func chooseInstance(mt string, body []byte) (string, error) {
	var idx struct {
		Manifests []struct {
			MediaType string `json:"mediaType"`
			Digest    string `json:"digest"`
			Platform  *struct {
				OS           string `json:"os"`
				Architecture string `json:"architecture"`
				Variant      string `json:"variant"`
			} `json:"platform"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(body, &idx); err != nil {
		return "", fmt.Errorf("parsing manifest list: %w", err)
	}
	arch, variant := runtime.GOARCH, ""
	if arch == "arm" {
		variant = "v7"
	}
	for _, m := range idx.Manifests {
		p := m.Platform
		if p == nil || p.OS != "linux" || p.Architecture != arch {
			continue
		}
		if p.Variant != "" && p.Variant != variant && (arch != "arm64" || p.Variant != "v8") && (arch != "amd64" || p.Variant != "v1") {
			continue
		}
		if !isSHA256Digest(m.Digest) {
			return "", fmt.Errorf("invalid digest %q in manifest list", m.Digest)
		}
		return m.Digest, nil
	}
	what := "image index"
	if mt == mediaDockerList {
		what = "manifest list"
	}
	return "", fmt.Errorf("no image found in %s for architecture %q, variant %q, OS %q", what, arch, variant, "linux")
}

// rootOf is the host root of pull mode for st.
func rootOf(st Store, k Knobs) (string, error) {
	if k.Root != "" {
		return k.Root, nil
	}
	if d, ok := st.(Dir); ok {
		return filepath.Join(string(d), "root"), nil
	}
	return "", errors.New("test-bootc: pull mode needs Knobs.Root for an in-memory machine")
}

// RecordPulled notes that ref's image (manifest digest) is now in the
// ostree repository (pull mode).
func (m *Machine) RecordPulled(ref, digest string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.s.Images == nil {
		m.s.Images = map[string]string{}
	}
	m.s.Images[ref] = digest
}

// pruneImagesLocked drops the images no deployment uses, as bootc's
// cleanup after a stage does (crates/lib/src/deploy.rs, cleanup:
// ostree_container::deploy::prune).
func (m *Machine) pruneImagesLocked() {
	for ref := range m.s.Images {
		used := false
		for _, d := range []*Deployment{m.s.Booted, m.s.Staged, m.s.Rollback} {
			used = used || d != nil && d.Image == ref
		}
		if !used {
			delete(m.s.Images, ref)
		}
	}
}
