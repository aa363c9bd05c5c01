// Package e2e boots bootc-fleet nodes with a real systemd as PID 1
// (systemd-nspawn over a debootstrapped Debian), installs the agent into them
// with packaging/image/install.sh, plays their kubelets against a real
// kube-apiserver, and reboots them when the agent asks logind to.
//
// The tests need root, systemd-nspawn and debootstrap. Without them they skip
// with one line, unless BOOTC_FLEET_REQUIRE_SYSTEMD=1 (set by CI), where a
// missing piece is a failure.
package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// EnvRequire makes a missing systemd-nspawn, debootstrap or root a failure.
const EnvRequire = "BOOTC_FLEET_REQUIRE_SYSTEMD"

// EnvMirror overrides the Debian mirror debootstrap uses.
const EnvMirror = "BOOTC_FLEET_E2E_MIRROR"

// EnvSuite overrides the Debian release nodes boot when a test does not ask
// for one (SuiteBookworm or SuiteTrixie).
const EnvSuite = "BOOTC_FLEET_E2E_SUITE"

// Debian releases and packages of the base root filesystems.
const (
	// SuiteTrixie (Debian 13, systemd 257) is what the nodes boot unless a
	// test or EnvSuite asks for another: it has soft-reboot.target, logind's
	// SD_LOGIND_SOFT_REBOOT and SoftRebootsCount.
	SuiteTrixie = "trixie"
	// SuiteBookworm (Debian 12, systemd 252) has no soft reboot: its systemd
	// has no SoftRebootsCount and its logind refuses the soft-reboot flag.
	SuiteBookworm = "bookworm"
	packages      = "systemd,systemd-sysv,dbus"
	// baseRecipe versions what prepareBase does to the debootstrapped tree;
	// bump it when prepareBase changes, so caches are rebuilt.
	baseRecipe = "1"
)

// Available says whether nodes can be booted here, and why not.
func Available() (bool, string) {
	if os.Geteuid() != 0 {
		return false, "not root (systemd-nspawn and mounts need root)"
	}
	for _, b := range []string{"systemd-nspawn", "debootstrap", "nsenter"} {
		if _, err := exec.LookPath(b); err != nil {
			return false, b + " not found (apt-get install systemd-container debootstrap)"
		}
	}
	return true, ""
}

// SkipIfUnavailable skips tb in one line, or fails it when EnvRequire=1.
func SkipIfUnavailable(tb testing.TB) {
	tb.Helper()
	if ok, why := Available(); !ok {
		if os.Getenv(EnvRequire) == "1" {
			tb.Fatalf("%s=1 but nodes cannot boot here: %s", EnvRequire, why)
		}
		tb.Skipf("skipping: cannot boot systemd nodes: %s", why)
	}
}

// CacheDir is where built root filesystems are kept between runs.
func CacheDir() (string, error) {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "bootc-fleet"), nil
}

// Mirror returns the Debian mirror apt uses on this machine (EnvMirror wins),
// falling back to deb.debian.org.
func Mirror() string {
	if m := os.Getenv(EnvMirror); m != "" {
		return m
	}
	if m := aptMirror("/etc/apt"); m != "" {
		return m
	}
	return "http://deb.debian.org/debian"
}

// aptMirror finds the first apt source under dir that serves the Debian
// archive itself (not the security archive) in either sources format.
func aptMirror(dir string) string {
	files := []string{filepath.Join(dir, "sources.list")}
	for _, pat := range []string{"*.sources", "*.list"} {
		m, _ := filepath.Glob(filepath.Join(dir, "sources.list.d", pat))
		files = append(files, m...)
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			var uris []string
			switch {
			case strings.HasPrefix(line, "URIs:"):
				uris = strings.Fields(strings.TrimPrefix(line, "URIs:"))
			case strings.HasPrefix(line, "deb "):
				fs := strings.Fields(line)
				for _, w := range fs[1:] {
					if strings.HasPrefix(w, "http://") || strings.HasPrefix(w, "https://") {
						uris = append(uris, w)
						break
					}
				}
			}
			for _, u := range uris {
				u = strings.TrimRight(u, "/")
				if strings.HasSuffix(u, "/debian") {
					fh.Close()
					return u
				}
			}
		}
		fh.Close()
	}
	return ""
}

// BaseRootfs returns a Debian root filesystem of suite with systemd and
// dbus, built once with debootstrap into the cache (under a lock, renamed
// into place when complete) and reused while its inputs do not change.
// Callers must not write into it: nodes see it through overlays.
func BaseRootfs(ctx context.Context, suite string, logf func(string, ...any)) (string, error) {
	if suite != SuiteBookworm && suite != SuiteTrixie {
		return "", fmt.Errorf("unknown Debian suite %q for the node root filesystem", suite)
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	mirror := Mirror()
	sum := sha256.Sum256([]byte(strings.Join([]string{suite, "minbase", packages, mirror, runtime.GOARCH, baseRecipe}, "\n")))
	key := hex.EncodeToString(sum[:])[:16]
	dir := filepath.Join(cache, "e2e-rootfs-"+key)
	if ok, _ := complete(dir); ok {
		return dir, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(dir+".lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("locking %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if ok, _ := complete(dir); ok { // built while we waited
		return dir, nil
	}
	tmp, err := os.MkdirTemp(cache, ".e2e-rootfs-"+key+".")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	logf("building the node root filesystem once: debootstrap %s from %s into %s", suite, mirror, dir)
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--include="+packages, suite, tmp, mirror)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("debootstrap: %w\n%s", err, tail(out, 4000))
	}
	if err := prepareBase(tmp); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".bootc-fleet-e2e-complete"), []byte(key+"\n"), 0o644); err != nil {
		return "", err
	}
	_ = os.RemoveAll(dir) // a half-removed old tree without the marker
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

func complete(dir string) (bool, error) {
	_, err := os.Stat(filepath.Join(dir, ".bootc-fleet-e2e-complete"))
	return err == nil, err
}

// prepareBase makes the tree a neutral machine: no host name of its own (each
// node gets its machine name) and no apt caches.
func prepareBase(root string) error {
	for _, p := range []string{"etc/hostname", "var/cache/apt/pkgcache.bin", "var/cache/apt/srcpkgcache.bin"} {
		if err := os.Remove(filepath.Join(root, p)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	entries, _ := filepath.Glob(filepath.Join(root, "var/cache/apt/archives/*.deb"))
	for _, e := range entries {
		_ = os.Remove(e)
	}
	// An empty machine-id: every boot of every node gets its own.
	return os.WriteFile(filepath.Join(root, "etc/machine-id"), nil, 0o444)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
