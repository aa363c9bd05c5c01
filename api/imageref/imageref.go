// Package imageref validates the container image references bootc-fleet accepts.
//
// The grammar is a strict subset of the distribution reference grammar: a
// reference must name a tag, a sha256 digest, or both, and may contain no
// characters outside that grammar (no spaces, no shell metacharacters). The
// same expressions are compiled into the CRD schema, so the API server and the
// programs agree on what a valid reference is (a test keeps them in sync).
package imageref

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

const (
	domainComponent = `[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?`
	domain          = domainComponent + `(?:\.` + domainComponent + `)*(?::[0-9]{1,5})?`
	pathComponent   = `[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*`
	repository      = `(?:` + domain + `/)?` + pathComponent + `(?:/` + pathComponent + `)*`
	tag             = `:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`
	digest          = `@sha256:[a-f0-9]{64}`

	// Pattern matches a reference with a tag, a digest or both. It is the
	// pattern of BootcNodePool.spec.image.
	Pattern = `^` + repository + `(?:` + tag + `(?:` + digest + `)?|` + digest + `)$`
	// PinnedPattern matches a digest-pinned reference without a tag
	// (repo@sha256:<64 hex>). It is the pattern of BootcNode.spec.desiredImage
	// and of the image annotation of a grant.
	PinnedPattern = `^` + repository + digest + `$`

	// MaxLength bounds every reference; longer input is rejected unread.
	MaxLength = 512
)

var (
	patternRE = regexp.MustCompile(Pattern)
	pinnedRE  = regexp.MustCompile(PinnedPattern)
)

// ErrInvalid is wrapped by every validation error of this package.
var ErrInvalid = errors.New("invalid image reference")

// Validate reports whether ref is a tag or digest reference bootc-fleet accepts.
func Validate(ref string) error {
	if err := checkLength(ref); err != nil {
		return err
	}
	if !patternRE.MatchString(ref) {
		return fmt.Errorf("%w %q: want registry/repo:tag or registry/repo@sha256:<64 lowercase hex>", ErrInvalid, ref)
	}
	return nil
}

// ErrNoRegistryHost is wrapped by ValidateWithHost for a reference whose
// first component is not a registry host.
var ErrNoRegistryHost = errors.New("image reference names no registry host")

// HostRule is the CEL rule of BootcNodePool.spec.image that HasRegistryHost
// implements (a test keeps them in agreement).
const HostRule = "self.contains('/') && (self.split('/')[0].contains('.') || self.split('/')[0].contains(':') || self.split('/')[0] == 'localhost')"

// HasRegistryHost reports whether ref starts with a registry host, by the
// rule of the distribution reference grammar: a first component with a dot
// or a port, or "localhost". Short names ("fedora/fedora-bootc:42") are
// completed differently by bootc (containers-registries.conf short-name
// aliases) and by go-containerregistry (docker.io), so a pool must say
// which registry it means.
func HasRegistryHost(ref string) bool {
	first, _, ok := strings.Cut(ref, "/")
	return ok && (strings.Contains(first, ".") || strings.Contains(first, ":") || first == "localhost")
}

// ValidateWithHost is Validate plus HasRegistryHost: what a pool's image must be.
func ValidateWithHost(ref string) error {
	if err := Validate(ref); err != nil {
		return err
	}
	if !HasRegistryHost(ref) {
		return fmt.Errorf("%w: %q: write the registry host, e.g. quay.io/%s (bootc and the coordinator complete short names differently)", ErrNoRegistryHost, ref, ref)
	}
	return nil
}

// Pinned is a validated digest-pinned reference.
type Pinned struct {
	Repository string // e.g. quay.io/example/os
	Digest     string // sha256:<64 hex>
}

// String returns repo@sha256:..., the only form passed to bootc.
func (p Pinned) String() string { return p.Repository + "@" + p.Digest }

// ParsePinned validates a repo@sha256:<64 hex> reference and splits it.
func ParsePinned(ref string) (Pinned, error) {
	if err := checkLength(ref); err != nil {
		return Pinned{}, err
	}
	if !pinnedRE.MatchString(ref) {
		return Pinned{}, fmt.Errorf("%w %q: want a digest-pinned registry/repo@sha256:<64 lowercase hex>", ErrInvalid, ref)
	}
	at := strings.LastIndexByte(ref, '@')
	return Pinned{Repository: ref[:at], Digest: ref[at+1:]}, nil
}

// Repository returns the repository part of a valid reference (no tag, no digest).
func Repository(ref string) (string, error) {
	if err := Validate(ref); err != nil {
		return "", err
	}
	if at := strings.IndexByte(ref, '@'); at >= 0 {
		ref = ref[:at]
	}
	// A tag's colon comes after the last slash; a port's colon comes before it.
	if c := strings.LastIndexByte(ref, ':'); c > strings.LastIndexByte(ref, '/') {
		ref = ref[:c]
	}
	return ref, nil
}

// PinnedFromDigest builds repo@digest from any valid reference and a digest
// the registry returned, validating both.
func PinnedFromDigest(ref, dgst string) (Pinned, error) {
	repo, err := Repository(ref)
	if err != nil {
		return Pinned{}, err
	}
	return ParsePinned(repo + "@" + dgst)
}

// IsDigest reports whether s is a sha256:<64 lowercase hex> digest.
func IsDigest(s string) bool { return digestRE.MatchString(s) }

var digestRE = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)

func checkLength(ref string) error {
	if ref == "" {
		return fmt.Errorf("%w: empty", ErrInvalid)
	}
	if len(ref) > MaxLength {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalid, len(ref), MaxLength)
	}
	return nil
}
