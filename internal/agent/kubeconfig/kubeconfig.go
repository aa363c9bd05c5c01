// Package kubeconfig finds the kubeconfig bootc-fleet-agent talks to the API
// server with: the one it is given, or else the kubelet's own, so a node needs
// no credential of its own (docs/agent.md, "Kubeconfig").
package kubeconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Candidate is a place where a Kubernetes distribution keeps the kubelet's
// kubeconfig.
type Candidate struct {
	Path         string
	Distribution string
}

// Kubelet are the kubelet kubeconfigs the agent tries, in this order, when it
// is given none.
var Kubelet = []Candidate{
	{"/etc/kubernetes/kubelet.conf", "kubeadm"},
	// OpenShift also has /etc/kubernetes/kubelet.conf, but there it is the
	// KubeletConfiguration, not a kubeconfig: Find skips it.
	{"/var/lib/kubelet/kubeconfig", "EKS, OpenShift"},
	{"/var/lib/rancher/k3s/agent/kubelet.kubeconfig", "k3s"},
	{"/var/lib/rancher/rke2/agent/kubelet.kubeconfig", "RKE2"},
}

// Choice is the kubeconfig Find picked.
type Choice struct {
	Path string
	// Source says where Path came from: the explicit source given to Find
	// (e.g. "--kubeconfig"), or "kubelet (<distribution>)".
	Source string
	// Skipped are candidates tried before Path: each path with why it was
	// not used ("does not exist", or why it is not a usable kubeconfig).
	Skipped []string
	// Config is the client configuration loaded from Path.
	Config *rest.Config
}

// Loader reads the kubeconfig at path into a client configuration. A missing
// file must give an error that matches fs.ErrNotExist.
type Loader func(path string) (*rest.Config, error)

// Find returns the kubeconfig to use. An explicit path (from source, e.g.
// "--kubeconfig") must exist and load. Without one, it is the first
// candidate that exists and loads as a kubeconfig; when there is none, the
// error names every path tried and why each was not used.
func Find(explicit, source string, candidates []Candidate, load Loader) (Choice, error) {
	if explicit != "" {
		cfg, err := load(explicit)
		if errors.Is(err, fs.ErrNotExist) {
			return Choice{}, fmt.Errorf("%s %s does not exist", source, explicit)
		}
		if err != nil {
			return Choice{}, fmt.Errorf("%s %s: %w", source, explicit, err)
		}
		return Choice{Path: explicit, Source: source, Config: cfg}, nil
	}
	var skipped []string
	for _, c := range candidates {
		cfg, err := load(c.Path)
		switch {
		case err == nil:
			return Choice{Path: c.Path, Source: "kubelet (" + c.Distribution + ")", Skipped: skipped, Config: cfg}, nil
		case errors.Is(err, fs.ErrNotExist):
			skipped = append(skipped, fmt.Sprintf("%s (%s): does not exist", c.Path, c.Distribution))
		default:
			skipped = append(skipped, fmt.Sprintf("%s (%s): not a usable kubeconfig: %v", c.Path, c.Distribution, err))
		}
	}
	return Choice{}, fmt.Errorf("no kubelet kubeconfig found; tried %s; set %s (or BOOTC_FLEET_KUBECONFIG) to a kubeconfig for this node's identity (user system:node:<name>, group system:nodes)",
		strings.Join(skipped, "; "), source)
}

// Load reads a kubeconfig file the way clientcmd does for --kubeconfig
// (relative file references resolved against the file's directory), without
// clientcmd's fallback to an in-cluster configuration. File references stay
// file references: client-certificate/client-key files are not read into the
// configuration, so client-go reloads them when they change (see Describe),
// and an exec credential plugin stays an exec plugin.
func Load(path string) (*rest.Config, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	raw, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil, err
	}
	if err := clientcmd.ResolveLocalPaths(raw); err != nil {
		return nil, err
	}
	return clientcmd.NewNonInteractiveClientConfig(*raw, raw.CurrentContext, &clientcmd.ConfigOverrides{}, nil).ClientConfig()
}

// Describe says how cfg authenticates, for the log, and whether a renewed
// credential reaches the agent without a restart.
func Describe(cfg *rest.Config) (auth string, reloads bool) {
	switch {
	case cfg.ExecProvider != nil:
		return "exec credential plugin " + cfg.ExecProvider.Command, true
	case len(cfg.CertData) > 0 || len(cfg.KeyData) > 0:
		return "client certificate embedded in the kubeconfig (read once)", false
	case cfg.CertFile != "" && cfg.KeyFile != "":
		return "client certificate " + cfg.CertFile + ", key " + cfg.KeyFile + " (reloaded when they change)", true
	case cfg.BearerTokenFile != "":
		return "token file " + cfg.BearerTokenFile + " (re-read every minute)", true
	case cfg.BearerToken != "":
		return "token embedded in the kubeconfig", false
	case cfg.AuthProvider != nil:
		return "auth provider " + cfg.AuthProvider.Name, true
	default:
		return "no client credential", false
	}
}
