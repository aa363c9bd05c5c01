package bootc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
)

func TestMain(m *testing.M) {
	// The test binary doubles as test-bootc when re-executed by the CLI tests.
	testbootc.RunIfRequested()
	os.Exit(m.Run())
}

const (
	bootedRef = "quay.io/example/os@" + d736b
	targetRef = "quay.io/example/os@" + d16dc
)

// newHost returns a test bootc state dir booted on bootedRef and a CLI over it.
func newHost(t *testing.T, knobs testbootc.Knobs) (testbootc.Dir, *CLI) {
	t.Helper()
	m, err := testbootc.NewBooted(bootedRef)
	if err != nil {
		t.Fatal(err)
	}
	s := m.State()
	s.Knobs = knobs
	d, err := testbootc.Init(t.TempDir(), s)
	if err != nil {
		t.Fatal(err)
	}
	path, env := testbootc.SelfExec(d)
	return d, &CLI{Path: path, Env: env}
}

func invocations(t *testing.T, d testbootc.Dir) [][]string {
	t.Helper()
	invs, err := d.Invocations()
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, inv := range invs {
		out = append(out, inv.Args)
	}
	return out
}

func mustPinned(t *testing.T, ref string) imageref.Pinned {
	t.Helper()
	p, err := imageref.ParsePinned(ref)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// probe returns what the test bootc of d supports, as the agent learns it.
func probe(t *testing.T, cli *CLI) Capabilities {
	t.Helper()
	caps, err := cli.Probe(context.Background())
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	return caps
}

// Each bootc generation stages the image locked with its own sequence, and
// unlocks it with upgrade --from-downloaded.
func TestCLIStageAndApply(t *testing.T) {
	probeCalls := [][]string{{"--version"}, {"switch", "--help"}, {"upgrade", "--help"}}
	tests := []struct {
		gen       testbootc.Generation
		wantCaps  Capabilities
		wantStage [][]string
	}{
		{testbootc.Gen1_16, Capabilities{Version: "1.16.9", UpgradeDownloadOnly: true, SoftReboot: true}, [][]string{
			{"switch", targetRef},
			{"upgrade", "--download-only"},
			{"status", "--format=json"},
		}},
		{testbootc.GenSwitchDownloadOnly, Capabilities{Version: "1.17.0", SwitchDownloadOnly: true, UpgradeDownloadOnly: true, SoftReboot: true}, [][]string{
			{"switch", "--download-only", targetRef},
			{"status", "--format=json"}, // lockIfUnlocked: already locked
			{"status", "--format=json"},
		}},
	}
	for _, tc := range tests {
		t.Run(string(tc.gen), func(t *testing.T) {
			d, cli := newHost(t, testbootc.Knobs{Generation: tc.gen})
			ctx := context.Background()
			caps := probe(t, cli)
			if caps != tc.wantCaps {
				t.Fatalf("Probe = %+v, want %+v", caps, tc.wantCaps)
			}
			if err := cli.Stage(ctx, mustPinned(t, targetRef), caps, StageOptions{}); err != nil {
				t.Fatalf("Stage: %v", err)
			}
			s, err := cli.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if s.Staged == nil || s.Staged.Digest != d16dc || !s.Staged.DownloadOnly {
				t.Fatalf("after stage staged = %+v, want %s download-only", s.Staged, d16dc)
			}
			if p, err := s.Staged.Pinned(); err != nil || p.String() != targetRef {
				t.Errorf("staged Pinned() = %v, %v; want %s", p, err, targetRef)
			}
			if err := cli.ApplyStaged(ctx, NoSoftReboot); err != nil {
				t.Fatalf("ApplyStaged: %v", err)
			}
			s, err = cli.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if s.Staged == nil || s.Staged.DownloadOnly {
				t.Fatalf("after apply staged = %+v, want unlocked", s.Staged)
			}
			want := append(append(append([][]string{}, probeCalls...), tc.wantStage...),
				[]string{"status", "--format=json"}, []string{"upgrade", "--from-downloaded"}, []string{"status", "--format=json"})
			if got := invocations(t, d); !reflect.DeepEqual(got, want) {
				t.Errorf("bootc ran\n%q\nwant\n%q", got, want)
			}
		})
	}
}

// A bootc without any download-only staging is refused before anything runs.
func TestCLIStageRefusesBootcWithoutDownloadOnly(t *testing.T) {
	d, cli := newHost(t, testbootc.Knobs{Generation: testbootc.Gen1_11})
	caps := probe(t, cli)
	if caps.UpgradeDownloadOnly || caps.SwitchDownloadOnly || caps.Version != "1.11.0" {
		t.Fatalf("Probe = %+v", caps)
	}
	before := len(invocations(t, d))
	err := cli.Stage(context.Background(), mustPinned(t, targetRef), caps, StageOptions{})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "bootc 1.11.0") {
		t.Fatalf("Stage = %v, want ErrUnsupported naming bootc 1.11.0", err)
	}
	if got := invocations(t, d)[before:]; len(got) != 0 {
		t.Errorf("bootc ran %q", got)
	}
}

// The flag the agent used to pass on switch is refused by clap on a bootc
// without it: the agent must never depend on it there.
func TestBootcWithoutSwitchDownloadOnlyRefusesIt(t *testing.T) {
	_, cli := newHost(t, testbootc.Knobs{Generation: testbootc.Gen1_16})
	_, err := cli.run(context.Background(), "switch", "--download-only", targetRef)
	var ce *CommandError
	if !errors.As(err, &ce) || ce.ExitCode != 2 || !strings.Contains(ce.Stderr, "unexpected argument '--download-only'") {
		t.Fatalf("switch --download-only on bootc 1.16 = %v, want clap's exit 2", err)
	}
}

// A stage whose switch ran to staging but whose lock step failed leaves
// the image locked anyway, or says it could not.
func TestCLIStageLocksAfterFailedLockStep(t *testing.T) {
	d, cli := newHost(t, testbootc.Knobs{Generation: testbootc.Gen1_16})
	caps := probe(t, cli)
	ctx := context.Background()
	if err := cli.Stage(ctx, mustPinned(t, targetRef), caps, StageOptions{}); err != nil {
		t.Fatal(err)
	}
	// Unlock it as a crashed sequence would leave it, then stage again:
	// switch says the spec is unchanged, and the lock step locks it.
	if err := cli.ApplyStaged(ctx, NoSoftReboot); err != nil {
		t.Fatal(err)
	}
	if err := cli.Stage(ctx, mustPinned(t, targetRef), caps, StageOptions{}); err != nil {
		t.Fatalf("Stage over the unlocked image: %v", err)
	}
	s, err := testbootcStatus(d)
	if err != nil {
		t.Fatal(err)
	}
	if s.Staged == nil || !s.Staged.DownloadOnly {
		t.Fatalf("staged %+v, want locked", s.Staged)
	}
}

// With a soft-reboot mode the unlock also prepares the soft reboot, which
// only then enters the staged deployment (testbootc models bootc and ostree).
func TestCLIApplyStagedSoftReboot(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mode     SoftReboot
		capable  bool
		wantArgs []string
		wantErr  error
		wantBoot string // booted digest after a soft reboot
	}{
		{"auto prepares a capable deployment", SoftRebootAuto, true, []string{"upgrade", "--from-downloaded", "--soft-reboot=auto"}, nil, d16dc},
		{"auto on an incapable deployment prepares nothing", SoftRebootAuto, false, []string{"upgrade", "--from-downloaded", "--soft-reboot=auto"}, nil, d736b},
		{"required on an incapable deployment fails", SoftRebootRequired, false, []string{"upgrade", "--from-downloaded", "--soft-reboot=required"}, ErrFailed, d736b},
		{"no mode prepares nothing", NoSoftReboot, true, []string{"upgrade", "--from-downloaded"}, nil, d736b},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, cli := newHost(t, testbootc.Knobs{SoftRebootCapable: tc.capable})
			ctx := context.Background()
			if err := cli.Stage(ctx, mustPinned(t, targetRef), probe(t, cli), StageOptions{}); err != nil {
				t.Fatal(err)
			}
			err := cli.ApplyStaged(ctx, tc.mode)
			if (tc.wantErr == nil && err != nil) || !errors.Is(err, tc.wantErr) {
				t.Fatalf("ApplyStaged(%q) = %v, want %v", tc.mode, err, tc.wantErr)
			}
			if got := invocations(t, d); !reflect.DeepEqual(got[len(got)-1], tc.wantArgs) {
				t.Errorf("bootc ran %q, want %q", got[len(got)-1], tc.wantArgs)
			}
			if err := d.Update(func(m *testbootc.Machine) error { m.SoftReboot(testbootc.RebootOptions{}); return nil }); err != nil {
				t.Fatal(err)
			}
			s, err := cli.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if s.Booted == nil || s.Booted.Digest != tc.wantBoot {
				t.Fatalf("after a soft reboot booted %+v, want %s", s.Booted, tc.wantBoot)
			}
		})
	}
	_, cli := newHost(t, testbootc.Knobs{})
	if err := cli.ApplyStaged(context.Background(), "sometimes"); !errors.Is(err, ErrInvalidSoftReboot) {
		t.Fatalf("ApplyStaged with an unknown mode = %v, want ErrInvalidSoftReboot", err)
	}
}

func TestCLISwitchRejectsUnvalidatedImage(t *testing.T) {
	tests := []struct {
		name string
		img  imageref.Pinned
	}{
		{"zero value", imageref.Pinned{}},
		{"shell metacharacters", imageref.Pinned{Repository: "quay.io/a; touch /tmp/x", Digest: d16dc}},
		{"option injection", imageref.Pinned{Repository: "--apply", Digest: d16dc}},
		{"tag in repository", imageref.Pinned{Repository: "quay.io/a:1", Digest: d16dc}},
		{"digest not sha256", imageref.Pinned{Repository: "quay.io/a", Digest: "md5:abc"}},
	}
	d, cli := newHost(t, testbootc.Knobs{})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := cli.Stage(context.Background(), tc.img, Capabilities{UpgradeDownloadOnly: true, SwitchDownloadOnly: true}, StageOptions{})
			if !errors.Is(err, ErrInvalidImage) {
				t.Fatalf("Stage(%q) = %v, want ErrInvalidImage", tc.img.String(), err)
			}
		})
	}
	if got := invocations(t, d); len(got) != 0 {
		t.Errorf("bootc ran %q for invalid images", got)
	}
}

func TestCLIFailureKeepsStderrTail(t *testing.T) {
	long := strings.Repeat("x", 10<<10) + "\nerror: Switching: pulling image: 500 Internal Server Error\n"
	tests := []struct {
		name     string
		failure  testbootc.Failure
		wantCode int
		wantTail string
	}{
		{"short message", testbootc.Failure{ExitCode: 1, Stderr: "error: Switching: no space left on device\n"}, 1, "no space left on device"},
		{"custom exit code", testbootc.Failure{ExitCode: 42, Stderr: "error: boom\n"}, 42, "error: boom"},
		{"long stderr keeps the end", testbootc.Failure{ExitCode: 1, Stderr: long}, 1, "500 Internal Server Error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.failure
			_, cli := newHost(t, testbootc.Knobs{SwitchFailure: &f})
			err := cli.Stage(context.Background(), mustPinned(t, targetRef), probe(t, cli), StageOptions{})
			if !errors.Is(err, ErrFailed) {
				t.Fatalf("Stage = %v, want ErrFailed", err)
			}
			var ce *CommandError
			if !errors.As(err, &ce) {
				t.Fatalf("error %T is not a *CommandError", err)
			}
			if ce.ExitCode != tc.wantCode {
				t.Errorf("ExitCode = %d, want %d", ce.ExitCode, tc.wantCode)
			}
			if len(ce.Stderr) > stderrTail {
				t.Errorf("kept %d bytes of stderr, want at most %d", len(ce.Stderr), stderrTail)
			}
			if !strings.Contains(ce.Stderr, tc.wantTail) || !strings.Contains(err.Error(), tc.wantTail) {
				t.Errorf("error %q lacks %q", err, tc.wantTail)
			}
		})
	}
}

func TestCLIStatusErrors(t *testing.T) {
	t.Run("bootc missing", func(t *testing.T) {
		cli := &CLI{Path: filepath.Join(t.TempDir(), "no-bootc")}
		if _, err := cli.Status(context.Background()); !errors.Is(err, ErrStart) {
			t.Fatalf("Status = %v, want ErrStart", err)
		}
	})
	t.Run("output is not a status document", func(t *testing.T) {
		cli := &CLI{Path: "echo"}
		if _, err := cli.Status(context.Background()); !errors.Is(err, ErrMalformed) {
			t.Fatalf("Status = %v, want ErrMalformed", err)
		}
	})
	t.Run("status fails", func(t *testing.T) {
		_, cli := newHost(t, testbootc.Knobs{StatusFailure: &testbootc.Failure{ExitCode: 1, Stderr: "error: Opening sysroot: busy\n"}})
		_, err := cli.Status(context.Background())
		if !errors.Is(err, ErrFailed) || !strings.Contains(err.Error(), "Opening sysroot") {
			t.Fatalf("Status = %v, want ErrFailed with stderr", err)
		}
	})
	t.Run("context already done", func(t *testing.T) {
		d, cli := newHost(t, testbootc.Knobs{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := cli.Status(ctx)
		if !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Status = %v, want ErrCanceled wrapping context.Canceled", err)
		}
		if got := invocations(t, d); len(got) != 0 {
			t.Errorf("bootc ran %q after cancel", got)
		}
	})
}

func TestCLICancelHangingSwitch(t *testing.T) {
	tests := []struct {
		name       string
		ignoreTERM bool
		grace      time.Duration
	}{
		// A long grace: only SIGTERM can end the command before the test times out.
		{"SIGTERM ends the process group", false, time.Hour},
		// bootc ignores SIGTERM: SIGKILL after the grace ends it.
		{"SIGKILL after grace", true, 200 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, cli := newHost(t, testbootc.Knobs{SwitchHang: true, HangIgnoreTERM: tc.ignoreTERM})
			cli.Grace = tc.grace
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			caps := probe(t, cli)
			go func() { errc <- cli.Stage(ctx, mustPinned(t, targetRef), caps, StageOptions{}) }()

			pids := waitHangPIDs(t, d)
			if len(pids) != 2 {
				t.Fatalf("hanging switch recorded pids %v, want itself and a child", pids)
			}
			for _, pid := range pids {
				if processGone(pid) {
					t.Fatalf("pid %d gone before cancel", pid)
				}
			}
			cancel()
			err := <-errc
			if !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) {
				t.Fatalf("Stage = %v, want ErrCanceled wrapping context.Canceled", err)
			}
			for _, pid := range pids {
				waitGone(t, pid)
			}
			sigs, err := d.Signals()
			if err != nil {
				t.Fatal(err)
			}
			if len(sigs) == 0 || sigs[0] != "terminated" {
				t.Errorf("bootc received signals %q, want SIGTERM first", sigs)
			}
			s, err := testbootcStatus(d)
			if err != nil {
				t.Fatal(err)
			}
			if s.Staged != nil {
				t.Errorf("a canceled switch staged %+v", s.Staged)
			}
		})
	}
}

func testbootcStatus(d testbootc.Dir) (Status, error) {
	m, err := d.Machine()
	if err != nil {
		return Status{}, err
	}
	return Parse(m.Status())
}

// waitHangPIDs waits until the hanging switch has written its pids.
func waitHangPIDs(t *testing.T, d testbootc.Dir) []int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if pids, err := d.HangPIDs(); err == nil && len(pids) > 0 {
			return pids
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("switch never started hanging")
	return nil
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still running after cancel", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// processGone reports whether pid no longer runs: no such process, or a
// zombie nobody reaped yet (it has exited).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	// Field 3, after "(comm)", is the state.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z' || s[i+2] == 'X'
	}
	return false
}
