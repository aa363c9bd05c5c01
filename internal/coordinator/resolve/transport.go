package resolve

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
)

// maxCAFile bounds a CA bundle file.
const maxCAFile = 4 << 20

// TransportWithCAFile returns an HTTP transport that trusts the system's CAs
// and the PEM certificates in path (a registry's private CA). The file must
// hold at least one certificate and nothing that is not one.
func TransportWithCAFile(path string) (*http.Transport, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("registry CA file: %w", err)
	}
	if st.Size() > maxCAFile {
		return nil, fmt.Errorf("registry CA file %s: %d bytes, at most %d", path, st.Size(), maxCAFile)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("registry CA file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	certs, err := parsePEMCertificates(b)
	if err != nil {
		return nil, fmt.Errorf("registry CA file %s: %w", path, err)
	}
	for _, c := range certs {
		pool.AddCert(c)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return tr, nil
}

// parsePEMCertificates parses every PEM block of b as a certificate; any
// other block type, trailing garbage, or no certificate at all is an error,
// so a wrong file (a key, a DER file) is named at start, not at the first
// failing TLS handshake.
func parsePEMCertificates(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %d is a %q, want CERTIFICATE", len(out)+1, blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(bytes.TrimSpace(b)) != 0 {
		return nil, fmt.Errorf("not PEM after certificate %d", len(out))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no PEM certificate in it")
	}
	return out, nil
}
