package units

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const agentPath = "/usr/bin/bootc-fleet-agent"

func systemdAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("BOOTC_FLEET_REQUIRE_SYSTEMD") == "1" {
			t.Fatal("systemd-analyze not found and BOOTC_FLEET_REQUIRE_SYSTEMD=1")
		}
		t.Skip("systemd-analyze not found")
	}
	return p
}

// verify runs systemd-analyze verify on a copy of unit whose ExecStart points
// at a dummy executable, and returns everything it printed. systemd-analyze
// exits 0 on many real mistakes, so any output is a failure.
func verify(t *testing.T, analyze, name string, content []byte) string {
	t.Helper()
	dir := t.TempDir()
	dummy := filepath.Join(dir, "bootc-fleet-agent")
	if err := os.WriteFile(dummy, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	content = []byte(strings.ReplaceAll(string(content), agentPath, dummy))
	unit := filepath.Join(dir, name)
	if err := os.WriteFile(unit, content, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", unit).CombinedOutput()
	if err != nil && len(out) == 0 {
		return err.Error()
	}
	return string(out)
}

func unitFiles(t *testing.T) []string {
	t.Helper()
	var units []string
	for _, pat := range []string{"*.service", "*.timer", "*.target", "*.socket", "*.path"} {
		m, err := filepath.Glob(pat)
		if err != nil {
			t.Fatal(err)
		}
		units = append(units, m...)
	}
	if len(units) == 0 {
		t.Fatal("no unit files in units/")
	}
	return units
}

func TestUnitsVerifyClean(t *testing.T) {
	analyze := systemdAnalyze(t)
	for _, u := range unitFiles(t) {
		t.Run(u, func(t *testing.T) {
			data, err := os.ReadFile(u)
			if err != nil {
				t.Fatal(err)
			}
			if out := verify(t, analyze, u, data); out != "" {
				t.Errorf("systemd-analyze verify %s:\n%s", u, out)
			}
		})
	}
}

// The check above is live: a mistake systemd only warns about is caught.
func TestVerifyCatchesWarnings(t *testing.T) {
	analyze := systemdAnalyze(t)
	data, err := os.ReadFile("bootc-fleet-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]string{
		"unparsable watchdog": strings.Replace(string(data), "WatchdogSec=30s", "WatchdogSec=thirty", 1),
		"unknown key":         strings.Replace(string(data), "[Service]\n", "[Service]\nRestartEverySec=5\n", 1),
	} {
		if bad == string(data) {
			t.Fatalf("%s: mutation did not apply", name)
		}
		if out := verify(t, analyze, "bootc-fleet-agent.service", []byte(bad)); out == "" {
			t.Errorf("%s: systemd-analyze printed nothing", name)
		}
	}
}

// unitKeys returns key -> values of a unit file (comments skipped).
func unitKeys(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	keys := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: line %q", path, line)
		}
		keys[k] = append(keys[k], v)
	}
	return keys
}

func TestAgentServiceContract(t *testing.T) {
	k := unitKeys(t, "bootc-fleet-agent.service")
	want := map[string]string{
		"Type":           "notify",
		"NotifyAccess":   "main",
		"WatchdogSec":    "30s",
		"Restart":        "always",
		"StateDirectory": "bootc-fleet",
		// Either condition starts it: an ostree host or a native
		// composefs host (which writes no /run/ostree-booted).
		"ConditionPathExists":        "|/run/ostree-booted",
		"ConditionKernelCommandLine": "|composefs",
	}
	for key, v := range want {
		if got := k[key]; len(got) != 1 || got[0] != v {
			t.Errorf("%s = %q, want %q", key, got, v)
		}
	}
	after := strings.Fields(strings.Join(k["After"], " "))
	for _, u := range []string{"bootc-status-updated-onboot.target", "ostree-boot-complete.service", "network-online.target"} {
		if !contains(after, u) {
			t.Errorf("After= lacks %s", u)
		}
	}
	envFiles := k["EnvironmentFile"]
	if len(envFiles) != 2 || envFiles[0] != "/usr/lib/bootc-fleet/agent.env" || envFiles[1] != "-/etc/bootc-fleet/agent.env" {
		t.Errorf("EnvironmentFile = %q, want the /usr/lib defaults then the optional /etc file", envFiles)
	}
	// Settings that would break bootc (see the unit's comments).
	for _, key := range []string{"ProtectSystem", "PrivateMounts", "NoNewPrivileges", "RestrictSUIDSGID", "RestrictNamespaces", "ProtectKernelModules", "MountFlags"} {
		if v, ok := k[key]; ok {
			t.Errorf("%s=%v is set; bootc needs it off", key, v)
		}
	}
}

var envLine = regexp.MustCompile(`^([A-Z_][A-Z0-9_]*)=(.*)$`)

// agent.env defines every variable ExecStart uses, and its flags are the
// agent's.
func TestAgentEnv(t *testing.T) {
	data, err := os.ReadFile("agent.env")
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		m := envLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("agent.env: not VAR=value: %q", line)
		}
		vars[m[1]] = strings.Trim(m[2], `"`)
	}
	exec := unitKeys(t, "bootc-fleet-agent.service")["ExecStart"]
	if len(exec) != 1 {
		t.Fatalf("ExecStart = %q", exec)
	}
	for _, ref := range regexp.MustCompile(`\$\{?([A-Z_][A-Z0-9_]*)`).FindAllStringSubmatch(exec[0], -1) {
		if _, ok := vars[ref[1]]; !ok {
			t.Errorf("ExecStart uses $%s, which agent.env does not define", ref[1])
		}
	}
	known := map[string]bool{"--kubeconfig": true, "--node-name": true, "--bootc": true, "--boot-id-file": true,
		"--state-dir": true, "--watch-path": true, "--poll-interval": true, "--log-level": true}
	for _, arg := range strings.Fields(vars["BOOTC_FLEET_AGENT_ARGS"]) {
		flag, _, _ := strings.Cut(arg, "=")
		if !known[flag] {
			t.Errorf("default argument %q is not an agent flag", arg)
		}
	}
}

func TestPreset(t *testing.T) {
	data, err := os.ReadFile("90-bootc-fleet.preset")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 || (f[0] != "enable" && f[0] != "disable") {
			t.Fatalf("preset line %q", line)
		}
		got[f[1]] = f[0]
	}
	for unit, verb := range map[string]string{
		"bootc-fleet-agent.service":         "enable",
		"bootc-fetch-apply-updates.timer":   "disable",
		"bootc-fetch-apply-updates.service": "disable",
	} {
		if got[unit] != verb {
			t.Errorf("preset %s %s, want %s", got[unit], unit, verb)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
