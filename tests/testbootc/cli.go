package testbootc

import (
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

// Exit codes as bootc (clap) uses them.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed
	exitUsage = 2 // the command line was wrong
)

const usage = `Usage: bootc <COMMAND>

Commands (simulated):
  status    Display status (--format=json|yaml, --json)
  switch    Target a new container image reference (--download-only <TARGET>)
  upgrade   Apply a downloaded update (--from-downloaded [--soft-reboot=auto|required])

Simulation only:
  sim-init --booted <REF>                     Start a fresh state booted on REF
  sim-reboot [--stale=DUR|--stale-until-settle]
  sim-soft-reboot [--stale=DUR|--stale-until-settle]
  settle                                      End a stale status window

For more information, try '--help'.
`

var simulationOnly = map[string]bool{"sim-init": true, "sim-reboot": true, "sim-soft-reboot": true, "settle": true}

// Main runs the test-bootc command line with args (argv without argv[0])
// against the state directory named by $BOOTC_TEST_STATE, and returns the
// exit code.
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
	if len(args) == 0 {
		fmt.Fprintf(stderr, "error: 'bootc' requires a subcommand but one was not provided\n\n%s", usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	case "status":
		return status(d, rest, stdout, stderr)
	case "switch":
		return switchCmd(d, rest, stdout, stderr)
	case "upgrade":
		return upgrade(d, rest, stdout, stderr)
	case "sim-init":
		return simInit(d, rest, stderr)
	case "sim-reboot", "sim-soft-reboot":
		return simReboot(d, cmd == "sim-soft-reboot", rest, stdout, stderr)
	case "settle":
		if len(rest) > 0 {
			return unexpected(stderr, "settle", rest[0])
		}
		return result(stderr, d.Update(func(m *Machine) error { m.Settle(); return nil }))
	}
	fmt.Fprintf(stderr, "error: unrecognized subcommand '%s'\n\n%s", cmd, usage)
	return exitUsage
}

func unexpected(stderr io.Writer, cmd, arg string) int {
	fmt.Fprintf(stderr, "error: unexpected argument '%s' found\n\nUsage: bootc %s [OPTIONS]\n\nFor more information, try '--help'.\n", arg, cmd)
	return exitUsage
}

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
	fmt.Fprintf(stderr, "error: %v\n", err)
	return exitError
}

func status(d Dir, args []string, stdout, stderr io.Writer) int {
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
			return unexpected(stderr, "status", a)
		}
	}
	if format != "json" && format != "yaml" {
		fmt.Fprintf(stderr, "error: invalid value '%s' for '--format <FORMAT>'\n  [possible values: humanreadable, yaml, json]\n", format)
		return exitUsage
	}
	var doc []byte
	err := d.Update(func(m *Machine) error {
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

func switchCmd(d Dir, args []string, stdout, stderr io.Writer) int {
	var target string
	downloadOnly := false
	for _, a := range args {
		switch {
		case a == "--download-only":
			downloadOnly = true
		case a == "--quiet":
		case strings.HasPrefix(a, "-"):
			return unexpected(stderr, "switch", a)
		case target != "":
			return unexpected(stderr, "switch", a)
		default:
			target = a
		}
	}
	if target == "" {
		fmt.Fprint(stderr, "error: the following required arguments were not provided:\n  <TARGET>\n\nUsage: bootc switch <TARGET>\n\nFor more information, try '--help'.\n")
		return exitUsage
	}
	if !downloadOnly {
		fmt.Fprint(stderr, "error: test-bootc: only switch --download-only is simulated\n")
		return exitError
	}
	p, err := ParseSwitchRef(target)
	if err != nil {
		return result(stderr, err)
	}
	m, err := d.Machine()
	if err != nil {
		return result(stderr, err)
	}
	k := m.State().Knobs
	if k.SwitchHang {
		return hang(d, k.HangIgnoreTERM, stderr)
	}
	if k.SwitchDelay > 0 {
		time.Sleep(time.Duration(k.SwitchDelay))
	}
	if err := d.Update(func(m *Machine) error { return m.Switch(p.String()) }); err != nil {
		return result(stderr, err)
	}
	fmt.Fprintf(stdout, "Fetched %s\nImage downloaded; it will not be applied on reboot until `bootc upgrade --from-downloaded`.\n", p)
	return exitOK
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

// upgrade is `bootc upgrade --from-downloaded [--soft-reboot=auto|required]`
// with clap's parsing of the option (`--soft-reboot=auto` or
// `--soft-reboot auto`, values case-sensitive, at most once) and bootc's
// messages (crates/lib/src/cli.rs, upgrade() and soft_reboot_staged).
func upgrade(d Dir, args []string, stdout, stderr io.Writer) int {
	fromDownloaded := false
	var mode SoftRebootMode
	seenMode := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--from-downloaded":
			fromDownloaded = true
		case a == "--quiet":
		case a == "--soft-reboot" || strings.HasPrefix(a, "--soft-reboot="):
			v, hasValue := strings.CutPrefix(a, "--soft-reboot=")
			if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
				v, hasValue = args[i], true
			}
			if seenMode {
				fmt.Fprint(stderr, "error: the argument '--soft-reboot <SOFT_REBOOT>' cannot be used multiple times\n\nUsage: bootc upgrade [OPTIONS]\n\nFor more information, try '--help'.\n")
				return exitUsage
			}
			seenMode = true
			switch {
			case !hasValue || v == "":
				fmt.Fprint(stderr, "error: a value is required for '--soft-reboot <SOFT_REBOOT>' but none was supplied\n  [possible values: required, auto]\n\nFor more information, try '--help'.\n")
				return exitUsage
			case v != string(SoftRebootAuto) && v != string(SoftRebootRequired):
				fmt.Fprintf(stderr, "error: invalid value '%s' for '--soft-reboot <SOFT_REBOOT>'\n  [possible values: required, auto]\n\nFor more information, try '--help'.\n", v)
				return exitUsage
			}
			mode = SoftRebootMode(v)
		default:
			return unexpected(stderr, "upgrade", a)
		}
	}
	if !fromDownloaded {
		fmt.Fprint(stderr, "error: test-bootc: upgrade without --from-downloaded needs a registry\n")
		return exitError
	}
	var wasLocked, prepared bool
	err := d.Update(func(m *Machine) error {
		st := m.State()
		wasLocked = st.Staged != nil && st.Staged.DownloadOnly
		err := m.ApplySoft(mode)
		prepared = mode != "" && st.Staged != nil && m.State().NextRoot == st.Staged.Digest
		return err
	})
	if err == nil || errors.Is(err, ErrSoftRebootNotCapable) {
		// bootc unlocks before it looks at --soft-reboot.
		if wasLocked {
			fmt.Fprint(stdout, "Staged deployment will now be applied on reboot\n")
		} else {
			fmt.Fprint(stdout, "Staged deployment is already set to apply on reboot\n")
		}
	}
	if prepared {
		fmt.Fprint(stdout, "Staged deployment is soft-reboot capable, preparing for soft-reboot...\n")
	}
	return result(stderr, err)
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

func simReboot(d Dir, soft bool, args []string, stdout, stderr io.Writer) int {
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
			return unexpected(stderr, "sim-reboot", a)
		}
	}
	err := d.Update(func(m *Machine) error {
		if soft {
			fmt.Fprintln(stdout, m.SoftReboot(opts))
		} else {
			fmt.Fprintln(stdout, m.Reboot(opts))
		}
		return nil
	})
	return result(stderr, err)
}
