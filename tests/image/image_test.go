// Package image builds the images `make image` builds, with the same script
// (packaging/build-images.sh), and checks what users get:
//
//   - the coordinator image: its entrypoint, run from the OCI archive, prints
//     the version and the flags; it runs as a non-root user, holds the static
//     binary, the CA certificates and nothing else, and carries the OCI labels;
//   - the bootc image layer: packaging/image/Containerfile, and the two-line
//     Containerfile docs/image.md shows, built on a local systemd base (the
//     end-to-end tests' Debian root filesystem, imported as an image) install
//     the agent, its unit and preset, enable the unit and mask bootc's own
//     updater; the image's own systemd verifies the unit.
//
// The tests need root, buildah and debootstrap. Without them they skip in one
// line, unless BOOTC_FLEET_REQUIRE_BUILDAH=1 (set by CI) makes that a failure.
package image

import (
	"bytes"
	"context"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/bootc-fleet/bootc-fleet/tests/e2e"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
	"github.com/bootc-fleet/bootc-fleet/tests/release"
)

// EnvRequire makes a missing buildah, debootstrap or root a failure.
const EnvRequire = "BOOTC_FLEET_REQUIRE_BUILDAH"

const (
	repo           = "quay.io/bootc-fleet"
	agentUnit      = "bootc-fleet-agent.service"
	coordinatorBin = "/usr/bin/bootc-fleet-coordinator"
)

func skipIfUnavailable(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "not root (buildah builds here as root, vfs storage, chroot isolation)"
	} else {
		for _, b := range []string{"buildah", "debootstrap", "git"} {
			if _, err := exec.LookPath(b); err != nil {
				why = b + " not found (apt-get install buildah debootstrap)"
				break
			}
		}
	}
	if why == "" {
		return
	}
	if os.Getenv(EnvRequire) == "1" {
		t.Fatalf("%s=1 but images cannot be built here: %s", EnvRequire, why)
	}
	t.Skipf("skipping: cannot build images: %s", why)
}

// buildah runs buildah on one storage (vfs, chroot isolation: what works as
// root on these machines, nested or not).
type buildah struct{ root string }

func newStorage(t *testing.T) buildah {
	t.Helper()
	dir, err := os.MkdirTemp("", "bootc-fleet-image-test-")
	if err != nil {
		t.Fatal(err)
	}
	b := buildah{root: dir}
	t.Cleanup(func() {
		// Unmount and remove every working container before the storage goes.
		_, _ = b.run("rm", "--all")
		_ = os.RemoveAll(dir)
	})
	return b
}

func (b buildah) opts() []string {
	return []string{"--root", filepath.Join(b.root, "storage"), "--runroot", filepath.Join(b.root, "run"), "--storage-driver", "vfs"}
}

func (b buildah) run(args ...string) (string, error) {
	cmd := exec.Command("buildah", append(b.opts(), args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("buildah %s: %w\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

func (b buildah) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := b.run(args...)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// mount makes a working container of image and returns it and its root.
func (b buildah) mount(t *testing.T, image string) (ctr, root string) {
	t.Helper()
	ctr = b.must(t, "from", "--pull=never", image)
	return ctr, b.must(t, "mount", ctr)
}

// built is what build-images.sh made, once per test binary.
type built struct {
	version string
	out     string // the script's --out
	store   buildah
	err     error
}

var (
	buildOnce sync.Once
	images    built
)

// buildImages runs packaging/build-images.sh as `make image` does, with the
// release version, into a storage of its own.
func buildImages(t *testing.T) built {
	t.Helper()
	buildOnce.Do(func() {
		v, err := release.Version()
		if err != nil {
			images.err = err
			return
		}
		dir, err := os.MkdirTemp("", "bootc-fleet-images-")
		if err != nil {
			images.err = err
			return
		}
		images = built{version: v, out: filepath.Join(dir, "out"), store: buildah{root: dir}}
		cmd := exec.Command("bash", filepath.Join(envtest.RepoRoot(), "packaging", "build-images.sh"), "--version", v, "--out", images.out)
		cmd.Env = append(os.Environ(), "BUILDER=buildah", "BUILDER_OPTS="+strings.Join(images.store.opts(), " "))
		if out, err := cmd.CombinedOutput(); err != nil {
			images.err = fmt.Errorf("build-images.sh: %w\n%s", err, out)
		}
	})
	if images.err != nil {
		t.Fatal(images.err)
	}
	return images
}

func TestMain(m *testing.M) {
	code := m.Run()
	if images.store.root != "" {
		_, _ = images.store.run("rm", "--all")
		_ = os.RemoveAll(images.store.root)
	}
	os.Exit(code)
}

func archive(b built, name string) string {
	return filepath.Join(b.out, fmt.Sprintf("%s-%s-linux-%s.oci.tar", name, b.version, goarch()))
}

// goarch is the architecture build-images.sh builds by default: the
// toolchain's, which built this test.
func goarch() string { return runtime.GOARCH }

// load pulls an OCI archive into a storage and tags it as ref.
func load(t *testing.T, b buildah, file, ref string) {
	t.Helper()
	id := b.must(t, "pull", "--quiet", "oci-archive:"+file)
	b.must(t, "tag", id, ref)
}

type imageConfig struct {
	Architecture string `json:"architecture"`
	Config       struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

func inspect(t *testing.T, b buildah, ref string) imageConfig {
	t.Helper()
	var d struct {
		OCIv1 imageConfig `json:"OCIv1"`
	}
	if err := json.Unmarshal([]byte(b.must(t, "inspect", "--type", "image", ref)), &d); err != nil {
		t.Fatal(err)
	}
	return d.OCIv1
}

// files lists the regular files and symlinks under root, relative.
func files(t *testing.T, root string) ([]string, int64) {
	t.Helper()
	var out []string
	var size int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		out = append(out, rel)
		if info, err := d.Info(); err == nil && info.Mode().IsRegular() {
			size += info.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out, size
}

func checkLabels(t *testing.T, what string, cfg imageConfig, version string) {
	t.Helper()
	rev, err := exec.Command("git", "-C", envtest.RepoRoot(), "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.source":   "https://github.com/bootc-fleet/bootc-fleet",
		"org.opencontainers.image.revision": strings.TrimSpace(string(rev)),
		"org.opencontainers.image.version":  version,
	} {
		if got := cfg.Config.Labels[k]; got != want {
			t.Errorf("%s: label %s = %q, want %q", what, k, got, want)
		}
	}
}

func TestCoordinatorImage(t *testing.T) {
	skipIfUnavailable(t)
	b := buildImages(t)

	// What a user loads: the OCI archive, into a storage that never saw the build.
	s := newStorage(t)
	ref := repo + "/bootc-fleet-coordinator:" + b.version
	load(t, s, archive(b, "bootc-fleet-coordinator"), ref)
	cfg := inspect(t, s, ref)
	if cfg.Architecture != goarch() {
		t.Errorf("architecture %q, want %q", cfg.Architecture, goarch())
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("User %q, want the non-root 65532:65532", cfg.Config.User)
	}
	if len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != coordinatorBin || len(cfg.Config.Cmd) != 0 {
		t.Fatalf("Entrypoint %q Cmd %q, want [%s] and no Cmd", cfg.Config.Entrypoint, cfg.Config.Cmd, coordinatorBin)
	}
	checkLabels(t, "coordinator image", cfg, b.version)

	ctr, root := s.mount(t, ref)
	got, size := files(t, root)
	want := []string{"etc/group", "etc/passwd", "etc/ssl/certs/ca-certificates.crt", strings.TrimPrefix(coordinatorBin, "/")}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("image files %q, want exactly %q", got, want)
	}
	t.Logf("coordinator image: %d files, %.1f MB uncompressed; the archive is %.1f MB", len(got), float64(size)/1e6, float64(fileSize(t, archive(b, "bootc-fleet-coordinator")))/1e6)
	pem, err := os.ReadFile(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if pool := x509.NewCertPool(); !pool.AppendCertsFromPEM(pem) {
		t.Errorf("/etc/ssl/certs/ca-certificates.crt holds no certificate")
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !regexp.MustCompile(`(?m)^nonroot:x:65532:65532:`).Match(passwd) {
		t.Errorf("/etc/passwd has no nonroot user 65532:\n%s", passwd)
	}
	f, err := elf.Open(filepath.Join(root, coordinatorBin))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s is dynamically linked (has an ELF interpreter)", coordinatorBin)
		}
	}
	if f.Section(".debug_info") != nil || f.Section(".symtab") != nil {
		t.Errorf("%s carries debug information or a symbol table", coordinatorBin)
	}
	f.Close()

	// The entrypoint as the image defines it, as its user.
	run := func(arg string) (string, error) {
		return s.run(append([]string{"run", "--isolation", "chroot", "--user", cfg.Config.User, ctr, "--"}, append(cfg.Config.Entrypoint, arg)...)...)
	}
	out, err := run("--version")
	if err != nil {
		t.Fatal(err)
	}
	if want := "bootc-fleet-coordinator " + b.version + "\n"; out != want {
		t.Errorf("--version printed %q, want %q", out, want)
	}
	// flag prints the usage on stderr; buildah run passes it through, so
	// capture both.
	cmd := exec.Command("buildah", append(s.opts(), append([]string{"run", "--isolation", "chroot", "--user", cfg.Config.User, ctr, "--"}, append(cfg.Config.Entrypoint, "--help")...)...)...)
	help, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("--help: %v\n%s", err, help)
	}
	for _, flag := range []string{"-version", "-leader-elect", "-metrics-bind-address", "-health-probe-bind-address", "-log-level", "-insecure-registry"} {
		if !strings.Contains(string(help), "\n  "+flag+" ") && !strings.Contains(string(help), "\n  "+flag+"\n") {
			t.Errorf("--help does not list %s:\n%s", flag, help)
		}
	}
}

func fileSize(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func TestAgentImage(t *testing.T) {
	skipIfUnavailable(t)
	b := buildImages(t)
	s := newStorage(t)
	ref := repo + "/bootc-fleet-agent:" + b.version
	load(t, s, archive(b, "bootc-fleet-agent"), ref)
	checkLabels(t, "agent image", inspect(t, s, ref), b.version)
	_, root := s.mount(t, ref)
	got, _ := files(t, root)
	want := []string{"bin/bootc-fleet-agent", "packaging/image/install.sh"}
	units, err := os.ReadDir(filepath.Join(envtest.RepoRoot(), "units"))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range units {
		want = append(want, "units/"+u.Name())
	}
	sort.Strings(want)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("agent image files %q, want exactly %q", got, want)
	}
}

// The two-line Containerfile docs/image.md tells users to write.
var docContainerfile = regexp.MustCompile("(?s)```[Dd]ockerfile\n(FROM [^\n]+\n[^\n]+\n)```")

func TestBootcImageLayer(t *testing.T) {
	skipIfUnavailable(t)
	b := buildImages(t)
	ctx := context.Background()
	rootfs, err := e2e.BaseRootfs(ctx, e2e.SuiteTrixie, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	s := newStorage(t)
	// The base: a minimal systemd root filesystem imported as an image,
	// standing in for a bootc base image, which cannot be pulled here.
	base := "localhost/bootc-fleet-test-base:" + filepath.Base(rootfs)
	ctr, mnt := s.mount(t, "scratch")
	if out, err := exec.Command("cp", "-a", rootfs+"/.", mnt+"/").CombinedOutput(); err != nil {
		t.Fatalf("copying the base root filesystem: %v\n%s", err, out)
	}
	s.must(t, "commit", "--quiet", ctr, base)
	s.must(t, "rm", ctr)
	load(t, s, archive(b, "bootc-fleet-agent"), repo+"/bootc-fleet-agent:"+b.version)

	doc, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "docs", "image.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := docContainerfile.FindSubmatch(doc)
	if m == nil {
		t.Fatalf("docs/image.md has no two-line ```dockerfile block (FROM <your bootc base> and the agent layer)")
	}
	userCF := string(m[1])
	if want := "from=" + repo + "/bootc-fleet-agent:" + b.version + ","; !strings.Contains(userCF, want) {
		t.Errorf("docs/image.md's Containerfile does not mount the release's agent image (%s):\n%s", want, userCF)
	}
	userCF = regexp.MustCompile(`^FROM \S+`).ReplaceAllString(userCF, "FROM "+base)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "Containerfile"), []byte(userCF), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"packaging/image/Containerfile", []string{"--build-arg", "BASE=" + base, "--build-arg", "AGENT=" + repo + "/bootc-fleet-agent:" + b.version,
			"-f", filepath.Join(envtest.RepoRoot(), "packaging/image/Containerfile"), envtest.RepoRoot()}},
		{"docs/image.md", []string{"-f", filepath.Join(dir, "Containerfile"), dir}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := "localhost/bootc-fleet-test-os:" + strings.NewReplacer("/", "-", ".", "-").Replace(tc.name)
			s.must(t, append([]string{"build", "--quiet", "--isolation", "chroot", "--pull=never", "-t", out}, tc.args...)...)
			checkBootcImage(t, s, out, b.version)
		})
	}
}

func checkBootcImage(t *testing.T, s buildah, image, version string) {
	ctr, root := s.mount(t, image)
	units := filepath.Join(envtest.RepoRoot(), "units")
	for dst, src := range map[string]string{
		"usr/lib/systemd/system/" + agentUnit:                 filepath.Join(units, agentUnit),
		"usr/lib/systemd/system-preset/90-bootc-fleet.preset": filepath.Join(units, "90-bootc-fleet.preset"),
		"usr/lib/bootc-fleet/agent.env":                       filepath.Join(units, "agent.env"),
	} {
		got, err := os.ReadFile(filepath.Join(root, dst))
		if err != nil {
			t.Errorf("/%s: %v", dst, err)
			continue
		}
		if exp, _ := os.ReadFile(src); !bytes.Equal(got, exp) {
			t.Errorf("/%s differs from units/%s", dst, filepath.Base(src))
		}
	}
	// The agent image was mounted for one RUN: none of it stays.
	for _, gone := range []string{"run/bootc-fleet", "units", "packaging"} {
		if _, err := os.Lstat(filepath.Join(root, gone)); err == nil {
			t.Errorf("/%s is left in the image: only what install.sh installs may stay", gone)
		}
	}
	// The agent binary from the agent image, as systemd will start it.
	out, err := s.run("run", "--isolation", "chroot", ctr, "--", "/usr/bin/bootc-fleet-agent", "--version")
	if err != nil {
		t.Fatal(err)
	}
	if want := "bootc-fleet-agent " + version + "\n"; out != want {
		t.Errorf("/usr/bin/bootc-fleet-agent --version printed %q, want %q (the coordinator prints the same version)", out, want)
	}
	// systemd reads the tree as the node will.
	for unit, want := range map[string]string{agentUnit: "enabled", "bootc-fetch-apply-updates.timer": "masked", "bootc-fetch-apply-updates.service": "masked"} {
		out, _ := exec.Command("systemctl", "--root", root, "is-enabled", unit).CombinedOutput()
		if got := strings.TrimSpace(string(out)); got != want {
			t.Errorf("systemctl --root is-enabled %s = %q, want %q", unit, got, want)
		}
	}
	// The image's own systemd (the one the node boots) verifies the unit and
	// everything it pulls in: exit 0 and not a word. The host's
	// systemd-analyze --root would judge the base's units by an older systemd.
	cmd := exec.Command("buildah", append(s.opts(), "run", "--isolation", "chroot", ctr, "--", "systemd-analyze", "verify", "--root=/", "/usr/lib/systemd/system/"+agentUnit)...)
	if out, err := cmd.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify --root=/ %s in the image: %v\n%s", agentUnit, err, out)
	}
	t.Run("bootc container lint", func(t *testing.T) {
		if _, err := s.run("run", "--isolation", "chroot", ctr, "--", "sh", "-c", "command -v bootc"); err != nil {
			t.Skip("skipping: the test base has no bootc (no bootc base image can be pulled here); the Containerfile runs `bootc container lint` where the base has it")
		}
		if out, err := s.run("run", "--isolation", "chroot", ctr, "--", "bootc", "container", "lint"); err != nil {
			t.Errorf("bootc container lint: %v\n%s", err, out)
		}
	})
}
