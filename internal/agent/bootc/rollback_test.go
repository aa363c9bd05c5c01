package bootc

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
)

const otherRef = "quay.io/example/os@" + d47e5

// newUpgradedHost is a test bootc of knobs booted on targetRef with
// bootedRef as its rollback (it staged targetRef, unlocked it and rebooted),
// and a CLI over it.
func newUpgradedHost(t *testing.T, knobs testbootc.Knobs) (testbootc.Dir, *CLI) {
	t.Helper()
	m, err := testbootc.NewBooted(bootedRef)
	if err != nil {
		t.Fatal(err)
	}
	m.Configure(func(k *testbootc.Knobs) { *k = knobs })
	if err := m.Switch(targetRef); err != nil {
		t.Fatal(err)
	}
	if err := m.Apply(); err != nil {
		t.Fatal(err)
	}
	m.Reboot(testbootc.RebootOptions{})
	d, err := testbootc.Init(t.TempDir(), m.State())
	if err != nil {
		t.Fatal(err)
	}
	path, env := testbootc.SelfExec(d)
	return d, &CLI{Path: path, Env: env}
}

func softReboot(t *testing.T, d testbootc.Dir) {
	t.Helper()
	if err := d.Update(func(m *testbootc.Machine) error { m.SoftReboot(testbootc.RebootOptions{}); return nil }); err != nil {
		t.Fatal(err)
	}
}

// Rollback against the test bootc of every generation: what it runs, what
// it reports, and what the next (soft) reboot boots.
func TestCLIRollback(t *testing.T) {
	status := []string{"status", "--format=json"}
	tests := []struct {
		name     string
		capable  bool
		before   func(t *testing.T, d testbootc.Dir) // on the upgraded host
		mode     SoftReboot
		want     RollbackResult
		wantRuns [][]string
		soft     bool   // the reboot after it is a soft reboot
		wantBoot string // booted digest after it
	}{
		{name: "queues the rollback; the reboot boots it",
			want: RollbackResult{}, wantRuns: [][]string{status, {"rollback"}, status}, wantBoot: d736b},
		{name: "a staged deployment is discarded",
			before: func(t *testing.T, d testbootc.Dir) {
				if err := d.Update(func(m *testbootc.Machine) error { return m.Switch(otherRef) }); err != nil {
					t.Fatal(err)
				}
			},
			wantRuns: [][]string{status, {"rollback"}, status}, wantBoot: d736b},
		{name: "auto on a capable rollback prepares the soft reboot, which enters it", capable: true, mode: SoftRebootAuto,
			want: RollbackResult{SoftRebootPrepared: true}, wantRuns: [][]string{status, {"rollback", "--soft-reboot=auto"}, status}, soft: true, wantBoot: d736b},
		{name: "auto on an incapable rollback prepares nothing: a soft reboot stays", mode: SoftRebootAuto,
			want: RollbackResult{}, wantRuns: [][]string{status, {"rollback", "--soft-reboot=auto"}, status}, soft: true, wantBoot: d16dc},
		{name: "no mode on a capable rollback prepares nothing", capable: true,
			want: RollbackResult{}, wantRuns: [][]string{status, {"rollback"}, status}, soft: true, wantBoot: d16dc},
		{name: "already queued: nothing runs, so nothing reverts",
			before: func(t *testing.T, d testbootc.Dir) {
				if err := d.Update(func(m *testbootc.Machine) error { _, err := m.Rollback(""); return err }); err != nil {
					t.Fatal(err)
				}
			},
			want: RollbackResult{AlreadyQueued: true}, wantRuns: [][]string{status}, wantBoot: d736b},
	}
	for _, gen := range []testbootc.Generation{testbootc.Gen1_11, testbootc.Gen1_16, testbootc.GenSwitchDownloadOnly} {
		for _, tc := range tests {
			t.Run(string(gen)+"/"+tc.name, func(t *testing.T) {
				d, cli := newUpgradedHost(t, testbootc.Knobs{Generation: gen, SoftRebootCapable: tc.capable})
				if tc.before != nil {
					tc.before(t, d)
				}
				got, err := cli.Rollback(context.Background(), mustPinned(t, bootedRef), tc.mode)
				if err != nil || got != tc.want {
					t.Fatalf("Rollback = %+v, %v; want %+v", got, err, tc.want)
				}
				if runs := invocations(t, d); !reflect.DeepEqual(runs, tc.wantRuns) {
					t.Errorf("bootc ran %q, want %q", runs, tc.wantRuns)
				}
				s, err := testbootcStatus(d)
				if err != nil {
					t.Fatal(err)
				}
				if !s.RollbackQueued || s.Staged != nil || s.Rollback.Digest != d736b || s.Booted.Digest != d16dc {
					t.Fatalf("after Rollback: queued %v, booted %+v, rollback %+v, staged %+v", s.RollbackQueued, s.Booted, s.Rollback, s.Staged)
				}
				if tc.soft {
					softReboot(t, d)
				} else if _, err := d.Reboot(testbootc.RebootOptions{}); err != nil {
					t.Fatal(err)
				}
				if s, err = testbootcStatus(d); err != nil || s.Booted.Digest != tc.wantBoot {
					t.Fatalf("after the reboot booted %+v (%v), want %s", s.Booted, err, tc.wantBoot)
				}
			})
		}
	}
}

// Rollback refuses what it must not do, and says why: nothing runs but the
// status read, or bootc's refusal is classified.
func TestCLIRollbackRefuses(t *testing.T) {
	ctx := context.Background()
	t.Run("no rollback deployment", func(t *testing.T) {
		d, cli := newHost(t, testbootc.Knobs{})
		_, err := cli.Rollback(ctx, mustPinned(t, bootedRef), NoSoftReboot)
		if !errors.Is(err, ErrNoRollback) || !strings.Contains(err.Error(), "no rollback deployment") {
			t.Fatalf("Rollback = %v, want ErrNoRollback", err)
		}
		if runs := invocations(t, d); !reflect.DeepEqual(runs, [][]string{{"status", "--format=json"}}) {
			t.Errorf("bootc ran %q", runs)
		}
	})
	t.Run("bootc's own refusal is classified", func(t *testing.T) {
		_, cli := newHost(t, testbootc.Knobs{})
		_, err := cli.run(ctx, "rollback")
		var ce *CommandError
		if !errors.As(err, &ce) || ce.ExitCode != 1 || !errors.Is(err, ErrNoRollback) || FailureMessage(err) != "Rollback: Rollback (ostree): No rollback available" {
			t.Fatalf("bootc rollback with no rollback = %v, want exit 1 classed ErrNoRollback", err)
		}
	})
	t.Run("the rollback deployment is another image", func(t *testing.T) {
		d, cli := newUpgradedHost(t, testbootc.Knobs{})
		_, err := cli.Rollback(ctx, mustPinned(t, otherRef), NoSoftReboot)
		if !errors.Is(err, ErrRollbackMismatch) || !strings.Contains(err.Error(), bootedRef) {
			t.Fatalf("Rollback = %v, want ErrRollbackMismatch naming %s", err, bootedRef)
		}
		if runs := invocations(t, d); len(runs) != 1 {
			t.Errorf("bootc ran %q", runs)
		}
	})
	t.Run("required on an incapable rollback: queued, failed, then found queued", func(t *testing.T) {
		d, cli := newUpgradedHost(t, testbootc.Knobs{})
		_, err := cli.Rollback(ctx, mustPinned(t, bootedRef), SoftRebootRequired)
		if !errors.Is(err, ErrFailed) || !errors.Is(err, ErrSoftRebootNotCapable) {
			t.Fatalf("Rollback(required) = %v, want ErrFailed classed ErrSoftRebootNotCapable", err)
		}
		got, err := cli.Rollback(ctx, mustPinned(t, bootedRef), SoftRebootRequired)
		if err != nil || got != (RollbackResult{AlreadyQueued: true}) {
			t.Fatalf("second Rollback = %+v, %v; want AlreadyQueued", got, err)
		}
		var rollbacks int
		for _, r := range invocations(t, d) {
			if r[0] == "rollback" {
				rollbacks++
			}
		}
		if s, err := testbootcStatus(d); err != nil || !s.RollbackQueued || rollbacks != 1 {
			t.Fatalf("queued %v (%v) after %d bootc rollbacks, want queued after one", s.RollbackQueued, err, rollbacks)
		}
	})
	t.Run("bootc fails", func(t *testing.T) {
		_, cli := newUpgradedHost(t, testbootc.Knobs{RollbackFailure: &testbootc.Failure{ExitCode: 1, Stderr: "error: Rollback: Opening sysroot: busy\n"}})
		_, err := cli.Rollback(ctx, mustPinned(t, bootedRef), NoSoftReboot)
		if !errors.Is(err, ErrFailed) || errors.Is(err, ErrNoRollback) {
			t.Fatalf("Rollback = %v, want ErrFailed of no rollback class", err)
		}
	})
	t.Run("nothing unvalidated reaches the command line", func(t *testing.T) {
		d, cli := newUpgradedHost(t, testbootc.Knobs{})
		if _, err := cli.Rollback(ctx, mustPinned(t, bootedRef), "--apply"); !errors.Is(err, ErrInvalidSoftReboot) {
			t.Fatalf("Rollback with mode --apply = %v, want ErrInvalidSoftReboot", err)
		}
		bad := mustPinned(t, bootedRef)
		bad.Repository = "quay.io/a; reboot"
		if _, err := cli.Rollback(ctx, bad, NoSoftReboot); !errors.Is(err, ErrInvalidImage) {
			t.Fatalf("Rollback to %q = %v, want ErrInvalidImage", bad.String(), err)
		}
		if runs := invocations(t, d); len(runs) != 0 {
			t.Errorf("bootc ran %q", runs)
		}
	})
}

// Rollback waits for the sysroot lock a pull holds, as every bootc command
// does, and ends when ctx does; once the pull is gone it runs.
func TestCLIRollbackWaitsForTheSysrootLock(t *testing.T) {
	d, cli := newUpgradedHost(t, testbootc.Knobs{SwitchHang: true})
	pullCtx, stopPull := context.WithCancel(context.Background())
	defer stopPull()
	pulled := make(chan error, 1)
	go func() { _, err := cli.run(pullCtx, "switch", otherRef); pulled <- err }()
	waitHangPIDs(t, d) // the switch holds the lock from before it hangs
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := cli.Rollback(ctx, mustPinned(t, bootedRef), NoSoftReboot)
	cancel()
	if !errors.Is(err, ErrCanceled) {
		t.Fatalf("Rollback behind the pull = %v, want ErrCanceled", err)
	}
	stopPull()
	if err := <-pulled; !errors.Is(err, ErrCanceled) {
		t.Fatalf("pull = %v", err)
	}
	got, err := cli.Rollback(context.Background(), mustPinned(t, bootedRef), NoSoftReboot)
	if err != nil || got != (RollbackResult{}) {
		t.Fatalf("Rollback after the pull = %+v, %v", got, err)
	}
}
