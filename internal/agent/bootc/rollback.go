package bootc

import (
	"context"
	"errors"
	"fmt"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
)

// Errors of Rollback. Each means nothing was queued by this call.
var (
	// ErrNoRollback: the host has no rollback deployment to go back to
	// (bootc: "No rollback available", crates/lib/src/deploy.rs, rollback).
	// A CommandError of bootc's own refusal carries it as its Class.
	ErrNoRollback = errors.New("no rollback deployment")
	// ErrRollbackMismatch: the rollback deployment is not the image the
	// rollback is for, so `bootc rollback` would boot something else.
	ErrRollbackMismatch = errors.New("the rollback deployment is not the image to roll back to")
	// ErrRollbackNotQueued: `bootc rollback` succeeded but status does not
	// show the rollback to the image queued with nothing staged.
	ErrRollbackNotQueued = errors.New("bootc status does not show the rollback queued")
)

// RollbackResult says what Rollback found and did.
type RollbackResult struct {
	// AlreadyQueued: bootc status already showed the rollback to the image
	// queued, so no command ran: a second `bootc rollback` reverts the
	// first (crates/lib/src/deploy.rs, rollback: "Reverting queued
	// rollback state"). Whether an earlier call prepared a soft reboot is
	// then unknown, so SoftRebootPrepared is false.
	AlreadyQueued bool
	// SoftRebootPrepared: this call ran with a soft-reboot mode and bootc
	// reads the rollback entry as soft-reboot capable, so bootc prepared a
	// soft reboot into it (crates/lib/src/cli.rs: rollback_ostree,
	// handle_soft_reboot, soft_reboot_rollback). Otherwise a soft reboot
	// would restart userspace on the booted image: reboot fully.
	SoftRebootPrepared bool
}

// Rollback queues the rollback deployment, which must be to, for the next
// boot: `bootc rollback`, plus `--soft-reboot=<mode>` unless mode is
// NoSoftReboot. bootc discards a staged deployment as it does so. Nothing
// but the validated mode goes on the command line; to is checked against
// what bootc status reports before and after. Like every bootc command it
// waits for the sysroot lock while another bootc holds it, and cancelling
// ctx ends it (ErrCanceled); a call after a cancelled or crashed one finds
// the rollback queued (AlreadyQueued) or not, never reverts it.
//
// It fails, running nothing, with ErrNoRollback when there is no rollback
// deployment and ErrRollbackMismatch when it is another image. With
// SoftRebootRequired on an incapable rollback entry bootc queues the
// rollback and then fails (class ErrSoftRebootNotCapable); SoftRebootAuto
// queues it and prepares nothing.
func (c *CLI) Rollback(ctx context.Context, to imageref.Pinned, mode SoftReboot) (RollbackResult, error) {
	args := []string{"rollback"}
	switch mode {
	case NoSoftReboot:
	case SoftRebootAuto, SoftRebootRequired:
		args = append(args, "--soft-reboot="+string(mode))
	default:
		return RollbackResult{}, fmt.Errorf("%w: %q", ErrInvalidSoftReboot, string(mode))
	}
	// Re-validate: a Pinned built by hand skipped ParsePinned.
	p, err := imageref.ParsePinned(to.String())
	if err != nil || p != to {
		return RollbackResult{}, fmt.Errorf("%w: %q: %w", ErrInvalidImage, to.String(), err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		return RollbackResult{}, err
	}
	if err := rollbackIs(st, p); err != nil {
		return RollbackResult{}, err
	}
	if st.RollbackQueued {
		return RollbackResult{AlreadyQueued: true}, nil
	}
	if _, err := c.run(ctx, args...); err != nil {
		return RollbackResult{}, err
	}
	st, err = c.Status(ctx)
	if err != nil {
		return RollbackResult{}, err
	}
	if err := rollbackIs(st, p); err != nil {
		return RollbackResult{}, fmt.Errorf("%w: %w", ErrRollbackNotQueued, err)
	}
	if !st.RollbackQueued || st.Staged != nil {
		return RollbackResult{}, fmt.Errorf("%w: rollbackQueued %v, staged %v", ErrRollbackNotQueued, st.RollbackQueued, st.Staged != nil)
	}
	return RollbackResult{SoftRebootPrepared: mode != NoSoftReboot && st.Rollback.SoftRebootCapable}, nil
}

// rollbackIs checks that st's rollback deployment is to.
func rollbackIs(st Status, to imageref.Pinned) error {
	if st.Rollback == nil {
		return fmt.Errorf("%w: bootc status shows none, want %q", ErrNoRollback, to.String())
	}
	got, err := st.Rollback.Pinned()
	if err != nil {
		return fmt.Errorf("%w: %w, want %q", ErrRollbackMismatch, err, to.String())
	}
	if got != to {
		return fmt.Errorf("%w: it is %q, want %q", ErrRollbackMismatch, got.String(), to.String())
	}
	return nil
}
