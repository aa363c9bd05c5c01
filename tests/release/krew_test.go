package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// krewPlugin is the krew plugin manifest as krew reads it
// (krew.googlecontainertools.github.com/v1alpha2 Plugin), the fields a
// release writes.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string         `json:"version"`
		Homepage         string         `json:"homepage"`
		ShortDescription string         `json:"shortDescription"`
		Description      string         `json:"description"`
		Caveats          string         `json:"caveats"`
		Platforms        []krewPlatform `json:"platforms"`
	} `json:"spec"`
}

type krewPlatform struct {
	Selector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	} `json:"selector"`
	URI    string `json:"uri"`
	SHA256 string `json:"sha256"`
	Bin    string `json:"bin"`
}

// TestKrewManifest builds the plugin for linux/amd64 and linux/arm64 as
// release.sh does, runs the release's krew step on them, and checks the
// manifest: it parses (strictly) into the plugin type, names each
// platform once, and each uri names an archive the release wrote whose
// SHA-256 is the one given and which holds the plugin binary as bin.
func TestKrewManifest(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the plugin for two architectures")
	}
	version, err := Version()
	if err != nil {
		t.Fatal(err)
	}
	root, out := envtest.RepoRoot(), t.TempDir()
	built := map[string][]byte{}
	for _, arch := range []string{"amd64", "arm64"} {
		bin := filepath.Join(out, "kubectl-bootc_fleet-linux-"+arch)
		// The flags of packaging/release.sh.
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+version, "-o", bin, "./cmd/kubectl-bootc_fleet")
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building the plugin for %s: %v\n%s", arch, err, b)
		}
		if built[arch], err = os.ReadFile(bin); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", filepath.Join(root, "packaging", "krew.sh"), out)
	cmd.Env = append(os.Environ(), "VERSION="+version, "RELEASE_URL=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("krew.sh: %v\n%s", err, b)
	}
	raw, err := os.ReadFile(filepath.Join(out, "bootc-fleet.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var p krewPlugin
	if err := yaml.UnmarshalStrict(raw, &p); err != nil {
		t.Fatalf("bootc-fleet.yaml does not parse as a krew Plugin: %v\n%s", err, raw)
	}
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" || p.Metadata.Name != "bootc-fleet" {
		t.Errorf("apiVersion %q, kind %q, name %q", p.APIVersion, p.Kind, p.Metadata.Name)
	}
	if p.Spec.Version != version || p.Spec.Homepage == "" || p.Spec.ShortDescription == "" || p.Spec.Description == "" {
		t.Errorf("spec %+v: want version %s, a homepage and descriptions", p.Spec, version)
	}
	seen := map[string]bool{}
	for _, pl := range p.Spec.Platforms {
		arch := pl.Selector.MatchLabels["arch"]
		if pl.Selector.MatchLabels["os"] != "linux" || built[arch] == nil || seen[arch] || len(pl.Selector.MatchLabels) != 2 {
			t.Errorf("platform %v: want each of linux/amd64 and linux/arm64 once", pl.Selector.MatchLabels)
			continue
		}
		seen[arch] = true
		checkArchive(t, out, pl, built[arch])
	}
	if len(seen) != len(built) {
		t.Errorf("platforms %v, want linux/amd64 and linux/arm64", seen)
	}
}

// checkArchive: the platform's uri names a file the release wrote, with
// the platform's sha256, holding bin: the plugin built for it.
func checkArchive(t *testing.T, out string, pl krewPlatform, want []byte) {
	t.Helper()
	u, err := url.Parse(pl.URI)
	if err != nil || u.Scheme != "https" {
		t.Errorf("uri %q: want an https URL (%v)", pl.URI, err)
		return
	}
	name := path.Base(u.Path)
	b, err := os.ReadFile(filepath.Join(out, name))
	if err != nil {
		t.Errorf("uri %s names no archive of the release: %v", pl.URI, err)
		return
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != pl.SHA256 {
		t.Errorf("%s: sha256 %s, the manifest says %s", name, got, pl.SHA256)
	}
	bin, mode, err := fileInTarGz(b, pl.Bin)
	if err != nil {
		t.Errorf("%s: %v", name, err)
		return
	}
	if !bytes.Equal(bin, want) || mode&0o111 == 0 {
		t.Errorf("%s: %s (mode %o) is not the executable plugin built for %v", name, pl.Bin, mode, pl.Selector.MatchLabels)
	}
}

func fileInTarGz(b []byte, name string) ([]byte, int64, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, 0, err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, 0, errors.New("no " + name + " in the archive")
		}
		if err != nil {
			return nil, 0, err
		}
		if path.Clean(h.Name) == name && h.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(io.LimitReader(tr, 1<<30))
			return data, h.Mode, err
		}
	}
}
