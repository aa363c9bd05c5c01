package testbootc

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
)

// This file evaluates containers-policy.json(5) as containers/image does
// when bootc's image proxy opens an image (skopeo's json-proxy handler.go,
// openImageImpl, calls PolicyContext.IsRunningImageAllowed on every open,
// whatever bootc's --enforce-container-sigpolicy says). Sources, in
// go.podman.io/image/v5/signature (vendored by containers/skopeo):
//
//   - policy_config.go: NewPolicyFromBytes, "Default policy is missing",
//     "Unknown policy requirement type %q", "invalid policy in %q: %w".
//   - policy_eval.go: requirementsForImageRef (the exact identity, then each
//     namespace of DockerReferenceNamespaces, then the transport's "",
//     then default), IsRunningImageAllowed (every requirement must allow).
//   - policy_eval_simple.go: "Running image %s is rejected by policy."
//   - policy_eval_sigstore.go: isRunningImageAllowed ("A signature was
//     required, but no signature exists", "None of the signatures were
//     accepted, reasons: ..."), isSignatureAccepted ("missing %s annotation").
//   - internal/sigstore_payload.go: VerifySigstorePayload ("cryptographic
//     signature verification failed: ..."), the payload's critical fields.
//   - policy_reference_match.go: matchRepoDigestOrExact (the default
//     signedIdentity) and friends; "Signature for identity %q is not accepted".
//   - sigstore/sigstore pkg/signature/ecdsa.go: the ECDSA texts.
//
// Modelled: insecureAcceptAnything, reject, sigstoreSigned with
// keyPath/keyPaths/keyData (ECDSA public keys, no Rekor/Fulcio/PKI).
// signedBy (GPG) is refused with an error saying it is not modelled.

// policyRequirement is one entry of a requirement list.
type policyRequirement struct {
	Type           string          `json:"type"`
	KeyPath        string          `json:"keyPath,omitempty"`
	KeyPaths       []string        `json:"keyPaths,omitempty"`
	KeyData        string          `json:"keyData,omitempty"`
	SignedIdentity json.RawMessage `json:"signedIdentity,omitempty"`
	// raw keeps other fields (fulcio, rekor*, pki, keyType, ...) so their
	// presence can be refused rather than ignored.
	extra []string
}

type signaturePolicy struct {
	Default            []policyRequirement
	Docker             map[string][]policyRequirement
	HasDockerTransport bool
}

// policyFormatError is InvalidPolicyFormatError.
type policyFormatError string

func (e policyFormatError) Error() string { return string(e) }

// policyRequirementError is PolicyRequirementError: a rejection.
type policyRequirementError string

func (e policyRequirementError) Error() string { return string(e) }

func loadPolicy(root string) (*signaturePolicy, error) {
	data, path, err := readPolicyFile(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("config file not found: no policy.json file found; searched paths: [\"/etc/containers/policy.json\" \"/usr/share/containers/policy.json\"]")
	}
	if err != nil {
		return nil, err
	}
	p, err := parsePolicy(data)
	if err != nil {
		return nil, fmt.Errorf("invalid policy in %q: %w", path, err)
	}
	return p, nil
}

func parsePolicy(data []byte) (*signaturePolicy, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, policyFormatError(err.Error())
	}
	for k := range top {
		if k != "default" && k != "transports" {
			return nil, policyFormatError(fmt.Sprintf("Unknown key %q", k))
		}
	}
	d, ok := top["default"]
	if !ok || bytes.Equal(bytes.TrimSpace(d), []byte("null")) {
		return nil, policyFormatError("Default policy is missing")
	}
	p := &signaturePolicy{Docker: map[string][]policyRequirement{}}
	var err error
	if p.Default, err = parseRequirements(d); err != nil {
		return nil, err
	}
	if t, ok := top["transports"]; ok {
		var transports map[string]map[string]json.RawMessage
		if err := json.Unmarshal(t, &transports); err != nil {
			return nil, policyFormatError(err.Error())
		}
		if scopes, ok := transports["docker"]; ok {
			p.HasDockerTransport = true
			for scope, raw := range scopes {
				if p.Docker[scope], err = parseRequirements(raw); err != nil {
					return nil, err
				}
			}
		}
	}
	return p, nil
}

func parseRequirements(raw json.RawMessage) ([]policyRequirement, error) {
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, policyFormatError(err.Error())
	}
	if len(list) == 0 {
		return nil, policyFormatError("List of verification policy requirements must not be empty")
	}
	out := make([]policyRequirement, 0, len(list))
	for _, item := range list {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(item, &fields); err != nil {
			return nil, policyFormatError(err.Error())
		}
		var r policyRequirement
		if err := json.Unmarshal(item, &r); err != nil {
			return nil, policyFormatError(err.Error())
		}
		switch r.Type {
		case "insecureAcceptAnything", "reject":
			for k := range fields {
				if k != "type" {
					return nil, policyFormatError(fmt.Sprintf("Unknown key %q", k))
				}
			}
		case "sigstoreSigned":
			n := 0
			for k := range fields {
				switch k {
				case "type", "signedIdentity":
				case "keyPath", "keyPaths", "keyData":
					n++
				default:
					r.extra = append(r.extra, k)
				}
			}
			if n != 1 && len(r.extra) == 0 {
				return nil, policyFormatError("exactly one of keyPath, keyPaths, keyData, keyDatas, fulcio, and pki must be specified")
			}
		case "signedBy", "signedBaseLayer":
		default:
			return nil, policyFormatError(fmt.Sprintf("Unknown policy requirement type %q", r.Type))
		}
		out = append(out, r)
	}
	return out, nil
}

// requirementsFor is requirementsForImageRef for the docker transport.
func (p *signaturePolicy) requirementsFor(identity string, namespaces []string) []policyRequirement {
	if p.HasDockerTransport {
		if r, ok := p.Docker[identity]; ok {
			return r
		}
		for _, ns := range namespaces {
			if r, ok := p.Docker[ns]; ok {
				return r
			}
		}
		if r, ok := p.Docker[""]; ok {
			return r
		}
	}
	return p.Default
}

// policyImage is one image (a top-level manifest or an instance of an
// index) as the policy sees it.
type policyImage struct {
	name     string // host[:port]/repo, the docker reference's Name()
	ref      string // name@sha256:..., as pulled (the top-level reference)
	manifest []byte
	// signatures returns the sigstore attachments of this manifest.
	signatures func(ctx context.Context) ([]sigstoreSignature, error)
}

// sigstoreSignature is one layer of a sigstore attachment manifest.
type sigstoreSignature struct {
	mediaType   string
	payload     []byte
	annotations map[string]string
}

const (
	sigstoreSignatureMIME       = "application/vnd.dev.cosign.simplesigning.v1+json"
	sigstoreSignatureAnnotation = "dev.cosignproject.cosign/signature"
	sigstorePayloadType         = "cosign container image signature"
)

// allows is IsRunningImageAllowed: nil when every requirement allows img.
func (p *signaturePolicy) allows(ctx context.Context, root string, img policyImage) error {
	reqs := p.requirementsFor(img.ref, policyNamespaces(img.name))
	if len(reqs) == 0 {
		return policyRequirementError("List of verification policy requirements must not be empty")
	}
	for _, r := range reqs {
		if err := r.allows(ctx, root, img); err != nil {
			return err
		}
	}
	return nil
}

func (r policyRequirement) allows(ctx context.Context, root string, img policyImage) error {
	switch r.Type {
	case "insecureAcceptAnything":
		return nil
	case "reject":
		return policyRequirementError(fmt.Sprintf("Running image docker://%s is rejected by policy.", img.ref))
	case "signedBy":
		return errors.New("test-bootc: signedBy (GPG) policy requirements are not modelled (containers/image signature/policy_eval_signedby.go verifies them with the keyring in keyPath)")
	case "signedBaseLayer":
		return policyRequirementError("signedBaseLayer not implemented yet!")
	}
	if len(r.extra) > 0 {
		return fmt.Errorf("test-bootc: sigstoreSigned with %s is not modelled; only keyPath, keyPaths and keyData", strings.Join(r.extra, ", "))
	}
	keys, err := r.publicKeys(root)
	if err != nil {
		return err
	}
	sigs, err := img.signatures(ctx)
	if err != nil {
		return err
	}
	var rejections []string
	nonAttachments := 0
	for _, s := range sigs {
		if s.mediaType != sigstoreSignatureMIME {
			nonAttachments++
			continue
		}
		err := r.accepts(keys, img, s)
		if err == nil {
			return nil // one accepted signature is enough
		}
		rejections = append(rejections, err.Error())
	}
	switch len(rejections) {
	case 0:
		if nonAttachments == 0 {
			return policyRequirementError("A signature was required, but no signature exists")
		}
		return policyRequirementError(fmt.Sprintf("A signature was required, but no signature exists (%d non-sigstore signatures, %d sigstore non-signature attachments)", 0, nonAttachments))
	case 1:
		return policyRequirementError(rejections[0])
	}
	return policyRequirementError("None of the signatures were accepted, reasons: " + strings.Join(rejections, "; "))
}

func (r policyRequirement) publicKeys(root string) ([]*ecdsa.PublicKey, error) {
	var pems [][]byte
	paths := r.KeyPaths
	if r.KeyPath != "" {
		paths = []string{r.KeyPath}
	}
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			return nil, policyFormatError(fmt.Sprintf("keyPath %q is not absolute", p))
		}
		data, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return nil, fmt.Errorf("reading %q: %w", p, err)
		}
		pems = append(pems, data)
	}
	if r.KeyData != "" {
		data, err := base64.StdEncoding.DecodeString(r.KeyData)
		if err != nil {
			return nil, err
		}
		pems = append(pems, data)
	}
	var keys []*ecdsa.PublicKey
	for _, data := range pems {
		for {
			var b *pem.Block
			b, data = pem.Decode(data)
			if b == nil {
				break
			}
			k, err := x509.ParsePKIXPublicKey(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parsing public key: %w", err)
			}
			ek, ok := k.(*ecdsa.PublicKey)
			if !ok {
				return nil, fmt.Errorf("test-bootc: only ECDSA public keys are modelled, got %T", k)
			}
			keys = append(keys, ek)
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("no public key found") // cryptoutils.UnmarshalPEMToPublicKey
	}
	return keys, nil
}

// accepts is isSignatureAccepted plus VerifySigstorePayload.
func (r policyRequirement) accepts(keys []*ecdsa.PublicKey, img policyImage, s sigstoreSignature) error {
	b64, ok := s.annotations[sigstoreSignatureAnnotation]
	if !ok {
		return fmt.Errorf("missing %s annotation", sigstoreSignatureAnnotation)
	}
	sig, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return fmt.Errorf("base64 decoding: %w", err)
	}
	var failures []string
	verified := false
	for _, k := range keys {
		if err := verifyECDSA(k, s.payload, sig); err != nil {
			failures = append(failures, err.Error())
			continue
		}
		verified = true
		break
	}
	if !verified {
		return errors.New("cryptographic signature verification failed: " + strings.Join(failures, ", "))
	}
	digest, ref, err := parseSigstorePayload(s.payload)
	if err != nil {
		return err
	}
	if sha256Digest(img.manifest) != digest {
		return policyRequirementError(fmt.Sprintf("Signature for digest %s does not match", digest))
	}
	match, err := r.identityMatches(img, ref)
	if err != nil {
		return err
	}
	if !match {
		return policyRequirementError(fmt.Sprintf("Signature for identity %q is not accepted", ref))
	}
	return nil
}

// verifyECDSA is sigstore's ECDSAVerifier.VerifySignature with SHA-256.
func verifyECDSA(k *ecdsa.PublicKey, payload, sig []byte) error {
	h := sha256.Sum256(payload)
	var rs struct{ R, S *big.Int }
	if _, err := asn1.Unmarshal(sig, &rs); err == nil {
		if !ecdsa.VerifyASN1(k, h[:], sig) {
			return errors.New("invalid signature when validating ASN.1 encoded signature")
		}
		return nil
	}
	if len(sig) == 0 || len(sig) > 132 || len(sig)%2 != 0 {
		return errors.New("ecdsa: Invalid IEEE_P1363 encoded bytes")
	}
	r := new(big.Int).SetBytes(sig[:len(sig)/2])
	s := new(big.Int).SetBytes(sig[len(sig)/2:])
	if !ecdsa.Verify(k, h[:], r, s) {
		return errors.New("invalid signature when validating IEEE_P1363 encoded signature")
	}
	return nil
}

// parseSigstorePayload reads the simple-signing payload strictly
// (UntrustedSigstorePayload.strictUnmarshalJSON).
func parseSigstorePayload(data []byte) (digest, ref string, err error) {
	var p struct {
		Critical *struct {
			Type  string `json:"type"`
			Image *struct {
				Digest string `json:"docker-manifest-digest"`
			} `json:"image"`
			Identity *struct {
				Ref string `json:"docker-reference"`
			} `json:"identity"`
		} `json:"critical"`
		Optional json.RawMessage `json:"optional"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return "", "", err
	}
	switch {
	case p.Critical == nil:
		return "", "", errors.New(`Key "critical" missing in a JSON object`)
	case p.Critical.Type != sigstorePayloadType:
		return "", "", fmt.Errorf("Unrecognized signature type %s", p.Critical.Type)
	case p.Critical.Image == nil:
		return "", "", errors.New(`Key "image" missing in a JSON object`)
	case p.Critical.Identity == nil:
		return "", "", errors.New(`Key "identity" missing in a JSON object`)
	case !isSHA256Digest(p.Critical.Image.Digest):
		return "", "", fmt.Errorf("invalid docker-manifest-digest value %q: invalid checksum digest format", p.Critical.Image.Digest)
	}
	return p.Critical.Image.Digest, p.Critical.Identity.Ref, nil
}

// identityMatches applies signedIdentity (default matchRepoDigestOrExact) to
// the digest-pinned image and the signature's docker-reference.
func (r policyRequirement) identityMatches(img policyImage, sigRef string) (bool, error) {
	var si struct {
		Type             string `json:"type"`
		DockerReference  string `json:"dockerReference"`
		DockerRepository string `json:"dockerRepository"`
	}
	si.Type = "matchRepoDigestOrExact"
	if len(r.SignedIdentity) > 0 {
		if err := json.Unmarshal(r.SignedIdentity, &si); err != nil {
			return false, policyFormatError(err.Error())
		}
	}
	name, suffix, err := splitReference(sigRef)
	if err != nil {
		return false, err
	}
	switch si.Type {
	case "matchRepoDigestOrExact", "matchRepository":
		// The pulled reference has a digest (reference.Canonical): only
		// the repository must match; the digest is checked against the
		// manifest. matchRepoDigestOrExact refuses a name-only signature.
		return name == img.name && (suffix != "" || si.Type == "matchRepository"), nil
	case "matchExact":
		return suffix != "" && name+suffix == img.ref, nil
	case "exactReference":
		return suffix != "" && name+suffix == si.DockerReference, nil
	case "exactRepository":
		return name == si.DockerRepository, nil
	}
	return false, fmt.Errorf("test-bootc: signedIdentity type %q is not modelled", si.Type)
}

// splitReference is reference.ParseNormalizedNamed reduced to what the
// match needs: the normalized name and its ":tag" / "@digest" suffix.
func splitReference(s string) (name, suffix string, err error) {
	if s == "" || strings.ContainsAny(s, " \t\n") {
		return "", "", fmt.Errorf("invalid reference format")
	}
	name = s
	if i := strings.IndexByte(name, '@'); i >= 0 {
		name, suffix = name[:i], name[i:]
	}
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		suffix = name[i:] + suffix
		name = name[:i]
	}
	first, _, hasSlash := strings.Cut(name, "/")
	if !hasSlash || !strings.ContainsAny(first, ".:") && first != "localhost" {
		if !hasSlash {
			name = "library/" + name
		}
		name = "docker.io/" + name
	}
	return name, suffix, nil
}
