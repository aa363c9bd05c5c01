package testbootc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/bootc-fleet/bootc-fleet/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"sigs.k8s.io/yaml"
)

func TestMain(m *testing.M) {
	RunIfRequested()
	os.Exit(m.Run())
}

func initDir(t *testing.T) Dir {
	t.Helper()
	d, err := Init(t.TempDir(), booted(t, refA).State())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type run struct {
	code           int
	stdout, stderr string
}

func runExe(t *testing.T, path string, env []string, args ...string) run {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return run{code, out.String(), errb.String()}
}

func self(t *testing.T, d Dir, args ...string) run {
	t.Helper()
	path, env := SelfExec(d)
	return runExe(t, path, env, args...)
}

func TestExecutableCommandLine(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		code       int
		stdoutHas  string
		stderrHas  string
		wantStaged string
	}{
		{"status --format=json", []string{"status", "--format=json"}, 0, `"apiVersion":"org.containers.bootc/v1"`, "", ""},
		{"status --format json", []string{"status", "--format", "json"}, 0, `"kind":"BootcHost"`, "", ""},
		{"status --json", []string{"status", "--json"}, 0, `"imageDigest":"` + dA + `"`, "", ""},
		{"status defaults to YAML", []string{"status"}, 0, "kind: BootcHost", "", ""},
		{"status bad format", []string{"status", "--format=xml"}, 2, "", "invalid value 'xml'", ""},
		{"status unknown flag", []string{"status", "--verbose-json"}, 2, "", "unexpected argument '--verbose-json'", ""},
		{"no command", nil, 2, "", "requires a subcommand", ""},
		{"unknown command", []string{"rollback"}, 2, "", "unrecognized subcommand 'rollback'", ""},
		{"switch without target", []string{"switch", "--download-only"}, 2, "", "<TARGET>", ""},
		{"switch two targets", []string{"switch", "--download-only", refB, refC}, 2, "", "unexpected argument", ""},
		{"switch unknown flag", []string{"switch", "--apply", refB}, 2, "", "unexpected argument '--apply'", ""},
		{"switch without --download-only", []string{"switch", refB}, 1, "", "only switch --download-only", ""},
		{"switch tag ref", []string{"switch", "--download-only", "quay.io/example/os:latest"}, 1, "", "test-bootc: tag refs need a registry", ""},
		{"switch invalid ref", []string{"switch", "--download-only", "quay.io/x;reboot"}, 1, "", "invalid image reference", ""},
		{"switch stages", []string{"switch", "--download-only", refB}, 0, refB, "", dB},
		{"upgrade without --from-downloaded", []string{"upgrade"}, 1, "", "needs a registry", ""},
		{"upgrade with nothing staged", []string{"upgrade", "--from-downloaded"}, 1, "", "No staged deployment", ""},
		{"upgrade unknown flag", []string{"upgrade", "--from-downloaded", "--apply"}, 2, "", "unexpected argument '--apply'", ""},
		{"upgrade --soft-reboot bad value", []string{"upgrade", "--from-downloaded", "--soft-reboot=sometimes"}, 2, "", "invalid value 'sometimes' for '--soft-reboot <SOFT_REBOOT>'\n  [possible values: required, auto]", ""},
		{"upgrade --soft-reboot values are case-sensitive", []string{"upgrade", "--from-downloaded", "--soft-reboot", "Auto"}, 2, "", "invalid value 'Auto'", ""},
		{"upgrade --soft-reboot without value", []string{"upgrade", "--soft-reboot", "--from-downloaded"}, 2, "", "a value is required for '--soft-reboot <SOFT_REBOOT>' but none was supplied", ""},
		{"upgrade --soft-reboot= empty", []string{"upgrade", "--from-downloaded", "--soft-reboot="}, 2, "", "a value is required for '--soft-reboot <SOFT_REBOOT>'", ""},
		{"upgrade --soft-reboot twice", []string{"upgrade", "--from-downloaded", "--soft-reboot=auto", "--soft-reboot=auto"}, 2, "", "cannot be used multiple times", ""},
		{"upgrade --soft-reboot=auto with nothing staged", []string{"upgrade", "--from-downloaded", "--soft-reboot=auto"}, 1, "", "No staged deployment", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := initDir(t)
			r := self(t, d, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stdout, tc.stdoutHas) || !strings.Contains(r.stderr, tc.stderrHas) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
					r.code, r.stdout, r.stderr, tc.code, tc.stdoutHas, tc.stderrHas)
			}
			m, err := d.Machine()
			if err != nil {
				t.Fatal(err)
			}
			if got := parse(t, m).staged; got != tc.wantStaged {
				t.Errorf("staged %q, want %q", got, tc.wantStaged)
			}
			invs, err := d.Invocations()
			if err != nil {
				t.Fatal(err)
			}
			if len(invs) != 1 || !reflect.DeepEqual(invs[0].Args, tc.args) && len(tc.args) > 0 {
				t.Errorf("recorded %+v, want one invocation of %q", invs, tc.args)
			}
		})
	}
}

func TestExecutableYAMLAndJSONAgree(t *testing.T) {
	d := initDir(t)
	if r := self(t, d, "switch", "--download-only", refB); r.code != 0 {
		t.Fatalf("switch: %+v", r)
	}
	j := self(t, d, "status", "--format=json")
	y := self(t, d, "status", "--format=yaml")
	sj, err := bootc.Parse([]byte(j.stdout))
	if err != nil {
		t.Fatal(err)
	}
	fromYAML, err := yamlToJSON([]byte(y.stdout))
	if err != nil {
		t.Fatal(err)
	}
	sy, err := bootc.Parse(fromYAML)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(sj, sy) {
		t.Errorf("JSON %+v and YAML %+v differ", sj, sy)
	}
}

func TestExecutableSimReboot(t *testing.T) {
	d := initDir(t)
	m, err := d.Machine()
	if err != nil {
		t.Fatal(err)
	}
	bootIDFile := m.State().BootIDFile
	readID := func() string {
		b, err := os.ReadFile(bootIDFile)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	first := readID()
	if !lease.ValidBootID(first) {
		t.Fatalf("initial boot ID %q invalid", first)
	}
	for _, args := range [][]string{{"switch", "--download-only", refB}, {"upgrade", "--from-downloaded"}, {"sim-reboot", "--stale-until-settle"}} {
		if r := self(t, d, args...); r.code != 0 {
			t.Fatalf("%q: %+v", args, r)
		}
	}
	second := readID()
	if second == first || !lease.ValidBootID(second) {
		t.Fatalf("boot ID after sim-reboot %q (before %q)", second, first)
	}
	stale, err := bootc.Parse([]byte(self(t, d, "status", "--json").stdout))
	if err != nil {
		t.Fatal(err)
	}
	if stale.Booted.Digest != dA || stale.Staged == nil {
		t.Fatalf("stale window shows booted %s staged %+v, want the pre-reboot document", stale.Booted.Digest, stale.Staged)
	}
	if r := self(t, d, "settle"); r.code != 0 {
		t.Fatalf("settle: %+v", r)
	}
	fresh, err := bootc.Parse([]byte(self(t, d, "status", "--json").stdout))
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Booted.Digest != dB || fresh.Rollback == nil || fresh.Rollback.Digest != dA || fresh.Staged != nil {
		t.Fatalf("after settle booted %+v rollback %+v staged %+v", fresh.Booted, fresh.Rollback, fresh.Staged)
	}

	r := self(t, d, "sim-soft-reboot")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "1" || readID() != second {
		t.Fatalf("sim-soft-reboot: %+v, boot ID %s (want unchanged %s)", r, readID(), second)
	}
	// The log holds the bootc commands only, not the harness's.
	invs, err := d.Invocations()
	if err != nil {
		t.Fatal(err)
	}
	var got [][]string
	for _, inv := range invs {
		got = append(got, inv.Args)
	}
	want := [][]string{{"switch", "--download-only", refB}, {"upgrade", "--from-downloaded"}, {"status", "--json"}, {"status", "--json"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("recorded %q, want %q", got, want)
	}
}

// upgrade --from-downloaded --soft-reboot=auto|required prepares the soft
// reboot (bootc's messages), and only then does a soft reboot enter the
// staged deployment.
func TestExecutableUpgradeSoftReboot(t *testing.T) {
	tests := []struct {
		name      string
		capable   bool
		args      []string
		code      int
		stdout    []string // lines, in order
		stderrHas string
		wantBoot  string // booted digest after sim-soft-reboot
	}{
		{"auto, capable", true, []string{"--soft-reboot=auto"}, 0,
			[]string{"Staged deployment will now be applied on reboot", "Staged deployment is soft-reboot capable, preparing for soft-reboot..."}, "", dB},
		{"auto as two arguments", true, []string{"--soft-reboot", "auto"}, 0,
			[]string{"Staged deployment will now be applied on reboot", "Staged deployment is soft-reboot capable, preparing for soft-reboot..."}, "", dB},
		{"required, capable", true, []string{"--soft-reboot=required"}, 0,
			[]string{"Staged deployment will now be applied on reboot", "Staged deployment is soft-reboot capable, preparing for soft-reboot..."}, "", dB},
		{"auto, not capable: unlocked, nothing prepared", false, []string{"--soft-reboot=auto"}, 0,
			[]string{"Staged deployment will now be applied on reboot"}, "", dA},
		{"required, not capable: unlocked, then bootc's error", false, []string{"--soft-reboot=required"}, 1,
			[]string{"Staged deployment will now be applied on reboot"},
			"error: Upgrading: Handling staged soft reboot: Handling soft reboot: Soft reboot was required but staged deployment is not soft-reboot capable", dA},
		{"no --soft-reboot, capable: a soft reboot keeps the old root", true, nil, 0,
			[]string{"Staged deployment will now be applied on reboot"}, "", dA},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := initDir(t)
			if err := d.Configure(func(k *Knobs) { k.SoftRebootCapable = tc.capable }); err != nil {
				t.Fatal(err)
			}
			if r := self(t, d, "switch", "--download-only", refB); r.code != 0 {
				t.Fatalf("switch: %+v", r)
			}
			r := self(t, d, append([]string{"upgrade", "--from-downloaded"}, tc.args...)...)
			if got := strings.Split(strings.TrimSpace(r.stdout), "\n"); r.code != tc.code || !reflect.DeepEqual(got, tc.stdout) || !strings.Contains(r.stderr, tc.stderrHas) {
				t.Fatalf("upgrade: exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr with %q", r.code, got, r.stderr, tc.code, tc.stdout, tc.stderrHas)
			}
			if r := self(t, d, "upgrade", "--from-downloaded"); r.code != 0 || strings.TrimSpace(r.stdout) != "Staged deployment is already set to apply on reboot" {
				t.Fatalf("second upgrade: %+v", r)
			}
			if r := self(t, d, "sim-soft-reboot"); r.code != 0 {
				t.Fatalf("sim-soft-reboot: %+v", r)
			}
			st, err := bootc.Parse([]byte(self(t, d, "status", "--json").stdout))
			if err != nil {
				t.Fatal(err)
			}
			if st.Booted == nil || st.Booted.Digest != tc.wantBoot {
				t.Fatalf("after the soft reboot booted %+v, want %s", st.Booted, tc.wantBoot)
			}
		})
	}
}

// Concurrent invocations serialize on the state lock: none is lost and the
// state file is never torn.
func TestExecutableConcurrentInvocations(t *testing.T) {
	d := initDir(t)
	refs := []string{refB, refC}
	const n = 12
	var wg sync.WaitGroup
	results := make([]run, n)
	for i := range n {
		wg.Go(func() {
			if i%2 == 0 {
				results[i] = self(t, d, "switch", "--download-only", refs[i/2%2])
			} else {
				results[i] = self(t, d, "status", "--json")
			}
		})
	}
	wg.Wait()
	for i, r := range results {
		if r.code != 0 {
			t.Errorf("invocation %d: %+v", i, r)
		}
		if i%2 == 1 {
			if _, err := bootc.Parse([]byte(r.stdout)); err != nil {
				t.Errorf("status %d unparsable: %v", i, err)
			}
		}
	}
	invs, err := d.Invocations()
	if err != nil {
		t.Fatal(err)
	}
	if len(invs) != n {
		t.Errorf("recorded %d invocations, want %d", len(invs), n)
	}
	m, err := d.Machine()
	if err != nil {
		t.Fatal(err)
	}
	if got := parse(t, m).staged; got != dB && got != dC {
		t.Errorf("staged %q after concurrent switches", got)
	}
}

// The real executable (not the test binary) behaves the same.
func TestBuiltExecutable(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/test-bootc")
	}
	exe := Build(t)
	d := initDir(t)
	env := []string{EnvState + "=" + string(d)}
	if r := runExe(t, exe, env, "switch", "--download-only", refB); r.code != 0 {
		t.Fatalf("switch: %+v", r)
	}
	r := runExe(t, exe, env, "status", "--format=json")
	s, err := bootc.Parse([]byte(r.stdout))
	if err != nil || s.Staged == nil || s.Staged.Digest != dB {
		t.Fatalf("status %+v: %v (%+v)", s, err, r)
	}
	if r := runExe(t, exe, nil, "status"); r.code != 1 || !strings.Contains(r.stderr, EnvState) {
		t.Errorf("without %s: %+v", EnvState, r)
	}
	invs, err := d.Invocations()
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(invs[0].Args); got != fmt.Sprint([]string{"switch", "--download-only", refB}) {
		t.Errorf("recorded %s", got)
	}
}

func yamlToJSON(y []byte) ([]byte, error) { return yaml.YAMLToJSON(y) }
