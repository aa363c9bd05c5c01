package resolve

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
)

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// testRegistry is go-containerregistry's in-process registry served over
// real HTTP on 127.0.0.1, with every request counted.
type testRegistry struct {
	srv       *httptest.Server
	host      string // 127.0.0.1:port
	requests  atomic.Int64
	manifests atomic.Int64 // requests for a manifest (HEAD or GET)
	// wrap, if set, may answer a request instead of the registry.
	wrap func(w http.ResponseWriter, r *http.Request, next http.Handler)
}

func newRegistry(t testing.TB) *testRegistry {
	t.Helper()
	tr := &testRegistry{}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	tr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.requests.Add(1)
		if strings.Contains(r.URL.Path, "/manifests/") {
			tr.manifests.Add(1)
		}
		if tr.wrap != nil {
			tr.wrap(w, r, reg)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(tr.srv.Close)
	tr.host = strings.TrimPrefix(tr.srv.URL, "http://")
	return tr
}

// push writes a random image to ref (host-relative, e.g. "fleet/os:1") and
// returns its digest.
func (tr *testRegistry) push(t testing.TB, ref string) v1.Hash {
	t.Helper()
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(tr.host+"/"+ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatalf("pushing %s: %v", tag, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func (tr *testRegistry) resolver(opts Options) *Resolver {
	opts.Insecure = append(opts.Insecure, tr.host)
	return New(opts)
}

func TestResolveTagFollowsTheTag(t *testing.T) {
	tr := newRegistry(t)
	r := tr.resolver(Options{})
	ctx := context.Background()
	ref := tr.host + "/fleet/os:stable"

	first := tr.push(t, "fleet/os:stable")
	got, err := r.Resolve(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := imageref.Pinned{Repository: tr.host + "/fleet/os", Digest: first.String()}
	if got.Image != want || got.Index != nil || got.Uninspected != nil {
		t.Fatalf("Resolve = %+v, want %+v as a single manifest", got, want)
	}

	second := tr.push(t, "fleet/os:stable")
	if second == first {
		t.Fatal("random images collided")
	}
	got, err = r.Resolve(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Image.Digest != second.String() {
		t.Fatalf("after re-pointing the tag Resolve = %s, want %s", got.Image.Digest, second)
	}
	if _, err := imageref.ParsePinned(got.Image.String()); err != nil {
		t.Fatalf("result is not a valid pinned reference: %v", err)
	}
}

func TestResolveDigestReferenceIsInspectedOnce(t *testing.T) {
	tr := newRegistry(t)
	single := tr.push(t, "fleet/os:1")
	multi, _ := tr.pushIndex(t, "fleet/os:multi", "linux/amd64", "linux/arm64/v8")
	cases := []struct {
		name, ref, want string
		index           bool
	}{
		{"single manifest", tr.host + "/fleet/os@" + single.String(), tr.host + "/fleet/os@" + single.String(), false},
		{"tag and digest keeps the digest, drops the tag", tr.host + "/fleet/os:1@" + single.String(), tr.host + "/fleet/os@" + single.String(), false},
		{"index", tr.host + "/fleet/os@" + multi.String(), tr.host + "/fleet/os@" + multi.String(), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := tr.resolver(Options{})
			tr.requests.Store(0)
			got, err := r.Resolve(context.Background(), c.ref, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Image.String() != c.want || (got.Index != nil) != c.index || got.Uninspected != nil {
				t.Fatalf("Resolve(%q) = %+v, want %s (index %v)", c.ref, got, c.want, c.index)
			}
			if tr.requests.Load() == 0 {
				t.Fatal("the registry was not asked what the digest is")
			}
			// Content-addressed: the answer is kept.
			tr.requests.Store(0)
			again, err := r.Resolve(context.Background(), c.ref, nil)
			if err != nil || again.Image != got.Image || again.Index != got.Index {
				t.Fatalf("second Resolve = %+v, %v; want %+v", again, err, got)
			}
			if n := tr.requests.Load(); n != 0 {
				t.Fatalf("second Resolve of a digest made %d requests, want 0", n)
			}
		})
	}
}

func TestResolveDigestReferenceTheRegistryCannotAnswerIsUsedAsWritten(t *testing.T) {
	tr := newRegistry(t)
	closed := httptest.NewServer(http.NotFoundHandler())
	closedHost := strings.TrimPrefix(closed.URL, "http://")
	closed.Close()
	tr.push(t, "private/os:1")
	cases := []struct {
		name string
		ref  string
		wrap func(w http.ResponseWriter, r *http.Request, next http.Handler)
		kind error
	}{
		{"unreachable", closedHost + "/fleet/os@sha256:" + hex64, nil, ErrUnreachable},
		{"not in the registry", tr.host + "/fleet/os@sha256:" + hex64, nil, ErrNotFound},
		{"credentials refused", tr.host + "/private/os@sha256:" + hex64, func(w http.ResponseWriter, _ *http.Request, _ http.Handler) {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(http.StatusUnauthorized)
		}, ErrUnauthorized},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr.wrap = c.wrap
			defer func() { tr.wrap = nil }()
			r := New(Options{Insecure: []string{tr.host, closedHost}, Timeout: 5 * time.Second})
			got, err := r.Resolve(context.Background(), c.ref, nil)
			if err != nil {
				t.Fatalf("Resolve = %v, want the digest used as written", err)
			}
			if got.Image.String() != c.ref || got.Index != nil || !errors.Is(got.Uninspected, c.kind) {
				t.Fatalf("Resolve = %+v, want %s as written, Uninspected %v", got, c.ref, c.kind)
			}
			if !strings.Contains(got.Uninspected.Error(), c.ref) {
				t.Fatalf("Uninspected %q does not name the reference", got.Uninspected)
			}
			// Not remembered: the next Resolve asks again.
			tr.requests.Store(0)
			if _, err := r.Resolve(context.Background(), c.ref, nil); err != nil {
				t.Fatal(err)
			}
			if !errors.Is(c.kind, ErrUnreachable) && tr.requests.Load() == 0 {
				t.Fatal("an uninspected digest was cached")
			}
		})
	}
}

func TestResolveRejectsInvalidReferencesWithoutRequests(t *testing.T) {
	tr := newRegistry(t)
	r := tr.resolver(Options{})
	cases := []struct{ name, ref string }{
		{"command substitution", tr.host + "/$(reboot)/os:1"},
		{"semicolon", tr.host + "/os:1;reboot"},
		{"backtick", tr.host + "/os:`id`"},
		{"pipe", tr.host + "/os:1|sh"},
		{"space", tr.host + "/os :1"},
		{"newline", tr.host + "/os:1\n"},
		{"option injection", "--insecure-policy"},
		{"untagged", tr.host + "/os"},
		{"empty", ""},
		{"short digest", tr.host + "/os@sha256:abc"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := r.Resolve(context.Background(), c.ref, nil)
			if !errors.Is(err, ErrInvalidReference) || !errors.Is(err, imageref.ErrInvalid) {
				t.Fatalf("Resolve(%q) = %v, want ErrInvalidReference wrapping imageref.ErrInvalid", c.ref, err)
			}
			if errors.Is(err, ErrUnreachable) || errors.Is(err, ErrNotFound) {
				t.Fatalf("invalid reference classified as a registry failure: %v", err)
			}
			if Reason(err) != "InvalidImageReference" {
				t.Fatalf("Reason = %q", Reason(err))
			}
		})
	}
	if n := tr.requests.Load(); n != 0 {
		t.Fatalf("invalid references caused %d registry requests, want 0", n)
	}
}

func TestResolveFailuresAreClassified(t *testing.T) {
	tr := newRegistry(t)
	tr.push(t, "fleet/os:1")

	closed := httptest.NewServer(http.NotFoundHandler())
	closedHost := strings.TrimPrefix(closed.URL, "http://")
	closed.Close()

	tlsSrv := httptest.NewUnstartedServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0)
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	tlsHost := strings.TrimPrefix(tlsSrv.URL, "https://")

	cases := []struct {
		name   string
		opts   Options
		ref    string
		kind   error
		reason string
	}{
		{"missing tag", Options{Insecure: []string{tr.host}}, tr.host + "/fleet/os:2", ErrNotFound, "ImageNotFound"},
		{"missing repository", Options{Insecure: []string{tr.host}}, tr.host + "/fleet/nothing:1", ErrNotFound, "ImageNotFound"},
		{"closed server", Options{Insecure: []string{closedHost}}, closedHost + "/fleet/os:1", ErrUnreachable, "RegistryUnreachable"},
		{"plain HTTP host not listed as insecure", Options{}, tr.host + "/fleet/os:1", ErrTLS, "RegistryTLSFailure"},
		{"plain HTTP host, other host listed", Options{Insecure: []string{"127.0.0.1:1"}}, tr.host + "/fleet/os:1", ErrTLS, "RegistryTLSFailure"},
		{"TLS with an unknown certificate authority", Options{}, tlsHost + "/fleet/os:1", ErrTLS, "RegistryTLSFailure"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.opts).Resolve(context.Background(), c.ref, nil)
			if !errors.Is(err, c.kind) {
				t.Fatalf("Resolve(%q) = %v, want %v", c.ref, err, c.kind)
			}
			if got := Reason(err); got != c.reason {
				t.Fatalf("Reason = %q, want %q (err %v)", got, c.reason, err)
			}
			var re *Error
			if !errors.As(err, &re) {
				t.Fatalf("error %T is not *Error", err)
			}
			reg := c.ref[:strings.IndexByte(c.ref, '/')]
			if re.Registry != reg || !strings.Contains(err.Error(), c.ref) || !strings.Contains(err.Error(), "registry "+reg) {
				t.Fatalf("message %q does not name the reference and the registry %s", err, reg)
			}
		})
	}
	t.Run("TLS failures are also unreachable", func(t *testing.T) {
		_, err := New(Options{}).Resolve(context.Background(), tr.host+"/fleet/os:1", nil)
		if !errors.Is(err, ErrUnreachable) || errors.Is(err, ErrNotFound) {
			t.Fatalf("got %v", err)
		}
	})
}

// staticKeychain hands out one username and password for every registry.
type staticKeychain struct{ user, pass string }

func (k staticKeychain) Resolve(authn.Resource) (authn.Authenticator, error) {
	return authn.FromConfig(authn.AuthConfig{Username: k.user, Password: k.pass}), nil
}

func TestResolveUnauthorizedAndKeychain(t *testing.T) {
	tr := newRegistry(t)
	want := tr.push(t, "private/os:1")
	tr.wrap = func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if u, p, ok := r.BasicAuth(); !ok || u != "fleet" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	}
	ref := tr.host + "/private/os:1"

	cases := []struct {
		name     string
		keychain authn.Keychain
		kind     error
	}{
		{"anonymous", nil, ErrUnauthorized},
		{"wrong password", staticKeychain{"fleet", "nope"}, ErrUnauthorized},
		{"right password", staticKeychain{"fleet", "s3cret"}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := tr.resolver(Options{Keychain: c.keychain}).Resolve(context.Background(), ref, nil)
			if c.kind == nil {
				if err != nil || got.Image.Digest != want.String() {
					t.Fatalf("Resolve = %v, %v; want %s", got, err, want)
				}
				return
			}
			if !errors.Is(err, c.kind) || Reason(err) != "RegistryUnauthorized" {
				t.Fatalf("Resolve = %v, want %v", err, c.kind)
			}
		})
	}
}

func TestResolveFallsBackToGetWhenHeadFails(t *testing.T) {
	tr := newRegistry(t)
	want := tr.push(t, "fleet/os:1")
	var gets atomic.Int64
	tr.wrap = func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if strings.Contains(r.URL.Path, "/manifests/") {
			if r.Method == http.MethodHead {
				w.WriteHeader(http.StatusMethodNotAllowed)
				return
			}
			gets.Add(1)
		}
		next.ServeHTTP(w, r)
	}
	got, err := tr.resolver(Options{}).Resolve(context.Background(), tr.host+"/fleet/os:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Image.Digest != want.String() {
		t.Fatalf("Resolve = %s, want %s", got.Image.Digest, want)
	}
	if gets.Load() == 0 {
		t.Fatal("no GET of the manifest after HEAD failed")
	}
}

func TestResolveServerErrorsAreUnreachable(t *testing.T) {
	tr := newRegistry(t)
	tr.push(t, "fleet/os:1")
	tr.wrap = func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if strings.Contains(r.URL.Path, "/manifests/") {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
	}
	_, err := tr.resolver(Options{}).Resolve(context.Background(), tr.host+"/fleet/os:1", nil)
	if !errors.Is(err, ErrUnreachable) || errors.Is(err, ErrTLS) {
		t.Fatalf("Resolve = %v, want ErrUnreachable (not TLS)", err)
	}
}

func TestResolveTimeoutAndCancellation(t *testing.T) {
	tr := newRegistry(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	tr.wrap = func(_ http.ResponseWriter, r *http.Request, _ http.Handler) {
		select { // a registry that never answers
		case <-r.Context().Done():
		case <-release:
		}
	}
	ref := tr.host + "/fleet/os:1"

	t.Run("timeout is unreachable", func(t *testing.T) {
		_, err := tr.resolver(Options{Timeout: 200 * time.Millisecond}).Resolve(context.Background(), ref, nil)
		if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "no answer within 200ms") {
			t.Fatalf("Resolve = %v, want ErrUnreachable naming the timeout", err)
		}
	})
	t.Run("caller cancellation is not a registry failure", func(t *testing.T) {
		tr.requests.Store(0)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			for tr.requests.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			cancel()
		}()
		_, err := tr.resolver(Options{Timeout: time.Minute}).Resolve(ctx, ref, nil)
		if !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnreachable) {
			t.Fatalf("Resolve = %v, want context.Canceled only", err)
		}
	})
}

func TestReason(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"not found", &Error{Kind: ErrNotFound}, "ImageNotFound"},
		{"wrapped unauthorized", errors.Join(errors.New("x"), &Error{Kind: ErrUnauthorized}), "RegistryUnauthorized"},
		{"TLS before unreachable", &Error{Kind: ErrTLS}, "RegistryTLSFailure"},
		{"unreachable", &Error{Kind: ErrUnreachable}, "RegistryUnreachable"},
		{"bad response", &Error{Kind: ErrBadResponse}, "RegistryBadResponse"},
		{"context", context.Canceled, "ResolveFailed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Reason(c.err); got != c.want {
				t.Fatalf("Reason = %q, want %q", got, c.want)
			}
		})
	}
}

func BenchmarkResolveTag(b *testing.B) {
	tr := newRegistry(b)
	tr.push(b, "fleet/os:1")
	r := tr.resolver(Options{})
	ctx := context.Background()
	ref := tr.host + "/fleet/os:1"
	tr.requests.Store(0)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Resolve(ctx, ref, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(tr.requests.Load())/float64(b.N), "requests/op")
}

func BenchmarkResolveDigest(b *testing.B) {
	tr := newRegistry(b)
	d := tr.push(b, "fleet/os:1")
	r := tr.resolver(Options{})
	ctx := context.Background()
	ref := tr.host + "/fleet/os:1@" + d.String()
	if _, err := r.Resolve(ctx, ref, nil); err != nil {
		b.Fatal(err)
	}
	tr.requests.Store(0)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Resolve(ctx, ref, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(tr.requests.Load())/float64(b.N), "requests/op")
}
