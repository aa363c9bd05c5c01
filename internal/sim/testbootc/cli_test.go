package testbootc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"sigs.k8s.io/yaml"
)

func TestMain(m *testing.M) {
	RunIfRequested()
	os.Exit(m.Run())
}

func initDir(t *testing.T) Dir { return initDirGen(t, "") }

func initDirGen(t *testing.T, gen Generation) Dir {
	t.Helper()
	st := booted(t, refA).State()
	st.Knobs.Generation = gen
	d, err := Init(t.TempDir(), st)
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
	var ee *exec.ExitError
	if errors.As(err, &ee) {
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
	const g16, gSw = Gen1_16, GenSwitchDownloadOnly
	tests := []struct {
		name       string
		gen        Generation
		args       []string
		code       int
		stdoutHas  string
		stderrHas  string
		wantStaged string
		wantLocked bool
	}{
		{"status --format=json", g16, []string{"status", "--format=json"}, 0, `"apiVersion":"org.containers.bootc/v1"`, "", "", false},
		{"status --format json", g16, []string{"status", "--format", "json"}, 0, `"kind":"BootcHost"`, "", "", false},
		{"status --json", g16, []string{"status", "--json"}, 0, `"imageDigest":"` + dA + `"`, "", "", false},
		{"status defaults to YAML", g16, []string{"status"}, 0, "kind: BootcHost", "", "", false},
		{"status bad format", g16, []string{"status", "--format=xml"}, 2, "", "invalid value 'xml'", "", false},
		{"status unknown flag", g16, []string{"status", "--verbose-json"}, 2, "", "unexpected argument '--verbose-json'", "", false},
		{"no command", g16, nil, 2, "", "requires a subcommand", "", false},
		{"unknown command", g16, []string{"frobnicate"}, 2, "", "unrecognized subcommand 'frobnicate'", "", false},
		{"version 1.16", g16, []string{"--version"}, 0, "bootc 1.16.9\n", "", "", false},
		{"version 1.11", Gen1_11, []string{"--version"}, 0, "bootc 1.11.0\n", "", "", false},
		{"switch help 1.16 lacks --download-only", g16, []string{"switch", "--help"}, 0, "--enforce-container-sigpolicy", "", "", false},
		{"upgrade help 1.16 has --download-only", g16, []string{"upgrade", "--help"}, 0, "--from-downloaded", "", "", false},
		{"switch --download-only on 1.16 is clap's exit 2", g16, []string{"switch", "--download-only", refB}, 2, "", "unexpected argument '--download-only' found", "", false},
		{"upgrade --download-only on 1.11 is clap's exit 2", Gen1_11, []string{"upgrade", "--download-only"}, 2, "", "unexpected argument '--download-only' found", "", false},
		{"switch without target", g16, []string{"switch"}, 2, "", "<TARGET>", "", false},
		{"switch two targets", gSw, []string{"switch", "--download-only", refB, refC}, 2, "", "unexpected argument", "", false},
		{"switch unknown flag", g16, []string{"switch", "--bogus", refB}, 2, "", "unexpected argument '--bogus'", "", false},
		{"switch --mutate-in-place fails on a booted host", g16, []string{"switch", "--mutate-in-place", refB}, 1, "", "Read-only file system", "", false},
		{"switch stages unlocked", g16, []string{"switch", refB}, 0, "Queued for next boot: " + refB, "", dB, false},
		{"switch to the booted image is unchanged", g16, []string{"switch", refA}, 0, MsgSpecUnchanged, "", "", false},
		{"switch tag ref", gSw, []string{"switch", "--download-only", "quay.io/example/os:latest"}, 1, "", "test-bootc: tag refs need a registry", "", false},
		{"switch invalid ref", gSw, []string{"switch", "--download-only", "quay.io/x;reboot"}, 1, "", "invalid image reference", "", false},
		{"switch --download-only stages locked", gSw, []string{"switch", "--download-only", refB}, 0, refB, "", dB, true},
		{"plain upgrade is not simulated", g16, []string{"upgrade"}, 1, "", "are simulated", "", false},
		{"upgrade with nothing staged", g16, []string{"upgrade", "--from-downloaded"}, 1, "", "error: Upgrading: No staged deployment found", "", false},
		{"upgrade --download-only with the booted image tracked", g16, []string{"upgrade", "--download-only"}, 0, MsgNoUpdate, "", "", false},
		{"upgrade flags conflict", g16, []string{"upgrade", "--from-downloaded", "--download-only"}, 2, "", "cannot be used with", "", false},
		{"upgrade bad --soft-reboot", g16, []string{"upgrade", "--from-downloaded", "--soft-reboot=always"}, 2, "", "invalid value 'always'", "", false},
		{"upgrade unknown flag", g16, []string{"upgrade", "--from-downloaded", "--bogus"}, 2, "", "unexpected argument '--bogus'", "", false},
		{"upgrade --soft-reboot bad value", g16, []string{"upgrade", "--from-downloaded", "--soft-reboot=sometimes"}, 2, "", "invalid value 'sometimes' for '--soft-reboot <SOFT_REBOOT>'\n  [possible values: required, auto]", "", false},
		{"upgrade --soft-reboot values are case-sensitive", g16, []string{"upgrade", "--from-downloaded", "--soft-reboot", "Auto"}, 2, "", "invalid value 'Auto'", "", false},
		{"upgrade --soft-reboot without value", g16, []string{"upgrade", "--soft-reboot", "--from-downloaded"}, 2, "", "a value is required for '--soft-reboot <SOFT_REBOOT>' but none was supplied", "", false},
		{"upgrade --soft-reboot= empty", g16, []string{"upgrade", "--from-downloaded", "--soft-reboot="}, 2, "", "a value is required for '--soft-reboot <SOFT_REBOOT>'", "", false},
		{"upgrade --soft-reboot twice", g16, []string{"upgrade", "--from-downloaded", "--soft-reboot=auto", "--soft-reboot=auto"}, 2, "", "cannot be used multiple times", "", false},
		{"upgrade --soft-reboot=auto with nothing staged", g16, []string{"upgrade", "--from-downloaded", "--soft-reboot=auto"}, 1, "", "No staged deployment", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := initDirGen(t, tc.gen)
			r := self(t, d, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stdout, tc.stdoutHas) || !strings.Contains(r.stderr, tc.stderrHas) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q",
					r.code, r.stdout, r.stderr, tc.code, tc.stdoutHas, tc.stderrHas)
			}
			m, err := d.Machine()
			if err != nil {
				t.Fatal(err)
			}
			if got := parse(t, m); got.staged != tc.wantStaged || got.stagedLocked != tc.wantLocked {
				t.Errorf("staged %q (locked %v), want %q (locked %v)", got.staged, got.stagedLocked, tc.wantStaged, tc.wantLocked)
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
	d := initDirGen(t, GenSwitchDownloadOnly)
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
	d := initDirGen(t, GenSwitchDownloadOnly)
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
			d := initDirGen(t, GenSwitchDownloadOnly)
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
	d := initDirGen(t, GenSwitchDownloadOnly)
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
	d := initDirGen(t, GenSwitchDownloadOnly)
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

// bootc status waits for the sysroot lock a pull holds (bootc issue #585),
// in memory and through the executable.
func TestStatusWaitsForTheSysrootLock(t *testing.T) {
	t.Run("in memory", func(t *testing.T) {
		m := booted(t, refA)
		m.Configure(func(k *Knobs) { k.SwitchHang = true })
		mem := NewMem(m)
		pullCtx, stopPull := context.WithCancel(context.Background())
		pulled := make(chan int, 1)
		go func() {
			code, _ := mem.Run(pullCtx, []string{"switch", refB}, io.Discard, io.Discard)
			pulled <- code
		}()
		// Wait until the switch holds the lock: a status with a short
		// deadline then cannot get it. Bounded by time, not by tries: on a
		// loaded machine the switch's goroutine may not run for a while.
		var blocked bool
		for deadline := time.Now().Add(30 * time.Second); !blocked && time.Now().Before(deadline); {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			code, _ := mem.Run(ctx, []string{"status", "--json"}, io.Discard, io.Discard)
			cancel()
			blocked = code != 0
		}
		if !blocked {
			t.Fatal("status never waited behind the hanging switch")
		}
		stopPull()
		if code := <-pulled; code == 0 {
			t.Fatal("the cancelled switch succeeded")
		}
		var out bytes.Buffer
		if code, _ := mem.Run(context.Background(), []string{"status", "--json"}, &out, io.Discard); code != 0 {
			t.Fatalf("status after the pull ended: exit %d", code)
		}
		if st := m.State().Staged; st != nil {
			t.Fatalf("a cancelled pull staged %+v", st)
		}
	})
	t.Run("executable", func(t *testing.T) {
		d := initDir(t)
		if err := d.Configure(func(k *Knobs) { k.SwitchDelay = Duration(1500 * time.Millisecond) }); err != nil {
			t.Fatal(err)
		}
		done := make(chan run, 1)
		go func() { done <- self(t, d, "switch", refB) }()
		// Once the switch is recorded it holds (or is about to take) the
		// lock; a status started after it has taken the lock must show
		// the staged image, which exists only after the pull.
		deadline := time.Now().Add(30 * time.Second)
		for {
			if f, err := os.Open(d.Path(SysrootLockFile)); err == nil {
				err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
				f.Close()
				if errors.Is(err, syscall.EWOULDBLOCK) {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatal("the switch never took the sysroot lock")
			}
			time.Sleep(5 * time.Millisecond)
		}
		r := self(t, d, "status", "--json")
		st, err := bootc.Parse([]byte(r.stdout))
		if err != nil {
			t.Fatalf("status: %v (%+v)", err, r)
		}
		if st.Staged == nil || st.Staged.Digest != dB {
			t.Fatalf("status taken while the pull ran shows staged %+v: it did not wait for the lock", st.Staged)
		}
		if sw := <-done; sw.code != 0 {
			t.Fatalf("switch: %+v", sw)
		}
	})
}

// A manifest list is peeled: the status keeps the reference as given and
// reports the platform manifest's digest as imageDigest (bootc PR #1239).
func TestExecutablePeelsManifestLists(t *testing.T) {
	d := initDir(t)
	if err := d.Configure(func(k *Knobs) { k.ManifestLists = map[string]string{dB: dC} }); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"switch", refB}, {"upgrade", "--download-only"}} {
		if r := self(t, d, args...); r.code != 0 {
			t.Fatalf("%q: %+v", args, r)
		}
	}
	r := self(t, d, "status", "--format=json")
	st, err := bootc.Parse([]byte(r.stdout))
	if err != nil {
		t.Fatal(err)
	}
	if st.Staged == nil || st.Staged.Image != refB || st.Staged.Digest != dC || !st.Staged.DownloadOnly {
		t.Fatalf("staged %+v, want image %s with imageDigest %s, locked", st.Staged, refB, dC)
	}
	// So what the agent compares (repo@imageDigest) is the platform image,
	// never the index it asked for.
	if p, _ := st.Staged.Pinned(); p.Digest != dC {
		t.Fatalf("Pinned() = %s", p)
	}
}

// initUpgraded is a state directory of generation gen booted on refB with
// refA as its rollback (staged, unlocked and rebooted into refB), with knobs.
func initUpgraded(t *testing.T, gen Generation, knobs Knobs) Dir {
	t.Helper()
	knobs.Generation = gen
	m := upgraded(t, knobs)
	d, err := Init(t.TempDir(), m.State())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// bootc rollback's command line in every modelled generation: RollbackOpts
// (--apply, --soft-reboot) is the same in all of them (crates/lib/src/cli.rs
// at v1.11.0, v1.12.0, v1.16.9), every other flag is clap's exit 2, and
// failures are bootc's context chain with exit 1.
func TestExecutableRollback(t *testing.T) {
	const noRollback = "error: Rollback: Rollback (ostree): No rollback available\n"
	const notCapable = "error: Rollback: Rollback (ostree): Handling soft reboot: Soft reboot was required but rollback deployment is not soft-reboot capable\n"
	tests := []struct {
		name        string
		upgraded    bool // booted refB with rollback refA; else booted refA alone
		capable     bool
		args        []string
		code        int
		stdout      string // exact
		stderrHas   string
		stderrExact bool
		want        rollbackDoc
	}{
		{"help lists --apply and --soft-reboot", true, false, []string{"rollback", "--help"}, 0, "", "", false, rollbackDoc{booted: dB, rollback: dA, bootOrder: "default"}},
		{"--quiet is no rollback flag", true, false, []string{"rollback", "--quiet"}, 2, "",
			"error: unexpected argument '--quiet' found\n\n  tip: to pass '--quiet' as a value, use '-- --quiet'\n\nUsage: bootc rollback [OPTIONS]\n\nFor more information, try '--help'.\n", true,
			rollbackDoc{booted: dB, rollback: dA, bootOrder: "default"}},
		{"--download-only is no rollback flag", true, false, []string{"rollback", "--download-only"}, 2, "", "unexpected argument '--download-only' found", false, rollbackDoc{booted: dB, rollback: dA, bootOrder: "default"}},
		{"a target is no rollback argument", true, false, []string{"rollback", refA}, 2, "", "unexpected argument '" + refA + "' found", false, rollbackDoc{booted: dB, rollback: dA, bootOrder: "default"}},
		{"bad --soft-reboot", true, false, []string{"rollback", "--soft-reboot=always"}, 2, "", "invalid value 'always' for '--soft-reboot <SOFT_REBOOT>'", false, rollbackDoc{booted: dB, rollback: dA, bootOrder: "default"}},
		{"--apply is not simulated", true, false, []string{"rollback", "--apply"}, 1, "", "--apply is not simulated", false, rollbackDoc{booted: dB, rollback: dA, bootOrder: "default"}},
		{"no rollback deployment", false, false, []string{"rollback"}, 1, "", noRollback, true, rollbackDoc{booted: dA, bootOrder: "default"}},
		{"rollback queues it", true, false, []string{"rollback"}, 0, MsgRollbackQueued + "\n", "", true, rollbackDoc{booted: dB, rollback: dA, queued: true, bootOrder: "rollback"}},
		{"--soft-reboot=auto, capable", true, true, []string{"rollback", "--soft-reboot=auto"}, 0, MsgRollbackQueued + "\n" + MsgRollbackSoftReboot + "\n", "", true,
			rollbackDoc{booted: dB, rollback: dA, queued: true, bootOrder: "rollback", rollbackCapable: true}},
		{"--soft-reboot required, not capable: queued, then bootc's error", true, false, []string{"rollback", "--soft-reboot", "required"}, 1, MsgRollbackQueued + "\n", notCapable, true,
			rollbackDoc{booted: dB, rollback: dA, queued: true, bootOrder: "rollback"}},
	}
	for _, gen := range Generations {
		for _, tc := range tests {
			t.Run(string(gen)+"/"+tc.name, func(t *testing.T) {
				var d Dir
				if tc.upgraded {
					d = initUpgraded(t, gen, Knobs{SoftRebootCapable: tc.capable})
				} else {
					d = initDirGen(t, gen)
				}
				r := self(t, d, tc.args...)
				okErr := strings.Contains(r.stderr, tc.stderrHas)
				if tc.stderrExact {
					okErr = r.stderr == tc.stderrHas
				}
				okOut := r.stdout == tc.stdout || tc.stdout == "" && r.code != 0
				if tc.args[len(tc.args)-1] == "--help" {
					okOut = strings.Contains(r.stdout, "Usage: bootc rollback [OPTIONS]") && strings.Contains(r.stdout, "--apply") && strings.Contains(r.stdout, "--soft-reboot <SOFT_REBOOT>")
				}
				if r.code != tc.code || !okOut || !okErr {
					t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderrHas)
				}
				if got := readRollbackDoc(t, []byte(self(t, d, "status", "--json").stdout)); got != tc.want {
					t.Errorf("status %+v, want %+v", got, tc.want)
				}
			})
		}
	}
}

// After `bootc rollback` the next boot boots the old rollback deployment and
// the previously booted one becomes the rollback; a soft reboot enters it
// only when the rollback prepared it, and the stale window after a reboot
// shows the queued rollback.
func TestExecutableRollbackThenReboot(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capable  bool
		rollback []string
		boot     []string
		want     rollbackDoc
	}{
		{"reboot", false, []string{"rollback"}, []string{"sim-reboot"},
			rollbackDoc{booted: dA, rollback: dB, bootOrder: "default"}},
		{"soft reboot prepared by --soft-reboot=auto", true, []string{"rollback", "--soft-reboot=auto"}, []string{"sim-soft-reboot"},
			rollbackDoc{booted: dA, rollback: dB, bootOrder: "default", rollbackCapable: true}},
		{"soft reboot without --soft-reboot stays", true, []string{"rollback"}, []string{"sim-soft-reboot"},
			rollbackDoc{booted: dB, rollback: dA, queued: true, bootOrder: "rollback", rollbackCapable: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := initUpgraded(t, Gen1_16, Knobs{SoftRebootCapable: tc.capable})
			if r := self(t, d, tc.rollback...); r.code != 0 {
				t.Fatalf("%q: %+v", tc.rollback, r)
			}
			before := readRollbackDoc(t, []byte(self(t, d, "status", "--json").stdout))
			if r := self(t, d, append(tc.boot, "--stale-until-settle")...); r.code != 0 {
				t.Fatalf("%q: %+v", tc.boot, r)
			}
			if got := readRollbackDoc(t, []byte(self(t, d, "status", "--json").stdout)); got != before {
				t.Errorf("stale window shows %+v, want the pre-reboot %+v", got, before)
			}
			if r := self(t, d, "settle"); r.code != 0 {
				t.Fatalf("settle: %+v", r)
			}
			if got := readRollbackDoc(t, []byte(self(t, d, "status", "--json").stdout)); got != tc.want {
				t.Errorf("after %q: %+v, want %+v", tc.boot, got, tc.want)
			}
		})
	}
}

// bootc rollback opens the storage for writing and so takes the sysroot
// lock, waiting while a pull holds it, like switch and upgrade.
func TestRollbackWaitsForTheSysrootLock(t *testing.T) {
	m := upgraded(t, Knobs{SwitchHang: true})
	mem := NewMem(m)
	pullCtx, stopPull := context.WithCancel(context.Background())
	pulled := make(chan int, 1)
	go func() {
		code, _ := mem.Run(pullCtx, []string{"switch", refC}, io.Discard, io.Discard)
		pulled <- code
	}()
	// Wait until the switch holds the lock (a status with a short deadline
	// cannot get it; the switch hangs until cancelled, so it keeps it).
	var held bool
	for deadline := time.Now().Add(30 * time.Second); !held && time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		code, _ := mem.Run(ctx, []string{"status", "--json"}, io.Discard, io.Discard)
		cancel()
		held = code != 0
	}
	if !held {
		t.Fatal("the hanging switch never took the sysroot lock")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	code, _ := mem.Run(ctx, []string{"rollback"}, io.Discard, io.Discard)
	cancel()
	if code == 0 {
		t.Fatal("rollback ran while the pull held the sysroot lock")
	}
	if m.State().RollbackQueued {
		t.Fatal("a rollback that never got the lock queued the rollback")
	}
	stopPull()
	<-pulled
	var out bytes.Buffer
	if code, _ := mem.Run(context.Background(), []string{"rollback"}, &out, io.Discard); code != 0 || out.String() != MsgRollbackQueued+"\n" {
		t.Fatalf("rollback after the pull ended: exit %d, %q", code, out.String())
	}
}
