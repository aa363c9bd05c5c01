package bootc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Errors returned by CLI methods wrap one of these.
var (
	// ErrCanceled: the context ended; the command's process group was
	// terminated (SIGTERM, then SIGKILL after Grace). The error also wraps ctx.Err().
	ErrCanceled = errors.New("bootc command canceled")
	// ErrFailed: bootc ran and exited non-zero or died of a signal.
	ErrFailed = errors.New("bootc command failed")
	// ErrStart: bootc could not be started (missing binary, permissions).
	ErrStart = errors.New("bootc command could not start")
	// ErrInvalidImage: the image given to Switch is not a digest-pinned reference.
	ErrInvalidImage = errors.New("invalid image for bootc switch")
	// ErrUnsupported: the installed bootc cannot do what was asked safely.
	ErrUnsupported = errors.New("bootc cannot do this")
	// ErrNotLocked: a stage ended without the granted image staged locked.
	ErrNotLocked = errors.New("the staged deployment is not the granted image, locked")
	// ErrInvalidSoftReboot: ApplyStaged got a SoftReboot mode bootc does not have.
	ErrInvalidSoftReboot = errors.New("invalid soft-reboot mode")
)

// SoftReboot is bootc's --soft-reboot mode (crates/lib/src/cli.rs,
// SoftRebootMode). With a mode, `bootc upgrade --from-downloaded` also
// prepares a soft reboot into the staged deployment when bootc says it is
// soft-reboot capable (ostree's deployment_set_soft_reboot, which sets up
// /run/nextroot); without one it prepares nothing, and a soft reboot would
// restart userspace on the old root.
type SoftReboot string

const (
	// NoSoftReboot prepares no soft reboot (a full reboot follows).
	NoSoftReboot SoftReboot = ""
	// SoftRebootAuto prepares one if the staged deployment is capable, and
	// silently nothing otherwise.
	SoftRebootAuto SoftReboot = "auto"
	// SoftRebootRequired fails ("Soft reboot was required but staged
	// deployment is not soft-reboot capable") if it is not capable, after
	// the deployment was unlocked.
	SoftRebootRequired SoftReboot = "required"
)

const (
	defaultPath  = "bootc"
	defaultGrace = 10 * time.Second
	// stderrTail bounds how much of bootc's stderr an error keeps.
	stderrTail = 4 << 10
	// maxStdout bounds status output; real documents are a few KiB.
	maxStdout = 4 << 20
)

// CLI runs the bootc binary. The zero value runs "bootc" from PATH.
type CLI struct {
	Path  string        // bootc binary (default "bootc")
	Grace time.Duration // SIGTERM -> SIGKILL grace on cancel (default 10s)
	Env   []string      // extra environment (tests)
	// Runner, when set, runs the command lines instead of a process (for
	// harnesses that run many hosts in one process).
	Runner Runner
}

// Runner runs one bootc command line, writing what bootc prints to stdout
// and stderr, and returns its exit code. Ending ctx must end the command.
type Runner interface {
	Run(ctx context.Context, args []string, stdout, stderr io.Writer) (exitCode int, err error)
}

// CommandError describes a bootc invocation that did not succeed. It wraps
// a sentinel (ErrCanceled, ErrFailed, ErrStart) and the underlying cause.
type CommandError struct {
	Args     []string // argv after the binary
	ExitCode int      // -1 when killed by a signal or not started
	Stderr   string   // last ~4 KiB of stderr
	Kind     error    // ErrCanceled, ErrFailed or ErrStart
	Cause    error
	// Class is what bootc's error line says the failure was
	// (ErrSignatureRejected, ErrRegistryUnauthorized; Classify), or nil.
	Class error
}

func (e *CommandError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "bootc %s: %v", strings.Join(e.Args, " "), e.Kind)
	if e.Cause != nil {
		fmt.Fprintf(&b, ": %v", e.Cause)
	}
	if s := strings.TrimSpace(e.Stderr); s != "" {
		fmt.Fprintf(&b, ": stderr: %s", s)
	}
	return b.String()
}

func (e *CommandError) Unwrap() []error {
	if e.Class != nil {
		return []error{e.Kind, e.Cause, e.Class}
	}
	return []error{e.Kind, e.Cause}
}

// Status runs `bootc status --format=json` and parses it.
func (c *CLI) Status(ctx context.Context) (Status, error) {
	out, err := c.run(ctx, "status", "--format=json")
	if err != nil {
		return Status{}, err
	}
	return Parse(out)
}

// ApplyStaged unlocks the staged deployment so the next reboot applies it:
// `bootc upgrade --from-downloaded`, plus `--soft-reboot=<mode>` unless mode
// is NoSoftReboot. It does not fetch anything.
func (c *CLI) ApplyStaged(ctx context.Context, mode SoftReboot) error {
	args := []string{"upgrade", "--from-downloaded"}
	switch mode {
	case NoSoftReboot:
	case SoftRebootAuto, SoftRebootRequired:
		args = append(args, "--soft-reboot="+string(mode))
	default:
		return fmt.Errorf("%w: %q", ErrInvalidSoftReboot, string(mode))
	}
	_, err := c.run(ctx, args...)
	return err
}

func (c *CLI) path() string {
	if c.Path == "" {
		return defaultPath
	}
	return c.Path
}

func (c *CLI) grace() time.Duration {
	if c.Grace <= 0 {
		return defaultGrace
	}
	return c.Grace
}

// run executes bootc in its own process group, so a cancel reaches the
// helpers bootc starts (ostree, skopeo, ...) and not only bootc itself.
func (c *CLI) run(ctx context.Context, args ...string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, &CommandError{Args: args, ExitCode: -1, Kind: ErrCanceled, Cause: err}
	}
	if c.Runner != nil {
		return c.runWith(ctx, args)
	}
	cmd := exec.Command(c.path(), args...)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout := &limitBuffer{max: maxStdout}
	stderr := &tailBuffer{max: stderrTail}
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	// Bounds the wait for output pipes held open by a leftover child.
	cmd.WaitDelay = c.grace()
	if err := cmd.Start(); err != nil {
		return nil, &CommandError{Args: args, ExitCode: -1, Kind: ErrStart, Cause: err}
	}
	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var waitErr error
	select {
	case waitErr = <-done:
	case <-ctx.Done():
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		t := time.NewTimer(c.grace())
		select {
		case <-done:
			t.Stop()
		case <-t.C:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-done
		}
		// bootc is gone; its helpers go with it.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		return nil, &CommandError{Args: args, ExitCode: -1, Stderr: stderr.String(), Kind: ErrCanceled, Cause: ctx.Err()}
	}
	if waitErr != nil {
		code := -1
		var ee *exec.ExitError
		if errors.As(waitErr, &ee) {
			code = ee.ExitCode()
		}
		return nil, &CommandError{Args: args, ExitCode: code, Stderr: stderr.String(), Kind: ErrFailed, Cause: waitErr, Class: Classify(stderr.String())}
	}
	if stdout.overflow {
		return nil, &CommandError{Args: args, ExitCode: 0, Stderr: stderr.String(), Kind: ErrFailed,
			Cause: fmt.Errorf("stdout larger than %d bytes", maxStdout)}
	}
	return stdout.Bytes(), nil
}

func (c *CLI) runWith(ctx context.Context, args []string) ([]byte, error) {
	stdout := &limitBuffer{max: maxStdout}
	stderr := &tailBuffer{max: stderrTail}
	code, err := c.Runner.Run(ctx, args, stdout, stderr)
	switch {
	case ctx.Err() != nil:
		return nil, &CommandError{Args: args, ExitCode: -1, Stderr: stderr.String(), Kind: ErrCanceled, Cause: ctx.Err()}
	case err != nil:
		return nil, &CommandError{Args: args, ExitCode: -1, Kind: ErrStart, Cause: err}
	case code != 0:
		return nil, &CommandError{Args: args, ExitCode: code, Stderr: stderr.String(), Kind: ErrFailed,
			Cause: fmt.Errorf("exit status %d", code), Class: Classify(stderr.String())}
	case stdout.overflow:
		return nil, &CommandError{Args: args, Stderr: stderr.String(), Kind: ErrFailed,
			Cause: fmt.Errorf("stdout larger than %d bytes", maxStdout)}
	}
	return stdout.Bytes(), nil
}

// limitBuffer keeps at most max bytes and remembers that it dropped some.
type limitBuffer struct {
	bytes.Buffer
	max      int
	overflow bool
}

func (b *limitBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.overflow = true
		if room > 0 {
			b.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	buf []byte
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= b.max {
		b.buf = append(b.buf[:0], p[len(p)-b.max:]...)
		return n, nil
	}
	if over := len(b.buf) + len(p) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	b.buf = append(b.buf, p...)
	return n, nil
}

func (b *tailBuffer) String() string { return string(b.buf) }
