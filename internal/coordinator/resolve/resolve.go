// Package resolve turns a pool's image reference into the digest its nodes
// converge to.
//
// A tag is resolved to the digest the registry serves for it. When that
// digest is a multi-arch index, the index is read too: bootc pulls an index
// by picking its host's platform and reports that image's digest, never the
// index's, so each node is given its own platform's image
// (internal/coordinator/platform). A digest reference is used as written; the
// registry is only asked whether it is an index.
//
// Plain HTTP is used only for the registry hosts listed in Options.Insecure.
// go-containerregistry on its own would also fall back to HTTP for loopback
// and private addresses; here that fallback is refused for every host not
// listed, so an unlisted host is reached over TLS or not at all.
package resolve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/platform"
)

// DefaultTimeout bounds one Resolve when Options.Timeout is zero.
const DefaultTimeout = 30 * time.Second

// Options configures a Resolver.
type Options struct {
	// Insecure lists registry hosts (host or host:port, as written in image
	// references, e.g. 127.0.0.1:5000) that may be reached over plain HTTP.
	Insecure []string
	// Timeout bounds one Resolve, retries included. Zero means DefaultTimeout.
	Timeout time.Duration
	// Keychain supplies registry credentials. Nil means anonymous access.
	Keychain authn.Keychain
	// Transport is the base HTTP transport (for a custom CA bundle or a
	// proxy). Nil means a clone of http.DefaultTransport.
	Transport http.RoundTripper
}

// Resolver resolves image references to digests. It is safe for concurrent use.
type Resolver struct {
	insecure  map[string]bool
	timeout   time.Duration
	keychain  authn.Keychain
	transport http.RoundTripper

	mu    sync.Mutex
	cache []cacheEntry // inspected digests, oldest first
}

// New returns a Resolver with opts.
func New(opts Options) *Resolver {
	r := &Resolver{
		insecure: map[string]bool{},
		timeout:  opts.Timeout,
		keychain: opts.Keychain,
	}
	for _, h := range opts.Insecure {
		r.insecure[strings.TrimSpace(h)] = true
	}
	if r.timeout <= 0 {
		r.timeout = DefaultTimeout
	}
	if r.keychain == nil {
		// An empty multi-keychain resolves every registry to anonymous.
		r.keychain = authn.NewMultiKeychain()
	}
	base := opts.Transport
	if base == nil {
		base = http.DefaultTransport.(*http.Transport).Clone()
	}
	r.transport = &httpGuard{base: base, allowed: r.insecure}
	return r
}

// Target is what a pool's image resolved to.
type Target struct {
	// Image is the reference pinned to the digest the registry serves for
	// it: an image manifest's digest, or the index digest of a multi-arch
	// image. It is the pool's status.targetImage.
	Image imageref.Pinned
	// Index holds the per-platform images when Image is a multi-arch index
	// (OCI image index or Docker manifest list); nil for a single manifest.
	// Each node converges to its own platform's image (docs/design.md,
	// amendment 12). Shared between callers: read it, never change it.
	Index *platform.Index
	// Uninspected is set when the reference named its digest and the
	// registry could not be asked what that digest is (unreachable, refused
	// the credentials, or does not have it): the digest is then used as
	// written for every node, as for a single manifest, which is right
	// unless it is an index. It wraps an *Error; the next Resolve asks again.
	Uninspected error
}

// Limits on what a registry may answer; larger answers are refused.
const (
	// MaxIndexBytes bounds the size of an index manifest.
	MaxIndexBytes = 1 << 20
	// MaxIndexManifests bounds the manifests one index may list.
	MaxIndexManifests = platform.MaxEntries
	// maxCached bounds the inspected digests kept (content-addressed, so an
	// answer never goes stale).
	maxCached = 128
)

// Resolve pins ref to a digest and, when that digest is a multi-arch index,
// reads the index. A tag is resolved with one manifest request (HEAD,
// falling back to GET for registries that answer HEAD badly), plus one GET
// of the index the first time an index digest is seen. A reference that
// carries a digest is pinned as written; the registry is asked once whether
// that digest is an index (the answer is cached), and if it cannot be asked
// the digest is still used (Target.Uninspected says so).
//
// Errors are *Error and match one of ErrInvalidReference, ErrNotFound,
// ErrUnauthorized, ErrUnreachable (TLS failures also match ErrTLS) or
// ErrBadResponse (which includes an index the coordinator refuses) with
// errors.Is, unless the caller's ctx ended first (then the error wraps
// ctx.Err()).
//
// auth supplies the credentials for this lookup (a pool's pull secret);
// nil means Options.Keychain.
func (r *Resolver) Resolve(ctx context.Context, ref string, auth authn.Keychain) (Target, error) {
	if err := imageref.ValidateWithHost(ref); err != nil {
		return Target{}, &Error{Ref: ref, Kind: ErrInvalidReference, Err: err}
	}
	at := strings.LastIndexByte(ref, '@')
	var pinned imageref.Pinned // set for a digest reference
	if at >= 0 {
		p, err := imageref.PinnedFromDigest(ref, ref[at+1:])
		if err != nil {
			return Target{}, &Error{Ref: ref, Kind: ErrInvalidReference, Err: err}
		}
		pinned = p
	}
	nref, err := r.parse(ref, pinned)
	if err != nil {
		return Target{}, err
	}
	if at >= 0 {
		if ix, ok := r.cached(nref.Context(), pinned.Digest); ok {
			return Target{Image: pinned, Index: ix}, nil
		}
	}
	registry := nref.Context().RegistryStr()

	rctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	opts, err := r.remoteOptions(rctx, auth)
	if err != nil {
		return Target{}, &Error{Ref: ref, Registry: registry, Kind: ErrUnreachable, Err: err}
	}

	dgst, ix, err := r.inspect(nref, opts)
	if err != nil {
		if ctx.Err() != nil {
			// The caller gave up; that says nothing about the registry.
			return Target{}, fmt.Errorf("resolving %s: %w", ref, ctx.Err())
		}
		var e *Error
		if !errors.As(err, &e) {
			e = classify(rctx, ref, registry, r.insecure[registry], r.timeout, err)
		}
		e.Ref, e.Registry = ref, registry
		if at >= 0 && !errors.Is(e.Kind, ErrBadResponse) {
			// The digest is the user's; only what it is stays unknown.
			return Target{Image: pinned, Uninspected: e}, nil
		}
		return Target{}, e
	}
	p, err := imageref.PinnedFromDigest(ref, dgst)
	if err != nil {
		// A digest we cannot pin (e.g. not sha256) is the registry's answer
		// we refuse, not a bad reference from the user.
		return Target{}, &Error{Ref: ref, Registry: registry, Kind: ErrBadResponse, Err: err}
	}
	if at >= 0 && p != pinned {
		return Target{}, &Error{Ref: ref, Registry: registry, Kind: ErrBadResponse, Err: fmt.Errorf("asked for %s, the registry answered for %s", pinned.Digest, p.Digest)}
	}
	if at >= 0 || ix != nil {
		r.remember(nref.Context(), p.Digest, ix)
	}
	return Target{Image: p, Index: ix}, nil
}

// remoteOptions are the options of one lookup bounded by rctx, with the
// credentials of auth (nil: Options.Keychain).
func (r *Resolver) remoteOptions(rctx context.Context, auth authn.Keychain) ([]remote.Option, error) {
	keychain := auth
	if keychain == nil {
		keychain = r.keychain
	}
	opts := []remote.Option{
		remote.WithContext(rctx),
		remote.WithAuthFromKeychain(keychain),
		remote.WithTransport(r.transport),
		// go-containerregistry's retries sleep regardless of ctx (1s, then
		// 3s); keep them short so Timeout stays close to the real bound.
		// The pool is resolved again on its interval anyway.
		remote.WithRetryBackoff(remote.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 3}),
	}
	// One puller for the HEAD and a GET of the index: one authentication.
	puller, err := remote.NewPuller(opts...)
	if err != nil {
		return nil, err
	}
	return append(opts, remote.Reuse(puller)), nil
}

// parse turns ref (or, for a digest reference, pinned) into a
// go-containerregistry reference, allowed plain HTTP when its registry is
// listed as insecure.
func (r *Resolver) parse(ref string, pinned imageref.Pinned) (name.Reference, error) {
	mk := func(opts ...name.Option) (name.Reference, error) {
		if pinned.Digest != "" {
			return name.NewDigest(pinned.String(), opts...)
		}
		return name.NewTag(ref, opts...)
	}
	n, err := mk()
	if err != nil {
		return nil, &Error{Ref: ref, Kind: ErrInvalidReference, Err: err}
	}
	registry := n.Context().RegistryStr()
	if r.insecure[registry] {
		if n, err = mk(name.Insecure); err != nil {
			return nil, &Error{Ref: ref, Registry: registry, Kind: ErrInvalidReference, Err: err}
		}
	}
	return n, nil
}

// inspect asks for the manifest's digest and media type with HEAD, falling
// back to GET when HEAD got an answer a GET might improve on (some
// registries mishandle HEAD), and reads the index when it is one.
func (r *Resolver) inspect(ref name.Reference, opts []remote.Option) (string, *platform.Index, error) {
	desc, headErr := remote.Head(ref, opts...)
	if headErr != nil {
		if isNetwork(headErr) || isFinal(headErr) {
			return "", nil, headErr
		}
		full, err := remote.Get(ref, opts...)
		if err != nil {
			return "", nil, err
		}
		if !full.MediaType.IsIndex() {
			return full.Digest.String(), nil, nil
		}
		ix, err := readIndex(full.Digest.String(), full.Manifest)
		return full.Digest.String(), ix, err
	}
	dgst := desc.Digest.String()
	if !desc.MediaType.IsIndex() {
		return dgst, nil, nil
	}
	if ix, ok := r.cached(ref.Context(), dgst); ok {
		return dgst, ix, nil
	}
	if desc.Size > MaxIndexBytes {
		return "", nil, badIndex(dgst, fmt.Errorf("%d bytes, at most %d", desc.Size, MaxIndexBytes))
	}
	// By digest: go-containerregistry checks the content against it.
	full, err := remote.Get(ref.Context().Digest(dgst), opts...)
	if err != nil {
		return "", nil, err
	}
	if !full.MediaType.IsIndex() {
		return "", nil, badIndex(dgst, fmt.Errorf("HEAD said media type %s, GET says %s", desc.MediaType, full.MediaType))
	}
	ix, err := readIndex(dgst, full.Manifest)
	return dgst, ix, err
}

// attestationType is the annotation buildx puts on an index's attestation
// manifests (platform unknown/unknown): they are not images to boot.
const attestationType = "vnd.docker.reference.type"

// readIndex parses an index manifest (outside input: bounded and validated)
// into the images the coordinator can give nodes.
func readIndex(dgst string, raw []byte) (*platform.Index, error) {
	if len(raw) > MaxIndexBytes {
		return nil, badIndex(dgst, fmt.Errorf("%d bytes, at most %d", len(raw), MaxIndexBytes))
	}
	im, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, badIndex(dgst, err)
	}
	if len(im.Manifests) > MaxIndexManifests {
		return nil, badIndex(dgst, fmt.Errorf("it lists %d manifests, at most %d", len(im.Manifests), MaxIndexManifests))
	}
	ix := &platform.Index{Digest: dgst, Entries: map[string][]platform.Entry{}}
	for i, m := range im.Manifests {
		// Nested indexes, artifacts, attestations and entries without a
		// platform are nothing a node can boot: no node is matched to them.
		if !m.MediaType.IsImage() || m.Platform == nil || m.Annotations[attestationType] != "" {
			continue
		}
		if err := ix.Add(m.Platform.OS, m.Platform.Architecture, m.Platform.Variant, m.Digest.String()); err != nil {
			return nil, badIndex(dgst, fmt.Errorf("manifest %d: %w", i, err))
		}
	}
	return ix, nil
}

func badIndex(dgst string, err error) *Error {
	return &Error{Kind: ErrBadResponse, Hint: "the coordinator refuses this index", Err: fmt.Errorf("index %s: %w", dgst, err)}
}

type cacheEntry struct {
	key string
	ix  *platform.Index
}

// cached returns what an earlier Resolve learned about repo@dgst.
func (r *Resolver) cached(repo name.Repository, dgst string) (*platform.Index, bool) {
	key := repo.Name() + "@" + dgst
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.cache {
		if e.key == key {
			return e.ix, true
		}
	}
	return nil, false
}

// remember records what repo@dgst is (ix nil: a single manifest), oldest
// out first.
func (r *Resolver) remember(repo name.Repository, dgst string, ix *platform.Index) {
	key := repo.Name() + "@" + dgst
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.cache {
		if e.key == key {
			return
		}
	}
	if len(r.cache) >= maxCached {
		r.cache = r.cache[1:]
	}
	r.cache = append(r.cache, cacheEntry{key: key, ix: ix})
}

// httpGuard refuses plain-HTTP requests to hosts not listed as insecure.
type httpGuard struct {
	base    http.RoundTripper
	allowed map[string]bool
}

// errPlainHTTP marks a refused plain-HTTP request.
var errPlainHTTP = errors.New("plain HTTP refused")

func (g *httpGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !g.allowed[req.URL.Host] {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("%w: registry %s is not listed as insecure", errPlainHTTP, req.URL.Host)
	}
	return g.base.RoundTrip(req)
}
