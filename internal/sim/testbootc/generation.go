package testbootc

import (
	"fmt"
	"sort"
	"strings"
)

// Generation is a bootc release line whose command line Exec follows.
type Generation string

// The generations modelled. Flags are those of crates/lib/src/cli.rs
// (UpgradeOpts, SwitchOpts, RollbackOpts) at the release named; hidden flags
// are accepted but not listed in --help, as clap does. `bootc rollback`
// exists since v0.1.10, its --apply since v1.1.7 and its --soft-reboot since
// v1.7.0, so every generation here has both (RollbackOpts is the same at
// v1.11.0, v1.12.0 and v1.16.9).
const (
	// Gen1_11 is bootc 1.11: no download-only staging at all.
	Gen1_11 Generation = "1.11"
	// Gen1_16 is bootc 1.12 to 1.16 (the default): `upgrade --download-only`
	// and `upgrade --from-downloaded` exist (added in 1.12), `switch
	// --download-only` does not.
	Gen1_16 Generation = "1.16"
	// GenSwitchDownloadOnly is a bootc whose switch also takes
	// --download-only (bootc issue #2137). No release in bootc's history up
	// to 1.16.9 has it; the version printed is the next minor.
	GenSwitchDownloadOnly Generation = "switch-download-only"
)

// Generations lists every modelled generation, oldest first.
var Generations = []Generation{Gen1_11, Gen1_16, GenSwitchDownloadOnly}

type flagSpec struct {
	name   string
	value  string // placeholder of a flag that takes a value ("" = boolean)
	help   string
	hidden bool
}

type generationSpec struct {
	version  string
	switchF  []flagSpec
	upgrade  []flagSpec
	rollback []flagSpec
}

var (
	flagQuiet      = flagSpec{name: "--quiet", help: "Don't display progress"}
	flagApply      = flagSpec{name: "--apply", help: "Restart or reboot into the new target image"}
	flagSoftReboot = flagSpec{name: "--soft-reboot", value: "<SOFT_REBOOT>", help: "Configure soft reboot behavior [possible values: required, auto]"}
	flagCheck      = flagSpec{name: "--check", help: "Check if an update is available without applying it"}
	flagTransport  = flagSpec{name: "--transport", value: "<TRANSPORT>", help: "The transport; e.g. registry, oci, oci-archive, docker-daemon, containers-storage.  Defaults to `registry` [default: registry]"}
	flagSigpolicy  = flagSpec{name: "--enforce-container-sigpolicy", help: "Enforce that `containers-policy.json` includes a default policy which requires signatures"}
	flagNoSigVer   = flagSpec{name: "--no-signature-verification", hidden: true}
	flagMutate     = flagSpec{name: "--mutate-in-place", hidden: true}
	flagRetain     = flagSpec{name: "--retain", help: "Retain reference to currently booted image"}
	flagDownload   = flagSpec{name: "--download-only", help: "Download and stage the update without applying it"}
	flagFromDl     = flagSpec{name: "--from-downloaded", help: "Apply a staged deployment that was previously downloaded with --download-only"}
	// RollbackOpts' --apply has its own doc comment.
	flagRollbackApply = flagSpec{name: "--apply", help: "Restart or reboot into the rollback image"}
)

var generations = map[Generation]generationSpec{
	Gen1_11: {
		version:  "1.11.0",
		switchF:  []flagSpec{flagQuiet, flagApply, flagSoftReboot, flagTransport, flagNoSigVer, flagSigpolicy, flagMutate, flagRetain},
		upgrade:  []flagSpec{flagQuiet, flagCheck, flagApply, flagSoftReboot},
		rollback: []flagSpec{flagRollbackApply, flagSoftReboot},
	},
	Gen1_16: {
		version:  "1.16.9",
		switchF:  []flagSpec{flagQuiet, flagApply, flagSoftReboot, flagTransport, flagNoSigVer, flagSigpolicy, flagMutate, flagRetain},
		upgrade:  []flagSpec{flagQuiet, flagCheck, flagApply, flagSoftReboot, flagDownload, flagFromDl},
		rollback: []flagSpec{flagRollbackApply, flagSoftReboot},
	},
	GenSwitchDownloadOnly: {
		version:  "1.17.0",
		switchF:  []flagSpec{flagQuiet, flagApply, flagSoftReboot, flagTransport, flagNoSigVer, flagSigpolicy, flagMutate, flagRetain, flagDownload},
		upgrade:  []flagSpec{flagQuiet, flagCheck, flagApply, flagSoftReboot, flagDownload, flagFromDl},
		rollback: []flagSpec{flagRollbackApply, flagSoftReboot},
	},
}

func (g Generation) spec() (generationSpec, error) {
	if g == "" {
		g = Gen1_16
	}
	s, ok := generations[g]
	if !ok {
		known := make([]string, 0, len(generations))
		for k := range generations {
			known = append(known, string(k))
		}
		sort.Strings(known)
		return generationSpec{}, fmt.Errorf("test-bootc: unknown generation %q (known: %s)", g, strings.Join(known, ", "))
	}
	return s, nil
}

// Version is what `bootc --version` prints for the generation.
func (g Generation) Version() string {
	s, err := g.spec()
	if err != nil {
		return ""
	}
	return s.version
}

func (s generationSpec) flags(cmd string) []flagSpec {
	switch cmd {
	case "switch":
		return s.switchF
	case "rollback":
		return s.rollback
	}
	return s.upgrade
}

// help renders clap's --help for a subcommand.
func (s generationSpec) help(cmd, about, usage string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\nUsage: %s\n\n", about, usage)
	if cmd == "switch" {
		b.WriteString("Arguments:\n  <TARGET>  Target image to use for the next boot\n\n")
	}
	b.WriteString("Options:\n")
	for _, f := range s.flags(cmd) {
		if f.hidden {
			continue
		}
		name := f.name
		if f.value != "" {
			name += " " + f.value
		}
		fmt.Fprintf(&b, "      %-34s %s\n", name, f.help)
	}
	b.WriteString("  -h, --help                             Print help (see more with '--help')\n")
	return b.String()
}

// parsedFlags are the options of one switch, upgrade or rollback command line.
type parsedFlags struct {
	set        map[string]bool
	softReboot string
	positional []string
}

// parseFlags parses args as clap would for cmd of this generation: an
// unknown flag is clap's "unexpected argument" (exit 2).
func (s generationSpec) parseFlags(cmd, usage string, args []string) (parsedFlags, *usageError) {
	known := map[string]flagSpec{}
	for _, f := range s.flags(cmd) {
		known[f.name] = f
	}
	p := parsedFlags{set: map[string]bool{}}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			p.positional = append(p.positional, a)
			continue
		}
		if a == "-h" || a == "--help" {
			p.set["--help"] = true
			continue
		}
		name, value, hasValue := strings.Cut(a, "=")
		f, ok := known[name]
		if !ok {
			return p, unexpectedArg(a, usage)
		}
		if f.value == "" {
			if hasValue {
				return p, &usageError{msg: fmt.Sprintf("error: unexpected value '%s' for '%s' found; no more were expected\n\nUsage: %s\n\nFor more information, try '--help'.\n", value, name, usage)}
			}
			p.set[name] = true
			continue
		}
		if p.set[name] {
			return p, &usageError{msg: fmt.Sprintf("error: the argument '%s %s' cannot be used multiple times\n\nUsage: %s\n\nFor more information, try '--help'.\n", name, f.value, usage)}
		}
		if !hasValue {
			// clap takes the next word as the value unless it is an option.
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
				value, hasValue = args[i], true
			}
		}
		if !hasValue || value == "" {
			return p, &usageError{msg: fmt.Sprintf("error: a value is required for '%s %s' but none was supplied\n%s\nFor more information, try '--help'.\n", name, f.value, possibleValues(name))}
		}
		if name == "--soft-reboot" {
			if value != "required" && value != "auto" {
				return p, &usageError{msg: fmt.Sprintf("error: invalid value '%s' for '--soft-reboot <SOFT_REBOOT>'\n  [possible values: required, auto]\n\nFor more information, try '--help'.\n", value)}
			}
			p.softReboot = value
		}
		p.set[name] = true
	}
	return p, nil
}

// usageError is a command line clap refuses: its message goes to stderr and
// the exit code is 2.
type usageError struct{ msg string }

func unexpectedArg(arg, usage string) *usageError {
	return &usageError{msg: fmt.Sprintf("error: unexpected argument '%s' found\n\n  tip: to pass '%s' as a value, use '-- %s'\n\nUsage: %s\n\nFor more information, try '--help'.\n", arg, arg, arg, usage)}
}

func possibleValues(flag string) string {
	if flag == "--soft-reboot" {
		return "  [possible values: required, auto]\n"
	}
	return ""
}
