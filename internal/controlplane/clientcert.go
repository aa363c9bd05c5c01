package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"reflect"
	"time"
	"unsafe"
)

// SignClientCert issues a client certificate for user (CN) and groups (O),
// valid until notAfter, signed by the CA the API server trusts for client
// certificates (the one envtest's AddUser signs with, for a week). It
// returns the certificate and its PKCS#8 private key, PEM encoded; a test
// controls the lifetime, e.g. to rotate a certificate under a running agent.
//
// controller-runtime v0.25.2 keeps that CA in an unexported field
// (controlplane.CertAuthn.ca, a *certs.TinyCA), so it is read by
// reflection; a changed layout is an error here, not a panic.
func (e *Env) SignClientCert(user string, groups []string, notAfter time.Time) (certPEM, keyPEM []byte, err error) {
	authn := reflect.ValueOf(e.env.ControlPlane.GetAPIServer().SecureServing.Authn)
	if authn.Kind() != reflect.Pointer || authn.IsNil() || authn.Elem().Kind() != reflect.Struct {
		return nil, nil, fmt.Errorf("envtest authenticator is %s, not controller-runtime's CertAuthn", authn.Type())
	}
	ca := authn.Elem().FieldByName("ca")
	if !ca.IsValid() || ca.Kind() != reflect.Pointer || ca.IsNil() {
		return nil, nil, fmt.Errorf("%s has no CA field (controller-runtime changed)", authn.Type())
	}
	ca = reflect.NewAt(ca.Type(), unsafe.Pointer(ca.UnsafeAddr())).Elem() // readable although unexported
	pair := ca.Elem().FieldByName("CA")
	if !pair.IsValid() {
		return nil, nil, fmt.Errorf("%s has no CA pair (controller-runtime changed)", ca.Type())
	}
	caCert, ok1 := pair.FieldByName("Cert").Interface().(*x509.Certificate)
	caKey, ok2 := pair.FieldByName("Key").Interface().(crypto.Signer)
	if !ok1 || !ok2 || caCert == nil || caKey == nil {
		return nil, nil, fmt.Errorf("envtest client CA not found in %s", ca.Type())
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: user, Organization: groups},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, caCert, key.Public(), caKey)
	if err != nil {
		return nil, nil, err
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), nil
}
