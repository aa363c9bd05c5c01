// Package metricsauth guards the coordinator's /metrics as
// controller-runtime's filters.WithAuthenticationAndAuthorization does: the
// caller's bearer token is checked with a TokenReview, then the request's
// verb on its non-resource path with a SubjectAccessReview, both answered by
// the API server, with that filter's timeouts, retries, cache lifetimes and
// replies. It needs only client-go's typed clients: the filter builds its
// checks from k8s.io/apiserver's authenticator and authorizer factories,
// which link CEL, gRPC and OpenTelemetry into the coordinator for two
// requests (a sixth of the binary: 125 MB against 105).
//
// What the factories would accept besides a bearer token and this package
// does not: no client certificates, request headers or anonymous requests
// (the filter configures none of them), and no token in a WebSocket
// subprotocol (a scrape is no WebSocket).
package metricsauth

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/lru"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The filter's settings, as controller-runtime v0.25 sets them.
const (
	tokenTTL      = time.Minute      // a TokenReview's answer, either way
	allowTTL      = 5 * time.Minute  // an allowing SubjectAccessReview
	denyTTL       = 30 * time.Second // a denying one
	reviewTimeout = 10 * time.Second // one TokenReview, retries included
	// cacheSize bounds each cache: callers choose the tokens and so the
	// keys, and a bounded cache forgets the oldest rather than grows.
	cacheSize = 1024
)

// retry is the filter's backoff for API errors worth retrying.
var retry = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// errInvalidToken is what a token the TokenReview does not authenticate
// without saying why comes to, as k8s.io/apiserver's bearer-token
// authenticator has it: an error, so a 500.
var errInvalidToken = errors.New("invalid bearer token")

// Provider is a metricsserver.Options.FilterProvider.
func Provider(cfg *rest.Config, hc *http.Client) (metricsserver.Filter, error) {
	authn, err := authenticationclient.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	authz, err := authorizationclient.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	c := New(authn.TokenReviews(), authz.SubjectAccessReviews(), time.Now)
	return c.Filter, nil
}

// Checker authenticates and authorizes requests with the API server.
type Checker struct {
	tokens    authenticationclient.TokenReviewInterface
	reviews   authorizationclient.SubjectAccessReviewInterface
	now       func() time.Time
	users     *lru.Cache // sha256 of the token -> cached[*authenticationv1.UserInfo]
	decisions *lru.Cache // the review's spec as JSON -> cached[authorizationv1.SubjectAccessReviewStatus]
}

type cached[T any] struct {
	value T
	ok    bool
	until time.Time
}

// New returns a Checker asking tokens and reviews, on clock now.
func New(tokens authenticationclient.TokenReviewInterface, reviews authorizationclient.SubjectAccessReviewInterface, now func() time.Time) *Checker {
	return &Checker{tokens: tokens, reviews: reviews, now: now, users: lru.New(cacheSize), decisions: lru.New(cacheSize)}
}

// Filter wraps handler: 401 without a bearer token, 500 when the token is
// not authenticated or a review fails, 403 when the user may not get the
// path, the handler otherwise (with the Authorization header removed).
func (c *Checker) Filter(log logr.Logger, handler http.Handler) (http.Handler, error) {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		token := bearer(req)
		if token == "" {
			log.V(4).Info("Authentication failed")
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		u, err := c.authenticate(req.Context(), token)
		if err != nil {
			log.Error(err, "Authentication failed")
			http.Error(w, "Authentication failed", http.StatusInternalServerError)
			return
		}
		req.Header.Del("Authorization")
		spec := authorizationv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra(u.Extra),
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: req.URL.Path, Verb: strings.ToLower(req.Method)},
		}
		st, err := c.authorize(req.Context(), spec)
		if err != nil {
			msg := fmt.Sprintf("Authorization for user %s failed", u.Username)
			log.Error(err, msg)
			http.Error(w, msg, http.StatusInternalServerError)
			return
		}
		if !st.Allowed || st.Denied {
			msg := fmt.Sprintf("Authorization denied for user %s", u.Username)
			log.V(4).Info(msg + ": " + st.Reason)
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		handler.ServeHTTP(w, req)
	}), nil
}

// bearer is the request's bearer token, "" if it has none (read as
// k8s.io/apiserver's bearer-token authenticator reads it).
func bearer(req *http.Request) string {
	parts := strings.SplitN(strings.TrimSpace(req.Header.Get("Authorization")), " ", 3)
	if len(parts) < 2 || !strings.EqualFold(parts[0], "bearer") {
		return ""
	}
	return parts[1]
}

// authenticate returns who token is, from a TokenReview or its cached
// answer; a token not authenticated is an error.
func (c *Checker) authenticate(ctx context.Context, token string) (*authenticationv1.UserInfo, error) {
	key := sha256.Sum256([]byte(token))
	if v, ok := c.users.Get(key); ok {
		if e := v.(cached[*authenticationv1.UserInfo]); c.now().Before(e.until) {
			if !e.ok {
				return nil, errInvalidToken
			}
			return e.value, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	var res *authenticationv1.TokenReview
	err := withRetries(ctx, func() (err error) {
		res, err = c.tokens.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("TokenReview: %w", err)
	}
	st := res.Status
	if !st.Authenticated && st.Error != "" {
		return nil, errors.New(st.Error) // not cached: it may be passing
	}
	c.users.Add(key, cached[*authenticationv1.UserInfo]{value: &st.User, ok: st.Authenticated, until: c.now().Add(tokenTTL)})
	if !st.Authenticated {
		return nil, errInvalidToken
	}
	return &st.User, nil
}

// authorize returns the SubjectAccessReview's answer for spec, or its
// cached answer.
func (c *Checker) authorize(ctx context.Context, spec authorizationv1.SubjectAccessReviewSpec) (authorizationv1.SubjectAccessReviewStatus, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return authorizationv1.SubjectAccessReviewStatus{}, err
	}
	key := string(raw)
	if v, ok := c.decisions.Get(key); ok {
		if e := v.(cached[authorizationv1.SubjectAccessReviewStatus]); c.now().Before(e.until) {
			return e.value, nil
		}
	}
	var res *authorizationv1.SubjectAccessReview
	err = withRetries(ctx, func() (err error) {
		res, err = c.reviews.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return authorizationv1.SubjectAccessReviewStatus{}, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	st := res.Status
	if st.Allowed && st.Denied {
		return st, errors.New("webhook subject access review returned both allow and deny response")
	}
	ttl := denyTTL
	if st.Allowed {
		ttl = allowTTL
	}
	c.decisions.Add(key, cached[authorizationv1.SubjectAccessReviewStatus]{value: st, ok: true, until: c.now().Add(ttl)})
	return st, nil
}

// withRetries calls fn until it succeeds, fails for good, or retry's steps
// or ctx run out; the error is fn's last.
func withRetries(ctx context.Context, fn func() error) error {
	var last error
	err := wait.ExponentialBackoffWithContext(ctx, retry, func(context.Context) (bool, error) {
		last = fn()
		switch {
		case last == nil:
			return true, nil
		case transient(last):
			return false, nil
		}
		return false, last
	})
	if last != nil {
		return last
	}
	return err
}

// transient: the errors k8s.io/apiserver's webhooks retry
// (webhook.DefaultShouldRetry).
func transient(err error) bool {
	if utilnet.IsConnectionReset(err) || utilnet.IsHTTP2ConnectionLost(err) || apierrors.IsInternalError(err) ||
		apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) {
		return true
	}
	_, retry := apierrors.SuggestsClientDelay(err)
	return retry
}

func extra(in map[string]authenticationv1.ExtraValue) map[string]authorizationv1.ExtraValue {
	if in == nil {
		return nil
	}
	out := make(map[string]authorizationv1.ExtraValue, len(in))
	for k, v := range in {
		out[k] = authorizationv1.ExtraValue(v)
	}
	return out
}
