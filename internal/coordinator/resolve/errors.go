package resolve

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Kinds of resolution failure; match them with errors.Is.
var (
	// ErrInvalidReference: the reference is not one bootc-fleet accepts. No
	// request was made.
	ErrInvalidReference = errors.New("invalid image reference")
	// ErrNotFound: the registry has no such repository or tag.
	ErrNotFound = errors.New("tag or repository not found")
	// ErrUnauthorized: the registry refused the credentials (or their absence).
	ErrUnauthorized = errors.New("unauthorized")
	// ErrUnreachable: no usable answer from the registry (network failure,
	// timeout, TLS failure, rate limit or server error). Worth retrying.
	ErrUnreachable = errors.New("registry unreachable")
	// ErrTLS: the TLS connection failed, or the registry speaks plain HTTP
	// and is not listed as insecure. Every ErrTLS is also ErrUnreachable.
	ErrTLS = errors.New("TLS failure")
	// ErrBadResponse: the registry answered with something unusable.
	ErrBadResponse = errors.New("unusable registry response")
)

// Error is a failed resolution of Ref at Registry.
type Error struct {
	Ref      string
	Registry string // empty when the reference did not parse
	Kind     error  // one of the Err* kinds above
	Hint     string // what a person can do about it, if known
	Err      error  // the underlying failure
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "resolving %s", e.Ref)
	if e.Registry != "" {
		fmt.Fprintf(&b, " at registry %s", e.Registry)
	}
	// Skip the kind when the cause already starts with it.
	if e.Err == nil || !strings.HasPrefix(e.Err.Error(), e.Kind.Error()) {
		fmt.Fprintf(&b, ": %v", e.Kind)
	}
	if e.Hint != "" {
		fmt.Fprintf(&b, " (%s)", e.Hint)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Is matches the error's kind; a TLS failure is also unreachability.
func (e *Error) Is(target error) bool {
	return target == e.Kind || (e.Kind == ErrTLS && target == ErrUnreachable)
}

func (e *Error) Unwrap() error { return e.Err }

// Reason returns a CamelCase condition reason for a Resolve error.
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrInvalidReference):
		return fleetv1.ReasonInvalidImageReference
	case errors.Is(err, ErrNotFound):
		return fleetv1.ReasonImageNotFound
	case errors.Is(err, ErrUnauthorized):
		return fleetv1.ReasonRegistryUnauthorized
	case errors.Is(err, ErrTLS):
		return fleetv1.ReasonRegistryTLSFailure
	case errors.Is(err, ErrUnreachable):
		return fleetv1.ReasonRegistryUnreachable
	case errors.Is(err, ErrBadResponse):
		return fleetv1.ReasonRegistryBadResponse
	default:
		return fleetv1.ReasonResolveFailed
	}
}

// classify turns a go-containerregistry failure into an *Error. rctx is the
// context of the attempt, bounded by timeout; insecure says plain HTTP was
// allowed, so a failed TLS attempt before it is expected noise.
func classify(rctx context.Context, ref, registry string, insecure bool, timeout time.Duration, err error) *Error {
	e := &Error{Ref: ref, Registry: registry, Err: err}
	switch {
	case errors.Is(err, errPlainHTTP):
		e.Kind = ErrTLS
		e.Hint = "the registry does not answer over TLS; list it as insecure to allow plain HTTP"
	case errors.Is(rctx.Err(), context.DeadlineExceeded):
		e.Kind = ErrUnreachable
		e.Hint = fmt.Sprintf("no answer within %s", timeout)
	case !insecure && isTLS(err):
		e.Kind = ErrTLS
		e.Hint = "check the registry's certificate, or list it as insecure if it serves plain HTTP"
	default:
		var te *transport.Error
		if errors.As(err, &te) {
			e.Kind = kindOfStatus(te)
		} else if isNetwork(err) {
			e.Kind = ErrUnreachable
		} else {
			e.Kind = ErrBadResponse
		}
	}
	return e
}

func kindOfStatus(te *transport.Error) error {
	for _, d := range te.Errors {
		switch d.Code {
		case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode:
			return ErrNotFound
		case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
			return ErrUnauthorized
		case transport.TooManyRequestsErrorCode, transport.UnavailableErrorCode:
			return ErrUnreachable
		}
	}
	switch s := te.StatusCode; {
	case s == http.StatusNotFound:
		return ErrNotFound
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		return ErrUnauthorized
	case s == http.StatusTooManyRequests || s == http.StatusRequestTimeout || s >= 500:
		return ErrUnreachable
	default:
		return ErrBadResponse
	}
}

// isNetwork reports a failure to exchange a request and a response at all.
func isNetwork(err error) bool {
	var ue *url.Error
	var ne net.Error
	return errors.As(err, &ue) || errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded)
}

// isFinal reports an HTTP answer that a GET would only repeat: access
// refused, or the registry overloaded or failing.
func isFinal(err error) bool {
	var te *transport.Error
	if !errors.As(err, &te) {
		return false
	}
	k := kindOfStatus(te)
	return errors.Is(k, ErrUnauthorized) || errors.Is(k, ErrUnreachable)
}

func isTLS(err error) bool {
	var (
		rh   tls.RecordHeaderError
		cv   *tls.CertificateVerificationError
		ua   x509.UnknownAuthorityError
		hn   x509.HostnameError
		ci   x509.CertificateInvalidError
		alrt tls.AlertError
	)
	if errors.As(err, &rh) || errors.As(err, &cv) || errors.As(err, &ua) ||
		errors.As(err, &hn) || errors.As(err, &ci) || errors.As(err, &alrt) {
		return true
	}
	// net/http replaces the RecordHeaderError of a plain-HTTP answer to a
	// TLS hello with an unwrapped error; its text is all there is.
	return strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}
