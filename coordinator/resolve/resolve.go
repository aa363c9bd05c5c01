// Package resolve turns a pool's image reference into the digest every node
// of the pool converges to.
//
// A digest reference is used as written, without asking the registry. A tag
// is resolved with one manifest request (HEAD, falling back to GET for
// registries that answer HEAD badly). The digest of a multi-arch index is a
// valid result: bootc pulls by that digest and picks its platform itself.
//
// Plain HTTP is used only for the registry hosts listed in Options.Insecure.
// go-containerregistry on its own would also fall back to HTTP for loopback
// and private addresses; here that fallback is refused for every host not
// listed, so an unlisted host is reached over TLS or not at all.
package resolve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
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

// Resolve returns ref pinned to a digest. A reference that already carries a
// digest is returned pinned as written, without a request; a tag is resolved
// through the registry. Errors are *Error and match one of
// ErrInvalidReference, ErrNotFound, ErrUnauthorized, ErrUnreachable (TLS
// failures also match ErrTLS) or ErrBadResponse with errors.Is, unless the
// caller's ctx ended first (then the error wraps ctx.Err()).
func (r *Resolver) Resolve(ctx context.Context, ref string) (imageref.Pinned, error) {
	if err := imageref.Validate(ref); err != nil {
		return imageref.Pinned{}, &Error{Ref: ref, Kind: ErrInvalidReference, Err: err}
	}
	if at := strings.LastIndexByte(ref, '@'); at >= 0 {
		p, err := imageref.PinnedFromDigest(ref, ref[at+1:])
		if err != nil {
			return imageref.Pinned{}, &Error{Ref: ref, Kind: ErrInvalidReference, Err: err}
		}
		return p, nil
	}

	tag, err := name.NewTag(ref)
	if err != nil {
		return imageref.Pinned{}, &Error{Ref: ref, Kind: ErrInvalidReference, Err: err}
	}
	registry := tag.RegistryStr()
	if r.insecure[registry] {
		if tag, err = name.NewTag(ref, name.Insecure); err != nil {
			return imageref.Pinned{}, &Error{Ref: ref, Registry: registry, Kind: ErrInvalidReference, Err: err}
		}
	}

	rctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	opts := []remote.Option{
		remote.WithContext(rctx),
		remote.WithAuthFromKeychain(r.keychain),
		remote.WithTransport(r.transport),
		// go-containerregistry's retries sleep regardless of ctx (1s, then
		// 3s); keep them short so Timeout stays close to the real bound.
		// The pool is resolved again on its interval anyway.
		remote.WithRetryBackoff(remote.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 3}),
	}

	dgst, err := r.digest(tag, opts)
	if err != nil {
		if ctx.Err() != nil {
			// The caller gave up; that says nothing about the registry.
			return imageref.Pinned{}, fmt.Errorf("resolving %s: %w", ref, ctx.Err())
		}
		return imageref.Pinned{}, classify(ref, registry, r.insecure[registry], r.timeout, rctx, err)
	}
	p, err := imageref.PinnedFromDigest(ref, dgst)
	if err != nil {
		// A digest we cannot pin (e.g. not sha256) is the registry's answer
		// we refuse, not a bad reference from the user.
		return imageref.Pinned{}, &Error{Ref: ref, Registry: registry, Kind: ErrBadResponse, Err: err}
	}
	return p, nil
}

// digest asks for the manifest's digest with HEAD and falls back to GET when
// HEAD got an answer a GET might improve on (some registries mishandle HEAD).
func (r *Resolver) digest(tag name.Tag, opts []remote.Option) (string, error) {
	desc, headErr := remote.Head(tag, opts...)
	if headErr == nil {
		return desc.Digest.String(), nil
	}
	if isNetwork(headErr) || isFinal(headErr) {
		return "", headErr
	}
	full, err := remote.Get(tag, opts...)
	if err != nil {
		return "", err
	}
	return full.Digest.String(), nil
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
