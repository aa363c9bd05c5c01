// Package platform matches nodes to the per-platform images of a multi-arch
// image index (an OCI image index or a Docker manifest list).
//
// bootc pulls an index by picking the image of the host's platform and
// reports that image's manifest digest, never the index's. A pool whose
// image is an index therefore converges only if each node is told the digest
// of its own platform's image. The resolver reads the index into an Index;
// the planner looks each node's platform up in it. Everything here is pure.
//
// Platforms are compared after the normalization containerd applies
// (github.com/containerd/platforms): x86_64 is amd64, aarch64 is arm64, and
// an architecture's default variant equals no variant (amd64 v1, arm64 v8,
// arm v7). A Node reports no variant (Node.status.nodeInfo has only
// operatingSystem and architecture), so it matches the entries of its
// architecture with no variant or the default one, and nothing else: an
// arm64 node is never given an arm64/v9 or a 32-bit arm image.
package platform

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// MaxEntries bounds the manifests of an index the coordinator accepts, and
// so the size of an Index.
const MaxEntries = 256

// Reasons a node has no image in an index (api/v1alpha1 holds the names).
const (
	ReasonNotInIndex  = fleetv1.ReasonPlatformNotInIndex
	ReasonAmbiguous   = fleetv1.ReasonPlatformAmbiguous
	ReasonNodeUnknown = fleetv1.ReasonNodePlatformUnknown
)

var tokenRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,31}$`)

// ValidToken reports whether s is a usable os, architecture or variant: 1-32
// lowercase letters, digits, '.', '_' or '-', starting with a letter or digit.
func ValidToken(s string) bool { return tokenRE.MatchString(s) }

// Key normalizes a platform to "os/arch" or "os/arch/variant", the key of
// Index.Entries. Callers validate the parts first (ValidToken).
func Key(os, arch, variant string) string {
	switch arch {
	case "x86_64", "x86-64":
		arch = "amd64"
	case "aarch64":
		arch = "arm64"
	case "armhf":
		arch, variant = "arm", "v7"
	case "armel":
		arch, variant = "arm", "v6"
	case "i386", "i486", "i586", "i686":
		arch = "386"
	}
	switch arch {
	case "amd64":
		if variant == "v1" {
			variant = ""
		}
	case "arm64":
		switch variant {
		case "8", "v8", "v8.0":
			variant = ""
		}
	case "arm":
		switch variant {
		case "", "7":
			variant = "v7"
		case "5", "6", "8":
			variant = "v" + variant
		}
	}
	if variant == "" {
		return os + "/" + arch
	}
	return os + "/" + arch + "/" + variant
}

// Entry is one image manifest an index lists.
type Entry struct {
	// Platform is the entry's platform as the index writes it, e.g. linux/arm64/v8.
	Platform string
	// Digest is the image manifest's digest, sha256:<64 hex>.
	Digest string
}

// Index is what the coordinator uses of a multi-arch index.
type Index struct {
	// Digest is the index's own digest (the pool's targetImage).
	Digest string
	// Entries are the index's image manifests, by Key of their platform.
	// Several entries under one key with different digests make that
	// platform ambiguous. Entries the coordinator cannot use (nested
	// indexes, attestations, entries without a platform) are left out.
	Entries map[string][]Entry
}

// Add records an image manifest of the index. It validates what it is
// given: the index is outside input.
func (ix *Index) Add(os, arch, variant, digest string) error {
	for _, t := range []struct{ what, v string }{{"os", os}, {"architecture", arch}} {
		if !ValidToken(t.v) {
			return fmt.Errorf("%s %q is not a platform name", t.what, t.v)
		}
	}
	if variant != "" && !ValidToken(variant) {
		return fmt.Errorf("variant %q is not a platform name", variant)
	}
	if !imageref.IsDigest(digest) {
		return fmt.Errorf("digest %q is not sha256:<64 lowercase hex>", digest)
	}
	if ix.Entries == nil {
		ix.Entries = map[string][]Entry{}
	}
	n := 0
	for _, es := range ix.Entries {
		n += len(es)
	}
	if n >= MaxEntries {
		return fmt.Errorf("more than %d image manifests", MaxEntries)
	}
	written := os + "/" + arch
	if variant != "" {
		written += "/" + variant
	}
	k := Key(os, arch, variant)
	for _, e := range ix.Entries[k] {
		if e.Digest == digest {
			return nil // the same image listed twice is still one image
		}
	}
	ix.Entries[k] = append(ix.Entries[k], Entry{Platform: written, Digest: digest})
	return nil
}

// Platforms lists the keys of the index's entries, sorted.
func (ix *Index) Platforms() []string {
	out := make([]string, 0, len(ix.Entries))
	for k := range ix.Entries {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Problem says why a node has no image in an index.
type Problem struct {
	Reason  string // one of the Reason* constants
	Message string // for a person: what is missing and what there is
}

func (p Problem) String() string { return p.Reason + ": " + p.Message }

// For returns the digest of the image for a node that reports os and arch
// (Node.status.nodeInfo.operatingSystem and .architecture), or why there is
// none.
func (ix *Index) For(os, arch string) (string, *Problem) {
	if !ValidToken(os) || !ValidToken(arch) {
		return "", &Problem{ReasonNodeUnknown, fmt.Sprintf("the Node reports operatingSystem %q and architecture %q in status.nodeInfo; the image is a multi-arch index, so the node's platform decides its image", os, arch)}
	}
	k := Key(os, arch, "")
	switch es := ix.Entries[k]; len(es) {
	case 0:
		return "", &Problem{ReasonNotInIndex, fmt.Sprintf("index %s has no image for %s (it has %s)", text.ShortDigest(ix.Digest), k, orNone(ix.Platforms()))}
	case 1:
		return es[0].Digest, nil
	default:
		var c []string
		for _, e := range es {
			c = append(c, e.Platform+" "+text.ShortDigest(e.Digest))
		}
		return "", &Problem{ReasonAmbiguous, fmt.Sprintf("index %s has %d images for %s that cannot be told apart (%s)", text.ShortDigest(ix.Digest), len(es), k, strings.Join(c, ", "))}
	}
}

func orNone(ks []string) string {
	if len(ks) == 0 {
		return "no usable image"
	}
	if len(ks) > 8 {
		return strings.Join(ks[:8], ", ") + fmt.Sprintf(" and %d more", len(ks)-8)
	}
	return strings.Join(ks, ", ")
}

// shortDigest abbreviates a digest for messages: sha256:ab12cd34ef56….
