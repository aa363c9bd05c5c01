// Package testregistry runs a real OCI registry (go-containerregistry's
// pkg/registry) behind TLS with a certificate from a CA made for the test,
// and HTTP basic authentication answering as registries do (401 with
// WWW-Authenticate: Basic and the distribution errcode body, 403 DENIED for
// a user without pull access). It pushes random images, indexes and real
// sigstore attachments (cosign's layout: the simple-signing payload at tag
// sha256-<hex>.sig, its ECDSA signature in the layer annotation), and writes
// the host files bootc reads (auth.json, certs.d, policy.json,
// registries.d) under a root directory.
package testregistry

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Admin may push and pull.
const (
	AdminUser = "admin"
	AdminPass = "admin-secret"
)

// Registry is a running TLS registry with basic authentication.
type Registry struct {
	// Host is host:port as references name it (127.0.0.1:<port>).
	Host string
	// CAPEM is the test CA's certificate, PEM.
	CAPEM []byte

	srv *httptest.Server
	tr  http.RoundTripper

	mu       sync.Mutex
	users    map[string]string
	noPull   map[string]bool
	requests int
	// stall: by user, how many more manifest GETs by digest stall
	// (StallManifests); stalled counts those that did; stop ends every
	// stall when the registry stops.
	stall   map[string]int
	stalled int
	stop    chan struct{}
}

// Start runs a registry for the test; it stops at cleanup.
func Start(tb testing.TB) *Registry {
	tb.Helper()
	caCert, caKey := newCA(tb)
	r := &Registry{users: map[string]string{AdminUser: AdminPass}, noPull: map[string]bool{}, stall: map[string]int{}, stop: make(chan struct{})}
	r.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caCert.Raw})
	inner := registry.New(registry.Logger(log.New(discard{}, "", 0)))
	r.srv = httptest.NewUnstartedServer(r.auth(inner))
	r.srv.Config.ErrorLog = log.New(discard{}, "", 0) // refused handshakes are test cases
	r.srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert(tb, caCert, caKey)}, MinVersion: tls.VersionTLS12}
	r.srv.StartTLS()
	tb.Cleanup(r.srv.Close)
	tb.Cleanup(func() { close(r.stop) }) // runs first: stalled handlers return
	r.Host = strings.TrimPrefix(r.srv.URL, "https://")
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	r.tr = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return r
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// AddUser lets user pull with pass; pull false makes the registry answer
// 403 DENIED to that user's pulls (valid credentials, no access).
func (r *Registry) AddUser(user, pass string, pull bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.users[user] = pass
	r.noPull[user] = !pull
}

// Requests counts the requests the registry answered.
func (r *Registry) Requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

// auth answers like docker/distribution's htpasswd access controller
// (registry/auth/htpasswd: 401 with a Basic challenge and the UNAUTHORIZED
// errcode body) and its authorization errors (403 DENIED).
func (r *Registry) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.requests++
		user, pass, ok := req.BasicAuth()
		good := ok && r.users[user] == pass && pass != ""
		denied := good && r.noPull[user]
		stall := good && !denied && req.Method == http.MethodGet && manifestByDigest(req.URL.Path) && r.stall[user] > 0
		if stall {
			r.stall[user]--
			r.stalled++
		}
		r.mu.Unlock()
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		switch {
		case !good:
			w.Header().Set("WWW-Authenticate", `Basic realm="bootc-fleet test registry"`)
			writeErr(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
		case denied && req.URL.Path != "/v2/":
			writeErr(w, http.StatusForbidden, "DENIED", "requested access to the resource is denied")
		case stall:
			r.serveStalled(w, req, next)
		default:
			next.ServeHTTP(w, req)
		}
	})
}

// StallManifests makes the next n GETs of a manifest by digest by user stall
// as a registry (or a proxy in front of it) does when a transfer hangs: the
// answer starts, 200 with its headers and Content-Length and the first half
// of the body, and then nothing more comes, the connection held open until
// the client gives up or the registry stops. containers/image bounds the
// wait for the headers (ResponseHeaderTimeout) but not for the body, so a
// pull hangs there on a real host until something cancels it.
func (r *Registry) StallManifests(user string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stall[user] = n
}

// Stalled counts the requests StallManifests stalled so far.
func (r *Registry) Stalled() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stalled
}

func (r *Registry) serveStalled(w http.ResponseWriter, req *http.Request, next http.Handler) {
	rec := httptest.NewRecorder()
	next.ServeHTTP(rec, req)
	body := rec.Body.Bytes()
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(rec.Code)
	_, _ = w.Write(body[:len(body)/2])
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	select {
	case <-req.Context().Done(): // the client went away
	case <-r.stop:
	}
}

// manifestByDigest: path is /v2/<name>/manifests/sha256:<hex>.
func manifestByDigest(path string) bool {
	i := strings.LastIndex(path, "/manifests/")
	return strings.HasPrefix(path, "/v2/") && i > 0 && strings.HasPrefix(path[i+len("/manifests/"):], "sha256:")
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"errors":[{"code":%q,"message":%q,"detail":null}]}`+"\n", code, msg)
}

func (r *Registry) opts() []remote.Option {
	return []remote.Option{remote.WithTransport(r.tr), remote.WithAuth(&authn.Basic{Username: AdminUser, Password: AdminPass})}
}

// Repo is host/repo.
func (r *Registry) Repo(repo string) string { return r.Host + "/" + repo }

// PushRandom pushes a random image to repo and returns repo@digest.
func (r *Registry) PushRandom(tb testing.TB, repo string) string {
	tb.Helper()
	img, err := random.Image(512, 1)
	if err != nil {
		tb.Fatal(err)
	}
	return r.push(tb, repo, img)
}

func (r *Registry) push(tb testing.TB, repo string, img v1.Image) string {
	tb.Helper()
	d, err := img.Digest()
	if err != nil {
		tb.Fatal(err)
	}
	ref, err := name.NewDigest(r.Repo(repo) + "@" + d.String())
	if err != nil {
		tb.Fatal(err)
	}
	if err := remote.Write(ref, img, r.opts()...); err != nil {
		tb.Fatalf("pushing %s: %v", ref, err)
	}
	return ref.String()
}

// PushTagged pushes a random image to repo:tag and returns repo@digest.
func (r *Registry) PushTagged(tb testing.TB, repo, tag string) string {
	tb.Helper()
	img, err := random.Image(512, 1)
	if err != nil {
		tb.Fatal(err)
	}
	t, err := name.NewTag(r.Repo(repo) + ":" + tag)
	if err != nil {
		tb.Fatal(err)
	}
	if err := remote.Write(t, img, r.opts()...); err != nil {
		tb.Fatalf("pushing %s: %v", t, err)
	}
	d, err := img.Digest()
	if err != nil {
		tb.Fatal(err)
	}
	return r.Repo(repo) + "@" + d.String()
}

// DockerConfig is a docker config.json / containers-auth.json(5) document
// giving user:pass for r's host.
func (r *Registry) DockerConfig(user, pass string) []byte {
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	data, err := json.Marshal(map[string]any{"auths": map[string]any{r.Host: map[string]string{"auth": auth}}})
	if err != nil {
		panic(err)
	}
	return data
}

// PushIndex pushes an OCI index of random images, one for this host's
// platform (linux/GOARCH) and one for another architecture, and returns
// the index reference and this platform's image reference.
func (r *Registry) PushIndex(tb testing.TB, repo string) (index, platform string) {
	tb.Helper()
	other := "s390x"
	if runtime.GOARCH == other {
		other = "ppc64le"
	}
	var idx v1.ImageIndex = empty.Index
	idx = mutate.IndexMediaType(idx, types.OCIImageIndex)
	for _, arch := range []string{other, runtime.GOARCH} {
		img, err := random.Image(256, 1)
		if err != nil {
			tb.Fatal(err)
		}
		p := r.push(tb, repo, img)
		if arch == runtime.GOARCH {
			platform = p
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	d, err := idx.Digest()
	if err != nil {
		tb.Fatal(err)
	}
	ref, err := name.NewDigest(r.Repo(repo) + "@" + d.String())
	if err != nil {
		tb.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx, r.opts()...); err != nil {
		tb.Fatalf("pushing index %s: %v", ref, err)
	}
	return ref.String(), platform
}

// Key is an ECDSA P-256 signing key, like `cosign generate-key-pair` makes.
type Key struct{ priv *ecdsa.PrivateKey }

// NewKey generates a key.
func NewKey(tb testing.TB) *Key {
	tb.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return &Key{priv: k}
}

// PublicPEM is the public key as cosign.pub holds it.
func (k *Key) PublicPEM(tb testing.TB) []byte {
	der, err := x509.MarshalPKIXPublicKey(&k.priv.PublicKey)
	if err != nil {
		tb.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// Sign pushes a sigstore signature of ref (repo@sha256:...) made with k,
// as `cosign sign --key` does: the simple-signing payload naming the
// manifest digest and identity (the repository), signed with ECDSA over
// its SHA-256, in an OCI manifest at tag sha256-<hex>.sig. identity ""
// means ref's repository.
func (r *Registry) Sign(tb testing.TB, ref, identity string, k *Key) {
	tb.Helper()
	repo, digest, ok := strings.Cut(ref, "@")
	if !ok {
		tb.Fatalf("Sign: %q has no digest", ref)
	}
	if identity == "" {
		identity = repo
	}
	payload, err := json.Marshal(map[string]any{
		"critical": map[string]any{
			"identity": map[string]string{"docker-reference": identity},
			"image":    map[string]string{"docker-manifest-digest": digest},
			"type":     "cosign container image signature",
		},
		"optional": nil,
	})
	if err != nil {
		tb.Fatal(err)
	}
	h := sha256.Sum256(payload)
	sig, err := ecdsa.SignASN1(rand.Reader, k.priv, h[:])
	if err != nil {
		tb.Fatal(err)
	}
	layer := static.NewLayer(payload, "application/vnd.dev.cosign.simplesigning.v1+json")
	img, err := mutate.Append(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON),
		mutate.Addendum{Layer: layer, Annotations: map[string]string{"dev.cosignproject.cosign/signature": base64.StdEncoding.EncodeToString(sig)}})
	if err != nil {
		tb.Fatal(err)
	}
	tag, err := name.NewTag(repo + ":" + strings.Replace(digest, ":", "-", 1) + ".sig")
	if err != nil {
		tb.Fatal(err)
	}
	if err := remote.Write(tag, img, r.opts()...); err != nil {
		tb.Fatalf("pushing signature %s: %v", tag, err)
	}
}

// Host files. Each writes under root, creating directories.

// WriteAuth writes a containers-auth.json(5) at root/rel (e.g.
// "etc/ostree/auth.json") with user:pass for r's host.
func (r *Registry) WriteAuth(tb testing.TB, root, rel, user, pass string) {
	tb.Helper()
	WriteFile(tb, root, rel, r.DockerConfig(user, pass))
}

// WriteCA puts the test CA in root/etc/containers/certs.d/<host>/ca.crt.
func (r *Registry) WriteCA(tb testing.TB, root string) {
	tb.Helper()
	WriteFile(tb, root, filepath.Join("etc/containers/certs.d", r.Host, "ca.crt"), r.CAPEM)
}

// WriteSigstorePolicy writes a policy.json that rejects by default and
// requires k's sigstore signatures for r's host, the public key at
// /etc/pki/containers/<r host>.pub, and registries.d turning on sigstore
// attachments for the host.
func (r *Registry) WriteSigstorePolicy(tb testing.TB, root string, k *Key) {
	tb.Helper()
	keyPath := "/etc/pki/containers/fleet.pub"
	WriteFile(tb, root, keyPath, k.PublicPEM(tb))
	WritePolicy(tb, root, fmt.Sprintf(`{
  "default": [{"type": "reject"}],
  "transports": {
    "docker": {
      %q: [{"type": "sigstoreSigned", "keyPath": %q, "signedIdentity": {"type": "matchRepository"}}]
    }
  }
}`, r.Host, keyPath))
	WriteFile(tb, root, "etc/containers/registries.d/fleet.yaml", []byte(fmt.Sprintf("docker:\n  %s:\n    use-sigstore-attachments: true\n", r.Host)))
}

// WritePolicy writes root/etc/containers/policy.json.
func WritePolicy(tb testing.TB, root, policy string) {
	tb.Helper()
	WriteFile(tb, root, "etc/containers/policy.json", []byte(policy))
}

// InsecurePolicy is the policy most images ship: accept anything.
const InsecurePolicy = `{"default": [{"type": "insecureAcceptAnything"}]}`

// WriteFile writes data at root/rel.
func WriteFile(tb testing.TB, root, rel string, data []byte) {
	tb.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		tb.Fatal(err)
	}
}

func newCA(tb testing.TB) (*x509.Certificate, *ecdsa.PrivateKey) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "bootc-fleet test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return c, key
}

func serverCert(tb testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey) tls.Certificate {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
