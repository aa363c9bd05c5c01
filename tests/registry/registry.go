// Package registry runs a private OCI registry for tests: go-containerregistry's
// registry over TLS, with a certificate from a CA made for the test, behind
// HTTP basic authentication that answers as real registries do (401 with a
// Basic challenge, an OCI error body).
package registry

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
)

// Private is a running private registry.
type Private struct {
	// Host is host:port, as written in image references.
	Host string
	// User and Password are the only credentials it accepts.
	User, Password string
	// CAPEM is the PEM of the CA that signed the server's certificate.
	CAPEM []byte

	srv  *httptest.Server
	pool *x509.CertPool
}

// NewPrivate starts a private registry on loopback; it stops with the test.
func NewPrivate(t testing.TB) *Private {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "bootc-fleet test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	p := &Private{
		User:     "fleet",
		Password: "pw-" + rand.Text(),
		CAPEM:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pool:     x509.NewCertPool(),
	}
	p.pool.AddCert(ca)
	p.srv = httptest.NewUnstartedServer(p.basicAuth(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))))
	// Clients that do not trust the CA are expected; keep their failed
	// handshakes out of the test log.
	p.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	p.srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}}}
	p.srv.StartTLS()
	t.Cleanup(p.srv.Close)
	p.Host = strings.TrimPrefix(p.srv.URL, "https://")
	return p
}

// basicAuth answers every request without the right credentials as a
// registry does: 401, a Basic challenge, and an OCI distribution error body.
func (p *Private) basicAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, pw, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(p.User)) != 1 || subtle.ConstantTimeCompare([]byte(pw), []byte(p.Password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="bootc-fleet test registry"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":null}]}`))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// CertPool trusts the registry's CA only.
func (p *Private) CertPool() *x509.CertPool { return p.pool }

// Transport is an HTTP transport that trusts the registry's CA.
func (p *Private) Transport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: p.pool}
	return tr
}

// DockerConfig is a docker config.json / containers auth.json document
// giving user:password for the registry.
func (p *Private) DockerConfig(user, password string) []byte {
	b, err := json.Marshal(map[string]any{"auths": map[string]any{
		p.Host: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))},
	}})
	if err != nil {
		panic(err)
	}
	return b
}

// WriteCA writes the CA's PEM to dir/name and returns the path.
func (p *Private) WriteCA(t testing.TB, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, p.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Options are go-containerregistry options that reach the registry as its
// user, for pushes and reads by the test itself.
func (p *Private) Options() []remote.Option {
	return []remote.Option{
		remote.WithAuth(&authn.Basic{Username: p.User, Password: p.Password}),
		remote.WithTransport(p.Transport()),
	}
}

// Push writes a random image to host/repo:tag and returns it pinned.
func (p *Private) Push(t testing.TB, repoTag string) (imageref.Pinned, v1.Image) {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref := p.Host + "/" + repoTag
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img, p.Options()...); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	pin, err := imageref.PinnedFromDigest(ref, d.String())
	if err != nil {
		t.Fatal(err)
	}
	return pin, img
}

func (p *Private) String() string { return fmt.Sprintf("private registry %s", p.Host) }
