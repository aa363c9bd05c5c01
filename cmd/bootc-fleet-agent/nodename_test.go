package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/bootc-fleet/bootc-fleet/internal/agent/kubeconfig"
)

// The kubelet's kubeconfig names the node; without --node-name the agent
// takes that name, and a --node-name that differs stops it at startup with
// both names in the error.
func TestNodeNameAtStartup(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "system:node:worker-7"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kc := kubeconfig.Choice{Path: "/etc/kubernetes/kubelet.conf", Config: &rest.Config{Host: "https://127.0.0.1:1",
		TLSClientConfig: rest.TLSClientConfig{CertData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if n, err := nodeName(context.Background(), "", kc, log); err != nil || n != "worker-7" {
		t.Fatalf("no --node-name: %q, %v; want worker-7", n, err)
	}
	_, err = nodeName(context.Background(), "worker-8", kc, log)
	if err == nil || !strings.Contains(err.Error(), `"worker-8"`) || !strings.Contains(err.Error(), "system:node:worker-7") || !strings.Contains(err.Error(), kc.Path) {
		t.Fatalf("mismatch: %v; want an error naming both and the kubeconfig", err)
	}
}
