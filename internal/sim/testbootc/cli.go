package testbootc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"
)

// Exit codes as bootc uses them.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed (bootc-utils run_main)
	exitUsage = 2 // clap refused the command line
)

const usage = `Deploy and transactionally in-place with bootable container images

Usage: bootc <COMMAND>

Commands:
  upgrade   Download and queue an updated container image to apply
  switch    Target a new container image reference to boot
  rollback  ` + rollbackAbout + `
  status    Display status

Simulation only (test-bootc):
  sim-init --booted <REF>                     Start a fresh state booted on REF
  sim-reboot [--stale=DUR|--stale-until-settle]
  sim-soft-reboot [--stale=DUR|--stale-until-settle]
  settle                                      End a stale status window

Options:
  -h, --help     Print help
  -V, --version  Print version
`

var simulationOnly = map[string]bool{"sim-init": true, "sim-reboot": true, "sim-soft-reboot": true, "settle": true}

// Store is where Exec finds the machine: a state directory (Dir, for the
// executable) or memory (Mem, for in-process harnesses).
type Store interface {
	// Update runs fn on the machine and keeps what it did.
	Update(fn func(*Machine) error) error
	// LockSysroot takes ostree's sysroot lock, waiting for it (as
	// ostree_sysroot_lock does) until ctx ends.
	LockSysroot(ctx context.Context) (unlock func(), err error)
}

// Main runs the test-bootc executable with args (argv without argv[0])
// against the state directory named by $BOOTC_TEST_STATE, and returns the
// exit code. SIGTERM or SIGINT ends a pull in progress.
func Main(args []string, stdout, stderr io.Writer) int {
	dir := os.Getenv(EnvState)
	if dir == "" {
		fmt.Fprintf(stderr, "error: test-bootc: %s is not set\n", EnvState)
		return exitError
	}
	d := Dir(dir)
	// Record bootc commands only: the log is what the agent ran, not what
	// the harness played (sim-*, settle).
	if len(args) == 0 || !simulationOnly[args[0]] {
		if err := d.record(args); err != nil {
			fmt.Fprintf(stderr, "error: test-bootc: recording invocation: %v\n", err)
			return exitError
		}
	}
	if len(args) > 0 && args[0] == "sim-init" {
		return simInit(d, args[1:], stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return Exec(ctx, d, args, stdout, stderr)
}

// Exec runs bootc's command line over st. Ending ctx is the signal that
// ends a pull in progress.
func Exec(ctx context.Context, st Store, args []string, stdout, stderr io.Writer) int {
	gen, err := generationOf(st)
	if err != nil {
		return result(stderr, err)
	}
	if len(args) == 0 {
		fmt.Fprintf(stderr, "error: 'bootc' requires a subcommand but one was not provided\n\n%s", usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case "-V", "--version":
		// clap's `version` attribute (crates/lib/src/cli.rs, Opt).
		fmt.Fprintf(stdout, "bootc %s\n", gen.version)
		return exitOK
	case "status":
		return status(ctx, st, rest, stdout, stderr)
	case "switch":
		return switchCmd(ctx, st, gen, rest, stdout, stderr)
	case "upgrade":
		return upgrade(ctx, st, gen, rest, stdout, stderr)
	case "rollback":
		return rollbackCmd(ctx, st, gen, rest, stdout, stderr)
	case "sim-reboot", "sim-soft-reboot":
		return simReboot(st, cmd == "sim-soft-reboot", rest, stdout, stderr)
	case "settle":
		if len(rest) > 0 {
			return usageFail(stderr, unexpectedArg(rest[0], "bootc settle"))
		}
		return result(stderr, st.Update(func(m *Machine) error { m.Settle(); return nil }))
	}
	fmt.Fprintf(stderr, "error: unrecognized subcommand '%s'\n\n%s", cmd, usage)
	return exitUsage
}

func generationOf(st Store) (generationSpec, error) {
	var g Generation
	if err := st.Update(func(m *Machine) error { g = m.State().Knobs.Generation; return nil }); err != nil {
		return generationSpec{}, err
	}
	return g.spec()
}

func knobsOf(st Store) (Knobs, error) {
	var k Knobs
	err := st.Update(func(m *Machine) error { k = m.State().Knobs; return nil })
	return k, err
}

func usageFail(stderr io.Writer, e *usageError) int {
	io.WriteString(stderr, e.msg)
	return exitUsage
}

// result prints err as bootc's run_main does ("error: <context>: <cause>")
// and returns its exit code.
func result(stderr io.Writer, err error) int {
	if err == nil {
		return exitOK
	}
	var fe *FailureError
	if errors.As(err, &fe) {
		io.WriteString(stderr, fe.Failure.Stderr)
		if fe.Failure.ExitCode == 0 {
			return exitError
		}
		return fe.Failure.ExitCode
	}
	if errors.Is(err, context.Canceled) {
		// bootc has no SIGTERM handler: it dies of the signal.
		return 128 + int(syscall.SIGTERM)
	}
	fmt.Fprintf(stderr, "error: %v\n", err)
	return exitError
}

// status is `bootc status`. It opens the booted storage, which takes the
// sysroot lock and waits while another bootc holds it for a pull
// (crates/lib/src/status.rs: BootedStorage::new; store/mod.rs:
// SysrootLock::new_from_sysroot; ostree-ext sysroot.rs; bootc issue #585).
func status(ctx context.Context, st Store, args []string, stdout, stderr io.Writer) int {
	format := "yaml" // bootc prints YAML when stdout is not a terminal
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--json":
			format = "json"
		case a == "--format" && i+1 < len(args):
			i++
			format = args[i]
		case strings.HasPrefix(a, "--format="):
			format = strings.TrimPrefix(a, "--format=")
		case a == "--format-version=0" || a == "--format-version=1":
		default:
			return usageFail(stderr, unexpectedArg(a, "bootc status [OPTIONS]"))
		}
	}
	if format != "json" && format != "yaml" {
		fmt.Fprintf(stderr, "error: invalid value '%s' for '--format <FORMAT>'\n  [possible values: humanreadable, yaml, json]\n\nFor more information, try '--help'.\n", format)
		return exitUsage
	}
	unlock, err := st.LockSysroot(ctx)
	if err != nil {
		return result(stderr, err)
	}
	defer unlock()
	var doc []byte
	err = st.Update(func(m *Machine) error {
		if err := m.StatusError(); err != nil {
			return err
		}
		doc = m.Status()
		return nil
	})
	if err != nil {
		return result(stderr, err)
	}
	if format == "yaml" {
		y, err := yaml.JSONToYAML(doc)
		if err != nil {
			return result(stderr, err)
		}
		doc = y
	} else {
		doc = append(doc, '\n')
	}
	stdout.Write(doc)
	return exitOK
}

const switchUsage = "bootc switch [OPTIONS] <TARGET>"

// switchCmd is `bootc switch` (crates/lib/src/cli.rs: SwitchOpts, switch,
// switch_ostree): take the sysroot lock, compare specs, pull, stage. Without
// --download-only (which only GenSwitchDownloadOnly has) the staged
// deployment is unlocked: the next shutdown applies it.
func switchCmd(ctx context.Context, st Store, gen generationSpec, args []string, stdout, stderr io.Writer) int {
	f, uerr := gen.parseFlags("switch", switchUsage, args)
	if uerr != nil {
		return usageFail(stderr, uerr)
	}
	if f.set["--help"] {
		fmt.Fprint(stdout, gen.help("switch", "Target a new container image reference to boot", switchUsage))
		return exitOK
	}
	if len(f.positional) == 0 {
		fmt.Fprintf(stderr, "error: the following required arguments were not provided:\n  <TARGET>\n\nUsage: %s\n\nFor more information, try '--help'.\n", switchUsage)
		return exitUsage
	}
	if len(f.positional) > 1 {
		return usageFail(stderr, unexpectedArg(f.positional[1], switchUsage))
	}
	target := f.positional[0]
	if unsupportedSwitch(f, stderr) {
		return exitError
	}
	locked := f.set["--download-only"]
	unlock, err := st.LockSysroot(ctx)
	if err != nil {
		return result(stderr, err)
	}
	defer unlock()
	p, err := ParseSwitchRef(target)
	if err != nil {
		return result(stderr, err)
	}
	// The signature source is part of the spec (crates/lib/src/utils.rs,
	// sigpolicy_from_opt).
	sig := ""
	if f.set["--enforce-container-sigpolicy"] {
		sig = SigContainerPolicy
	}
	var unchanged bool
	if err := st.Update(func(m *Machine) error {
		unchanged = m.Spec() == p.String() && m.SpecSignature() == sig
		return nil
	}); err != nil {
		return result(stderr, err)
	}
	if unchanged {
		fmt.Fprintln(stdout, MsgSpecUnchanged)
		return exitOK
	}
	if code, done := pull(ctx, st, stderr); done {
		return code
	}
	fetched, err := fetchIfPulling(ctx, st, pullTarget{ref: p, sig: sig})
	if err != nil {
		return result(stderr, fmt.Errorf("Switching: Switching (ostree): %w", err))
	}
	var changed bool
	if err := st.Update(func(m *Machine) error { changed, err = m.SwitchFetched(p.String(), sig, locked, fetched); return err }); err != nil {
		return result(stderr, fmt.Errorf("Switching: Switching (ostree): %w", err))
	}
	if !changed { // the spec changed under us: another switch won the lock first
		fmt.Fprintln(stdout, MsgSpecUnchanged)
		return exitOK
	}
	fmt.Fprintf(stdout, "Queued for next boot: %s\n", p)
	if locked {
		fmt.Fprintln(stdout, msgSwitchDownloadOnly)
	}
	return exitOK
}

// unsupportedSwitch refuses the switch modes a booted host cannot run or
// the simulation does not play, and says whether it did.
func unsupportedSwitch(f parsedFlags, stderr io.Writer) bool {
	switch {
	case f.set["--mutate-in-place"]:
		// switch_origin_inplace (crates/lib/src/deploy.rs) writes the origin
		// of the newest deployment under /sysroot without the private mount
		// namespace get_storage sets up; on a booted host /sysroot is
		// mounted read-only.
		fmt.Fprint(stderr, "error: Switching: Writing origin: Read-only file system (os error 30)\n")
		return true
	case f.set["--apply"]:
		fmt.Fprint(stderr, "error: test-bootc: --apply is not simulated (reboot through logind)\n")
		return true
	}
	return false
}

const upgradeUsage = "bootc upgrade [OPTIONS]"

// upgrade is `bootc upgrade` (crates/lib/src/cli.rs: UpgradeOpts, upgrade).
func upgrade(ctx context.Context, st Store, gen generationSpec, args []string, stdout, stderr io.Writer) int {
	f, uerr := gen.parseFlags("upgrade", upgradeUsage, args)
	if uerr != nil {
		return usageFail(stderr, uerr)
	}
	if f.set["--help"] {
		fmt.Fprint(stdout, gen.help("upgrade", "Download and queue an updated container image to apply", upgradeUsage))
		return exitOK
	}
	if len(f.positional) > 0 {
		return usageFail(stderr, unexpectedArg(f.positional[0], upgradeUsage))
	}
	for _, c := range [][2]string{{"--download-only", "--from-downloaded"}, {"--download-only", "--apply"}, {"--from-downloaded", "--check"}, {"--download-only", "--check"}} {
		if f.set[c[0]] && f.set[c[1]] {
			fmt.Fprintf(stderr, "error: the argument '%s' cannot be used with '%s'\n\nUsage: %s\n\nFor more information, try '--help'.\n", c[0], c[1], upgradeUsage)
			return exitUsage
		}
	}
	if f.set["--apply"] || f.set["--check"] || !f.set["--download-only"] && !f.set["--from-downloaded"] {
		fmt.Fprint(stderr, "error: test-bootc: only upgrade --download-only and --from-downloaded are simulated\n")
		return exitError
	}
	unlock, err := st.LockSysroot(ctx)
	if err != nil {
		return result(stderr, err)
	}
	defer unlock()
	var line string
	if f.set["--from-downloaded"] {
		var prepared bool
		err = st.Update(func(m *Machine) error {
			before := m.State().Staged
			line, err = m.ApplyStaged(SoftRebootMode(f.softReboot))
			prepared = f.softReboot != "" && before != nil && m.State().NextRoot == before.Digest
			return err
		})
		if errors.Is(err, ErrSoftRebootNotCapable) {
			// bootc unlocks before it looks at --soft-reboot.
			fmt.Fprintln(stdout, line)
			return result(stderr, err)
		}
		if prepared {
			line += "\nStaged deployment is soft-reboot capable, preparing for soft-reboot..."
		}
	} else {
		var code int
		var done bool
		if line, code, done, err = downloadUpgrade(ctx, st, stderr); done {
			return code
		}
	}
	if err != nil {
		var fe *FailureError
		if errors.As(err, &fe) {
			return result(stderr, err)
		}
		return result(stderr, fmt.Errorf("Upgrading: %w", err))
	}
	if line != "" {
		fmt.Fprintln(stdout, line)
	}
	return exitOK
}

// downloadUpgrade is `bootc upgrade --download-only` under the sysroot
// lock: pull the spec's image when it needs fetching and stage it locked.
// done: the command ends now with code.
func downloadUpgrade(ctx context.Context, st Store, stderr io.Writer) (line string, code int, done bool, err error) {
	var fetch bool
	var target pullTarget
	if err := st.Update(func(m *Machine) error {
		fetch = m.needsFetch()
		target.ref, _ = ParseSwitchRef(m.Spec())
		target.sig = m.SpecSignature()
		return nil
	}); err != nil {
		return "", result(stderr, err), true, nil
	}
	if fetch {
		if code, done := pull(ctx, st, stderr); done {
			return "", code, true, nil
		}
	}
	var fetched string
	if target.ref.Digest != "" {
		if fetched, err = fetchIfPulling(ctx, st, target); err != nil {
			return "", result(stderr, fmt.Errorf("Upgrading: %w", err)), true, nil
		}
	}
	err = st.Update(func(m *Machine) error { line, err = m.UpgradeFetched(fetched); return err })
	return line, exitOK, false, err
}

// fetchIfPulling runs the registry side of a pull in pull mode and returns
// the manifest digest imported ("" when pull mode is off).
func fetchIfPulling(ctx context.Context, st Store, t pullTarget) (string, error) {
	k, err := knobsOf(st)
	if err != nil || !k.Pull {
		return "", err
	}
	root, err := rootOf(st, k)
	if err != nil {
		return "", err
	}
	var images map[string]string
	if err := st.Update(func(m *Machine) error { images = m.State().Images; return nil }); err != nil {
		return "", err
	}
	d, err := fetchImage(ctx, root, t, images)
	if err != nil {
		return "", err
	}
	return d, st.Update(func(m *Machine) error { m.RecordPulled(t.ref.String(), d); return nil })
}

// pull plays the image download: it waits SwitchDelay (or forever with
// SwitchHang) while the caller holds the sysroot lock. done reports that the
// command ends here with code (cancelled or hung).
func pull(ctx context.Context, st Store, stderr io.Writer) (code int, done bool) {
	k, err := knobsOf(st)
	if err != nil {
		return result(stderr, err), true
	}
	if k.SwitchHang {
		if d, ok := st.(Dir); ok {
			return hang(d, k.HangIgnoreTERM, stderr), true
		}
		<-ctx.Done()
		return result(stderr, ctx.Err()), true
	}
	if k.SwitchDelay <= 0 {
		return 0, false
	}
	t := time.NewTimer(time.Duration(k.SwitchDelay))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return result(stderr, ctx.Err()), true
	case <-t.C:
		return 0, false
	}
}

// hang plays a pull that never ends: it starts a child in its own process
// group (like bootc's ostree/skopeo helpers), records both pids, and waits
// to be killed.
func hang(d Dir, ignoreTERM bool, stderr io.Writer) int {
	pids := fmt.Sprint(os.Getpid())
	child := exec.Command("sleep", "3600")
	if err := child.Start(); err == nil {
		pids += fmt.Sprintf(" %d", child.Process.Pid)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM)
	if err := os.WriteFile(d.Path(HangPIDsFile), []byte(pids+"\n"), 0o644); err != nil {
		fmt.Fprintf(stderr, "error: test-bootc: %v\n", err)
		return exitError
	}
	fmt.Fprint(stderr, "Fetching layers...\n")
	for sig := range sigs {
		_ = appendLine(d.Path(SignalsFile), sig.String())
		if !ignoreTERM {
			fmt.Fprint(stderr, "error: interrupted\n")
			return 128 + int(syscall.SIGTERM)
		}
	}
	return exitError
}

func simInit(d Dir, args []string, stderr io.Writer) int {
	if len(args) != 2 || args[0] != "--booted" {
		fmt.Fprint(stderr, "error: usage: sim-init --booted <REPO@sha256:...>\n")
		return exitUsage
	}
	m, err := NewBooted(args[1])
	if err != nil {
		return result(stderr, err)
	}
	_, err = Init(string(d), m.State())
	return result(stderr, err)
}

func simReboot(st Store, soft bool, args []string, stdout, stderr io.Writer) int {
	var opts RebootOptions
	for _, a := range args {
		switch {
		case a == "--stale-until-settle":
			opts.StaleUntilSettle = true
		case strings.HasPrefix(a, "--stale="):
			v, err := time.ParseDuration(strings.TrimPrefix(a, "--stale="))
			if err != nil || v <= 0 {
				fmt.Fprintf(stderr, "error: invalid value '%s' for '--stale'\n", a)
				return exitUsage
			}
			opts.StaleFor = v
		default:
			return usageFail(stderr, unexpectedArg(a, "bootc sim-reboot"))
		}
	}
	err := st.Update(func(m *Machine) error {
		if soft {
			fmt.Fprintln(stdout, m.SoftReboot(opts))
		} else {
			fmt.Fprintln(stdout, m.Reboot(opts))
		}
		return nil
	})
	return result(stderr, err)
}
