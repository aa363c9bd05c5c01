package kubeconfig

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// nodeUserPrefix starts the user name of a node's credential (the Node
// authorizer and NodeRestriction key on it).
const nodeUserPrefix = "system:node:"

// CertificateUser returns the user name the kubeconfig's client certificate
// carries (its subject's common name, as the API server's x509 authenticator
// reads it), "" when the config has no client certificate.
func CertificateUser(cfg *rest.Config) (string, error) {
	data := cfg.TLSClientConfig.CertData
	if len(data) == 0 && cfg.TLSClientConfig.CertFile != "" {
		var err error
		if data, err = os.ReadFile(cfg.TLSClientConfig.CertFile); err != nil {
			return "", fmt.Errorf("reading the client certificate: %w", err)
		}
	}
	if len(data) == 0 {
		return "", nil
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return "", errors.New("the client certificate is not a PEM CERTIFICATE")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("parsing the client certificate: %w", err)
	}
	return cert.Subject.CommonName, nil
}

// ServerUser asks the API server who the kubeconfig's credential is (a
// SelfSubjectReview, which every authenticated user may create).
func ServerUser(ctx context.Context, cfg *rest.Config) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("asking the API server who this credential is: %w", err)
	}
	return r.Status.UserInfo.Username, nil
}

// NodeName decides this node's name from --node-name (given, "" if not)
// and the user name of the credential (user, "" if unknown). Taken from the
// credential when not given; a given name must match a node credential's,
// because the API server lets system:node:<name> touch only <name>'s
// objects, and an agent working under another name would be refused on
// every write, or act for another node.
func NodeName(given, user, userFrom string) (string, error) {
	node, isNode := strings.CutPrefix(user, nodeUserPrefix)
	isNode = isNode && node != ""
	switch {
	case given != "" && isNode && given != node:
		return "", fmt.Errorf("--node-name %q does not match the identity of the credential (%s, from %s): the API server lets it act only for node %q; remove --node-name or use that node's credential", given, user, userFrom, node)
	case given != "":
		return given, nil
	case isNode:
		return node, nil
	case user == "":
		return "", fmt.Errorf("cannot tell this node's name: the credential (from %s) names no user the agent could read; pass --node-name", userFrom)
	default:
		return "", fmt.Errorf("the credential's identity %q (from %s) is not a node's (%s<name>); pass --node-name", user, userFrom, nodeUserPrefix)
	}
}
