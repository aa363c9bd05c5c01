package testbootc

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// Errors of `bootc rollback`, without the context bootc's command line adds
// ("Rollback: Rollback (ostree): ", crates/lib/src/cli.rs: rollback,
// rollback_ostree).
var (
	// ErrNoRollback: there is no rollback deployment (crates/lib/src/deploy.rs,
	// rollback).
	ErrNoRollback = errors.New("No rollback available")
	// ErrRollbackSoftRebootNotCapable: --soft-reboot=required and bootc
	// reads the rollback entry as not soft-reboot capable, after the boot
	// order was written (crates/lib/src/cli.rs: rollback_ostree,
	// handle_soft_reboot and its #[context]).
	ErrRollbackSoftRebootNotCapable = errors.New("Handling soft reboot: Soft reboot was required but rollback deployment is not soft-reboot capable")
	// ErrNotBooted: no booted deployment (crates/lib/src/cli.rs,
	// get_storage); bootc adds only "Rollback: " to it.
	ErrNotBooted = errors.New("System not booted via bootc")
)

// Lines `bootc rollback` prints on stdout (crates/lib/src/deploy.rs,
// rollback; crates/lib/src/cli.rs, soft_reboot_rollback).
const (
	MsgRollbackQueued     = "Next boot: rollback deployment"
	MsgRollbackReverting  = "notice: Reverting queued rollback state"
	MsgRollbackReverted   = "Next boot: current deployment"
	MsgRollbackSoftReboot = "Rollback deployment is soft-reboot capable, preparing for soft-reboot..."
)

// Rollback is `bootc rollback [--soft-reboot=<mode>]` and returns the lines
// bootc prints (crates/lib/src/deploy.rs, rollback; cli.rs,
// rollback_ostree). It swaps spec.bootOrder: the rollback deployment is
// written first in the boot order (rollbackQueued), so the next boot boots
// it and the booted one becomes the rollback; on a host whose rollback is
// already queued it reverts that ("notice: Reverting queued rollback
// state"), so a second `bootc rollback` undoes the first. A staged
// deployment is discarded: ostree's write_deployments keeps a staged
// deployment only when it is first in the new list, and bootc's list starts
// with the rollback or the booted deployment (ostree-sysroot-deploy.c,
// ostree_sysroot_write_deployments_with_options). A soft reboot prepared
// for it goes with it (the model restarts userspace on the booted root;
// what ostree leaves in /run/nextroot then is not modelled).
//
// With a mode, bootc then reads the rollback entry's softRebootCapable and,
// if capable, prepares a soft reboot into the first deployment of the boot
// order (cli.rs, soft_reboot_rollback: ostree's deployment_set_soft_reboot,
// /run/nextroot): the rollback deployment, or on a revert the booted one,
// which a soft reboot then restarts on. "required" on an incapable entry
// fails after the boot order was written. /run/reboot-required and the
// journal message bootc writes are not modelled.
func (m *Machine) Rollback(mode SoftRebootMode) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if mode != "" && mode != SoftRebootAuto && mode != SoftRebootRequired {
		return nil, fmt.Errorf("test-bootc: soft-reboot mode %q is neither auto nor required", mode)
	}
	if err := fire(&m.s.Knobs.RollbackFailure); err != nil {
		return nil, err
	}
	if m.s.Booted == nil {
		return nil, ErrNotBooted
	}
	var lines []string
	reverting := m.s.RollbackQueued
	if reverting {
		lines = append(lines, MsgRollbackReverting)
	}
	rb := m.s.Rollback
	if rb == nil {
		return lines, ErrNoRollback
	}
	m.s.Staged = nil
	m.s.NextRoot = ""
	m.s.RollbackQueued = !reverting
	first := rb
	if reverting {
		first = m.s.Booted
		lines = append(lines, MsgRollbackReverted)
	} else {
		lines = append(lines, MsgRollbackQueued)
	}
	switch {
	case mode == "":
	case rb.SoftRebootCapable:
		lines = append(lines, MsgRollbackSoftReboot)
		m.s.NextRoot = first.Digest
	case mode == SoftRebootRequired:
		return lines, ErrRollbackSoftRebootNotCapable
	}
	return lines, nil
}

const rollbackUsage = "bootc rollback [OPTIONS]"

// rollbackAbout is the first paragraph of Opt::Rollback's doc comment
// (crates/lib/src/cli.rs), which clap prints as the subcommand's about.
const rollbackAbout = "Change the bootloader entry ordering; the deployment under `rollback` will be queued for the next boot, and the current will become rollback.  If there is a `staged` entry (an unapplied, queued upgrade) then it will be discarded."

// rollbackCmd is `bootc rollback` (crates/lib/src/cli.rs: RollbackOpts,
// rollback): it opens the storage for writing, which takes the sysroot lock
// and waits while another bootc holds it, as switch and upgrade do
// (get_storage; store/mod.rs). --apply, which reboots at once, is refused:
// the agent reboots through logind.
func rollbackCmd(ctx context.Context, st Store, gen generationSpec, args []string, stdout, stderr io.Writer) int {
	f, uerr := gen.parseFlags("rollback", rollbackUsage, args)
	if uerr != nil {
		return usageFail(stderr, uerr)
	}
	if f.set["--help"] {
		fmt.Fprint(stdout, gen.help("rollback", rollbackAbout, rollbackUsage))
		return exitOK
	}
	if len(f.positional) > 0 {
		return usageFail(stderr, unexpectedArg(f.positional[0], rollbackUsage))
	}
	if f.set["--apply"] {
		fmt.Fprint(stderr, "error: test-bootc: --apply is not simulated (reboot through logind)\n")
		return exitError
	}
	unlock, err := st.LockSysroot(ctx)
	if err != nil {
		return result(stderr, err)
	}
	defer unlock()
	var lines []string
	err = st.Update(func(m *Machine) error {
		var rerr error
		lines, rerr = m.Rollback(SoftRebootMode(f.softReboot))
		return rerr
	})
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	var fe *FailureError
	switch {
	case err == nil, errors.As(err, &fe):
		return result(stderr, err)
	case errors.Is(err, ErrNotBooted):
		return result(stderr, fmt.Errorf("Rollback: %w", err))
	}
	return result(stderr, fmt.Errorf("Rollback: Rollback (ostree): %w", err))
}
