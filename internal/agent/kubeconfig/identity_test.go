package kubeconfig

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

func clientCert(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// The kubelet's client certificate names the node: CN system:node:<name>.
func TestCertificateUser(t *testing.T) {
	pemBytes := clientCert(t, "system:node:worker-7")
	if u, err := CertificateUser(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: pemBytes}}); err != nil || u != "system:node:worker-7" {
		t.Fatalf("from data: %q, %v", u, err)
	}
	path := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
	if err := os.WriteFile(path, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	if u, err := CertificateUser(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CertFile: path}}); err != nil || u != "system:node:worker-7" {
		t.Fatalf("from file: %q, %v", u, err)
	}
	if u, err := CertificateUser(&rest.Config{BearerToken: "t"}); err != nil || u != "" {
		t.Fatalf("no certificate: %q, %v", u, err)
	}
	if _, err := CertificateUser(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: []byte("junk")}}); err == nil {
		t.Fatal("junk accepted as a certificate")
	}
}

func TestNodeNameComesFromTheCredential(t *testing.T) {
	for _, c := range []struct {
		name, given, user string
		want, errPart     string
	}{
		{"not given: the credential's node", "", "system:node:worker-7", "worker-7", ""},
		{"given and equal", "worker-7", "system:node:worker-7", "worker-7", ""},
		{"given and different: refused, naming both", "worker-8", "system:node:worker-7", "", `--node-name "worker-8" does not match the identity of the credential (system:node:worker-7`},
		{"given, credential not a node's (e.g. a test's admin)", "worker-8", "kubernetes-admin", "worker-8", ""},
		{"not given, credential not a node's", "", "kubernetes-admin", "", `"kubernetes-admin"`},
		{"not given, identity unknown", "", "", "", "pass --node-name"},
		{"an empty node name is none", "", "system:node:", "", "pass --node-name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := NodeName(c.given, c.user, "/etc/kubernetes/kubelet.conf")
			if c.errPart != "" {
				if err == nil || !strings.Contains(err.Error(), c.errPart) {
					t.Fatalf("NodeName = %q, %v; want an error containing %q", got, err, c.errPart)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("NodeName = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}
