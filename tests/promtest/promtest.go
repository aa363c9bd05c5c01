// Package promtest runs a real Prometheus server (Debian's prometheus
// package, on PATH) for a test: it scrapes the targets given every second
// and evaluates the alerting rules given every second. Without the binary a
// test skips, unless BOOTC_FLEET_REQUIRE_PROMETHEUS=1 (set by CI), where it
// fails.
package promtest

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Start runs prometheus until the test ends and returns its base URL once
// it is ready. rules is a rule file's YAML ("" for none).
func Start(t *testing.T, rules string, targets ...string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("BOOTC_FLEET_REQUIRE_PROMETHEUS") == "1" {
			t.Fatalf("prometheus required (BOOTC_FLEET_REQUIRE_PROMETHEUS=1) but not found: %v", err)
		}
		t.Skip("no prometheus on PATH (Debian package prometheus)")
	}
	dir := t.TempDir()
	cfg := "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
	if rules != "" {
		if err := os.WriteFile(filepath.Join(dir, "rules.yml"), []byte(rules), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg += fmt.Sprintf("rule_files: [%q]\n", filepath.Join(dir, "rules.yml"))
	}
	if len(targets) > 0 {
		cfg += fmt.Sprintf("scrape_configs:\n  - job_name: test\n    static_configs:\n      - targets: [%q]\n", strings.Join(targets, `", "`))
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := FreeAddr(t)
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	logPath := filepath.Join(dir, "prometheus.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("prometheus log:\n%s", b)
		}
	})
	u := "http://" + addr
	WaitFor(t, 60*time.Second, "prometheus ready", func() bool {
		resp, err := http.Get(u + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return u
}

// FreeAddr is a loopback address nothing listens on at the moment.
func FreeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// WaitFor polls cond with a wide bound: a loaded machine is slow, never
// wrong.
func WaitFor(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, bound)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
