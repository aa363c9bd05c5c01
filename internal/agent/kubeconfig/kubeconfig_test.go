package kubeconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// fakeFS is a loader over a map: a missing path does not exist, a path
// mapped to "" exists but is not a kubeconfig.
func fakeFS(files map[string]string, loaded *[]string) Loader {
	return func(p string) (*rest.Config, error) {
		*loaded = append(*loaded, p)
		host, ok := files[p]
		if !ok {
			return nil, &fs.PathError{Op: "stat", Path: p, Err: fs.ErrNotExist}
		}
		if host == "" {
			return nil, errors.New(`no kind "KubeletConfiguration" is registered`)
		}
		return &rest.Config{Host: host}, nil
	}
}

func TestFind(t *testing.T) {
	var all []string
	for _, c := range Kubelet {
		all = append(all, c.Path)
	}
	tests := []struct {
		name     string
		explicit string
		files    map[string]string
		wantPath string
		wantSrc  string
		wantHost string
		// the error must contain every one of these
		wantErr []string
		// paths loaded, in order
		wantLoaded []string
		wantSkip   int
	}{
		{name: "kubeadm", files: map[string]string{"/etc/kubernetes/kubelet.conf": "kubeadm", "/var/lib/kubelet/kubeconfig": "other"},
			wantPath: "/etc/kubernetes/kubelet.conf", wantSrc: "kubelet (kubeadm)", wantHost: "kubeadm", wantLoaded: all[:1]},
		{name: "EKS", files: map[string]string{"/var/lib/kubelet/kubeconfig": "eks", "/var/lib/rancher/k3s/agent/kubelet.kubeconfig": "k3s"},
			wantPath: "/var/lib/kubelet/kubeconfig", wantSrc: "kubelet (EKS, OpenShift)", wantHost: "eks", wantLoaded: all[:2], wantSkip: 1},
		{name: "OpenShift: kubelet.conf is a KubeletConfiguration", files: map[string]string{"/etc/kubernetes/kubelet.conf": "", "/var/lib/kubelet/kubeconfig": "ocp"},
			wantPath: "/var/lib/kubelet/kubeconfig", wantSrc: "kubelet (EKS, OpenShift)", wantHost: "ocp", wantLoaded: all[:2], wantSkip: 1},
		{name: "k3s", files: map[string]string{"/var/lib/rancher/k3s/agent/kubelet.kubeconfig": "k3s", "/var/lib/rancher/rke2/agent/kubelet.kubeconfig": "rke2"},
			wantPath: "/var/lib/rancher/k3s/agent/kubelet.kubeconfig", wantSrc: "kubelet (k3s)", wantHost: "k3s", wantLoaded: all[:3], wantSkip: 2},
		{name: "RKE2", files: map[string]string{"/var/lib/rancher/rke2/agent/kubelet.kubeconfig": "rke2"},
			wantPath: "/var/lib/rancher/rke2/agent/kubelet.kubeconfig", wantSrc: "kubelet (RKE2)", wantHost: "rke2", wantLoaded: all, wantSkip: 3},
		{name: "none: the error names every path and the flag", files: nil,
			wantErr:    append([]string{"no kubelet kubeconfig found", "set --kubeconfig (or BOOTC_FLEET_KUBECONFIG)", "does not exist"}, all...),
			wantLoaded: all},
		{name: "none usable: the error says why", files: map[string]string{"/etc/kubernetes/kubelet.conf": ""},
			wantErr:    append([]string{"/etc/kubernetes/kubelet.conf (kubeadm): not a usable kubeconfig: no kind", "/var/lib/kubelet/kubeconfig (EKS, OpenShift): does not exist"}, all...),
			wantLoaded: all},
		{name: "explicit wins over the kubelet's", explicit: "/etc/bootc-fleet/kubeconfig",
			files:    map[string]string{"/etc/bootc-fleet/kubeconfig": "mine", "/etc/kubernetes/kubelet.conf": "kubeadm"},
			wantPath: "/etc/bootc-fleet/kubeconfig", wantSrc: "--kubeconfig", wantHost: "mine", wantLoaded: []string{"/etc/bootc-fleet/kubeconfig"}},
		{name: "explicit missing: no fallback", explicit: "/etc/bootc-fleet/kubeconfig",
			files:      map[string]string{"/etc/kubernetes/kubelet.conf": "kubeadm"},
			wantErr:    []string{"--kubeconfig /etc/bootc-fleet/kubeconfig does not exist"},
			wantLoaded: []string{"/etc/bootc-fleet/kubeconfig"}},
		{name: "explicit unusable", explicit: "/etc/kubernetes/kubelet.conf",
			files:      map[string]string{"/etc/kubernetes/kubelet.conf": ""},
			wantErr:    []string{"--kubeconfig /etc/kubernetes/kubelet.conf: no kind"},
			wantLoaded: []string{"/etc/kubernetes/kubelet.conf"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var loaded []string
			c, err := Find(tc.explicit, "--kubeconfig", Kubelet, fakeFS(tc.files, &loaded))
			if fmt.Sprint(loaded) != fmt.Sprint(tc.wantLoaded) {
				t.Errorf("loaded %q, want %q", loaded, tc.wantLoaded)
			}
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("no error; chose %+v", c)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Path != tc.wantPath || c.Source != tc.wantSrc || c.Config == nil || c.Config.Host != tc.wantHost || len(c.Skipped) != tc.wantSkip {
				t.Fatalf("chose %+v (host %v), want %s from %s, host %s, %d skipped", c, c.Config, tc.wantPath, tc.wantSrc, tc.wantHost, tc.wantSkip)
			}
		})
	}
}

const kubeconfigFmt = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: %s
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
users:
- name: u
  user:
%s
`

func write(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	// The kubelet's shape: one PEM file holding certificate and key, and
	// paths relative to the kubeconfig's directory.
	// clientcmd checks that referenced files are readable (their content
	// is not parsed here).
	write(t, dir, "pki/ca.crt", "ca")
	write(t, dir, "pki/kubelet-client-current.pem", "cert and key")
	kubelet := write(t, dir, "kubelet.conf", fmt.Sprintf(kubeconfigFmt, "pki/ca.crt",
		"    client-certificate: pki/kubelet-client-current.pem\n    client-key: pki/kubelet-client-current.pem"))
	cfg, err := Load(kubelet)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "pki", "kubelet-client-current.pem")
	if cfg.Host != "https://127.0.0.1:6443" || cfg.CertFile != want || cfg.KeyFile != want || cfg.CAFile != filepath.Join(dir, "pki", "ca.crt") {
		t.Fatalf("host %q cert %q key %q ca %q; want the files resolved against %s", cfg.Host, cfg.CertFile, cfg.KeyFile, cfg.CAFile, dir)
	}
	// Files stay files (client-go reloads them only then); nothing was read.
	if len(cfg.CertData) != 0 || len(cfg.KeyData) != 0 {
		t.Fatalf("certificate data copied into the config: %d/%d bytes", len(cfg.CertData), len(cfg.KeyData))
	}
	if auth, reloads := Describe(cfg); !reloads || !strings.Contains(auth, want) {
		t.Fatalf("Describe = %q, %v", auth, reloads)
	}

	exec := write(t, dir, "eks", fmt.Sprintf(kubeconfigFmt, "pki/ca.crt", `    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: aws
      args: [eks, get-token, --cluster-name, c]
      interactiveMode: Never`))
	cfg, err = Load(exec)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ExecProvider == nil || cfg.ExecProvider.Command != "aws" || len(cfg.CertData) != 0 || cfg.CertFile != "" {
		t.Fatalf("exec kubeconfig loaded as %+v", cfg)
	}
	if auth, reloads := Describe(cfg); !reloads || auth != "exec credential plugin aws" {
		t.Fatalf("Describe = %q, %v", auth, reloads)
	}

	embedded := write(t, dir, "embedded", fmt.Sprintf(kubeconfigFmt, "pki/ca.crt",
		"    client-certificate-data: Y2VydA==\n    client-key-data: a2V5"))
	cfg, err = Load(embedded)
	if err != nil {
		t.Fatal(err)
	}
	if auth, reloads := Describe(cfg); reloads || !strings.Contains(auth, "embedded") {
		t.Fatalf("Describe = %q, %v for embedded data", auth, reloads)
	}

	// OpenShift's /etc/kubernetes/kubelet.conf.
	kc := write(t, dir, "kubelet-config", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n")
	if _, err := Load(kc); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a KubeletConfiguration loaded as a kubeconfig (err %v)", err)
	}
	empty := write(t, dir, "empty", "")
	if _, err := Load(empty); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("an empty file loaded as a kubeconfig (err %v)", err)
	}
	if _, err := Load(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: err %v, want fs.ErrNotExist", err)
	}

	// End to end over real files: the OpenShift layout.
	c, err := Find("", "--kubeconfig", []Candidate{{kc, "kubeadm"}, {filepath.Join(dir, "missing"), "x"}, {kubelet, "EKS, OpenShift"}}, Load)
	if err != nil {
		t.Fatal(err)
	}
	if c.Path != kubelet || len(c.Skipped) != 2 || !strings.Contains(c.Skipped[0], "not a usable kubeconfig") || !strings.Contains(c.Skipped[1], "does not exist") {
		t.Fatalf("chose %s, skipped %q", c.Path, c.Skipped)
	}
}
