package e2e

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// fakeAgent is an executable standing in for the agent binary: install.sh
// only copies it.
func fakeAgent(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bootc-fleet-agent")
	if err := os.WriteFile(p, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func runInstall(args ...string) (string, error) {
	out, err := exec.Command(InstallScript(), args...).CombinedOutput()
	return string(out), err
}

// tree lists every path under root with its mode and, for links, target;
// for files, content.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		line := rel + " " + info.Mode().String()
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case info.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			line += " " + string(data)
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func TestInstallScriptInstallsEnablesAndMasks(t *testing.T) {
	units := filepath.Join(envtest.RepoRoot(), "units")
	if _, err := os.Stat(filepath.Join(units, AgentUnit)); err != nil {
		t.Fatalf("units/%s: %v", AgentUnit, err)
	}
	agent := fakeAgent(t)
	root := t.TempDir()
	if out, err := runInstall("--agent", agent, "--units", units, root); err != nil {
		t.Fatalf("install.sh: %v\n%s", err, out)
	}
	want := map[string]string{ // path -> source to compare with ("" = symlink checks below)
		"usr/bin/bootc-fleet-agent":                           agent,
		"usr/lib/systemd/system/" + AgentUnit:                 filepath.Join(units, AgentUnit),
		"usr/lib/systemd/system-preset/90-bootc-fleet.preset": filepath.Join(units, "90-bootc-fleet.preset"),
		"usr/lib/bootc-fleet/agent.env":                       filepath.Join(units, "agent.env"),
	}
	for dst, src := range want {
		got, err := os.ReadFile(filepath.Join(root, dst))
		if err != nil {
			t.Errorf("%s not installed: %v", dst, err)
			continue
		}
		exp, _ := os.ReadFile(src)
		if string(got) != string(exp) {
			t.Errorf("%s differs from %s", dst, src)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "usr/bin/bootc-fleet-agent")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("agent binary mode: %v %v, want 0755", fi.Mode(), err)
	}
	for _, u := range []string{"bootc-fetch-apply-updates.timer", "bootc-fetch-apply-updates.service"} {
		if target, err := os.Readlink(filepath.Join(root, "etc/systemd/system", u)); err != nil || target != "/dev/null" {
			t.Errorf("%s is not masked: %q %v", u, target, err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "etc/bootc-fleet/agent.env")); err == nil {
		t.Errorf("install.sh wrote /etc/bootc-fleet/agent.env, which is the administrator's")
	}
	links, _ := filepath.Glob(filepath.Join(root, "etc/systemd/system/*.wants", AgentUnit))
	if len(links) == 0 {
		t.Errorf("%s is not enabled: no .wants symlink", AgentUnit)
	}
	for _, l := range links {
		if target, _ := os.Readlink(l); target != "/usr/lib/systemd/system/"+AgentUnit {
			t.Errorf("%s -> %q", l, target)
		}
	}

	// systemd itself agrees, reading the same tree.
	if _, err := exec.LookPath("systemctl"); err == nil {
		for unit, want := range map[string]string{AgentUnit: "enabled", "bootc-fetch-apply-updates.timer": "masked", "bootc-fetch-apply-updates.service": "masked"} {
			out, _ := exec.Command("systemctl", "--root", root, "is-enabled", unit).CombinedOutput()
			if got := strings.TrimSpace(string(out)); got != want {
				t.Errorf("systemctl --root is-enabled %s = %q, want %q", unit, got, want)
			}
		}
	}

	before := tree(t, root)
	if out, err := runInstall("--agent", agent, "--units", units, root); err != nil {
		t.Fatalf("second install.sh: %v\n%s", err, out)
	}
	if after := tree(t, root); strings.Join(before, "\n") != strings.Join(after, "\n") {
		t.Errorf("a second run changed the tree:\nbefore:\n%s\nafter:\n%s", strings.Join(before, "\n"), strings.Join(after, "\n"))
	}
}

func TestInstallScriptRejectsBadArguments(t *testing.T) {
	agent := fakeAgent(t)
	units := filepath.Join(envtest.RepoRoot(), "units")
	root := t.TempDir()
	noExec := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(noExec, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	emptyUnits := t.TempDir()
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		args       []string
	}{
		{"no ROOT", "usage", []string{"--agent", agent, "--units", units}},
		{"two ROOTs", "usage", []string{"--agent", agent, "--units", units, root, root}},
		{"relative ROOT", "absolute", []string{"--agent", agent, "--units", units, "rel/root"}},
		{"ROOT missing", "not a directory", []string{"--agent", agent, "--units", units, filepath.Join(root, "nope")}},
		{"ROOT is a file", "not a directory", []string{"--agent", agent, "--units", units, notDir}},
		{"agent missing", "missing or not executable", []string{"--agent", filepath.Join(root, "nope"), "--units", units, root}},
		{"agent not executable", "missing or not executable", []string{"--agent", noExec, "--units", units, root}},
		{"units without the service", "is missing", []string{"--agent", agent, "--units", emptyUnits, root}},
		{"unknown option", "unknown option", []string{"--agnet", agent, root}},
		{"option without value", "usage", []string{root, "--agent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runInstall(tc.args...)
			if err == nil {
				t.Fatalf("install.sh %q succeeded; want a failure mentioning %q", tc.args, tc.want)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("install.sh %q: output %q does not mention %q", tc.args, out, tc.want)
			}
		})
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("a rejected run wrote into ROOT: %v", entries)
	}
}

// The Containerfile runs install.sh from the agent image on FROM ${BASE};
// tests/image builds it.
func TestContainerfileUsesInstallScript(t *testing.T) {
	root := envtest.RepoRoot()
	data, err := os.ReadFile(filepath.Join(root, "packaging/image/Containerfile"))
	if err != nil {
		t.Fatal(err)
	}
	cf := string(data)
	if !strings.Contains(cf, "ARG BASE") || !strings.Contains(cf, "FROM ${BASE}") {
		t.Errorf("Containerfile does not build FROM the BASE build argument")
	}
	if !strings.Contains(cf, "--mount=type=bind,from=agent,target=/run/bootc-fleet /run/bootc-fleet/packaging/image/install.sh /") {
		t.Errorf("Containerfile does not run install.sh from the agent image")
	}
}
