package bootc

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/text"
)

// Capabilities is what the installed bootc can do, learned from its own
// --version and --help (hidden flags do not show there, and none is used).
type Capabilities struct {
	// Version is what `bootc --version` printed, e.g. "1.16.9".
	Version string
	// SwitchDownloadOnly: `bootc switch --download-only` (bootc issue #2137).
	SwitchDownloadOnly bool
	// UpgradeDownloadOnly: `bootc upgrade --download-only` and
	// `--from-downloaded` (bootc 1.12 and later).
	UpgradeDownloadOnly bool
	// SoftReboot: `bootc upgrade --soft-reboot`.
	SoftReboot bool
}

// Method names how a stage runs on this bootc.
type Method string

// The ways a stage runs; the installed bootc decides which.
const (
	// MethodSwitchDownloadOnly: one `bootc switch --download-only <image>`.
	MethodSwitchDownloadOnly Method = "switch --download-only"
	// MethodSwitchThenLock: `bootc switch <image>`, then `bootc upgrade
	// --download-only`, which finds the tracked image already staged and
	// locks it (crates/lib/src/cli.rs, upgrade: staged_unchanged).
	MethodSwitchThenLock Method = "switch, then upgrade --download-only"
)

// StageMethod picks the stage sequence for these capabilities, or says why
// none is safe.
func (c Capabilities) StageMethod() (Method, error) {
	switch {
	case c.SwitchDownloadOnly && c.UpgradeDownloadOnly:
		return MethodSwitchDownloadOnly, nil
	case c.UpgradeDownloadOnly:
		return MethodSwitchThenLock, nil
	}
	return "", fmt.Errorf("%w: bootc %s has no `upgrade --download-only` and `--from-downloaded` (bootc 1.12 or later), so it cannot stage an image without applying it at the next shutdown", ErrUnsupported, c.Version)
}

// versionRE bounds what the agent accepts as a version (it is reported and logged).
var versionRE = regexp.MustCompile(`^[0-9]+\.[0-9]+(\.[0-9]+)?([-+~.][0-9A-Za-z.+~-]{1,40})?$`)

// flagRE finds the long options clap lists in --help output.
var flagRE = regexp.MustCompile(`(?m)^\s+(?:-[A-Za-z], )?(--[a-z][a-z0-9-]*)`)

// Probe asks bootc what it supports: `bootc --version`, `bootc switch
// --help` and `bootc upgrade --help`. The answer holds for the boot: bootc
// changes only with the image.
func (c *CLI) Probe(ctx context.Context) (Capabilities, error) {
	out, err := c.run(ctx, "--version")
	if err != nil {
		return Capabilities{}, err
	}
	v, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "bootc ")
	if !ok || !versionRE.MatchString(v) {
		return Capabilities{}, fmt.Errorf("%w: bootc --version printed %q, want \"bootc <version>\"", ErrMalformed, text.Truncate(string(out), 80))
	}
	caps := Capabilities{Version: v}
	sw, err := c.flags(ctx, "switch")
	if err != nil {
		return Capabilities{}, err
	}
	up, err := c.flags(ctx, "upgrade")
	if err != nil {
		return Capabilities{}, err
	}
	caps.SwitchDownloadOnly = sw["--download-only"]
	caps.UpgradeDownloadOnly = up["--download-only"] && up["--from-downloaded"]
	caps.SoftReboot = up["--soft-reboot"]
	return caps, nil
}

func (c *CLI) flags(ctx context.Context, cmd string) (map[string]bool, error) {
	out, err := c.run(ctx, cmd, "--help")
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for _, m := range flagRE.FindAllStringSubmatch(string(out), -1) {
		set[m[1]] = true
	}
	if !set["--help"] {
		return nil, fmt.Errorf("%w: bootc %s --help lists no options", ErrMalformed, cmd)
	}
	return set, nil
}

// StageOptions shape one stage.
type StageOptions struct {
	// EnforceSignatures stages with `bootc switch
	// --enforce-container-sigpolicy` (BootcNode spec.requireSignedImages;
	// the flag exists in every bootc that can stage locked, crates/lib/src/cli.rs
	// SwitchOpts), and the stage succeeds only when bootc reports the staged
	// deployment's signature as ContainerPolicy. `upgrade --download-only`
	// then pulls with the origin's signature source, so it is enforced too.
	EnforceSignatures bool
}

// ErrNotVerified says a stage that had to be verified left a staged
// deployment bootc does not report as verified by the container policy.
var ErrNotVerified = errors.New("the staged deployment was not verified by the container signature policy")

// relockTimeout bounds the lock step that follows a cancelled switch.
const relockTimeout = 2 * time.Minute

// Stage stages exactly img, locked (download-only), with the sequence caps
// allow. No unlocked staged deployment of another image is ever made: the
// only unlocked moment (MethodSwitchThenLock, between the switch and the
// lock) is of img itself, and a cancelled or failed switch that got as far
// as staging is locked before Stage returns.
func (c *CLI) Stage(ctx context.Context, img imageref.Pinned, caps Capabilities, opts StageOptions) error {
	// Re-validate: a Pinned built by hand skipped ParsePinned.
	p, err := imageref.ParsePinned(img.String())
	if err != nil || p != img {
		return fmt.Errorf("%w: %q: %w", ErrInvalidImage, img.String(), err)
	}
	method, err := caps.StageMethod()
	if err != nil {
		return err
	}
	enforce := []string{}
	if opts.EnforceSignatures {
		enforce = []string{"--enforce-container-sigpolicy"}
	}
	if method == MethodSwitchDownloadOnly {
		if _, err := c.run(ctx, append(append([]string{"switch", "--download-only"}, enforce...), p.String())...); err != nil {
			return err
		}
		// "Image specification is unchanged." leaves an unlocked staged img
		// as it was: lock it.
		if err := c.lockIfUnlocked(ctx, p); err != nil {
			return err
		}
		return c.checkLocked(ctx, p, opts)
	}
	if _, err := c.run(ctx, append(append([]string{"switch"}, enforce...), p.String())...); err != nil {
		// The switch may have staged before it ended: lock what it left.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), relockTimeout)
		defer cancel()
		if lerr := c.lockIfUnlocked(lctx, p); lerr != nil {
			return errors.Join(err, fmt.Errorf("locking after the failed switch: %w", lerr))
		}
		return err
	}
	if _, err := c.run(ctx, "upgrade", "--download-only"); err != nil {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), relockTimeout)
		defer cancel()
		if lerr := c.lockIfUnlocked(lctx, p); lerr != nil {
			return errors.Join(err, lerr)
		}
		return err
	}
	return c.checkLocked(ctx, p, opts)
}

// lockIfUnlocked locks the staged deployment when it is img and unlocked.
func (c *CLI) lockIfUnlocked(ctx context.Context, img imageref.Pinned) error {
	st, err := c.Status(ctx)
	if err != nil {
		return err
	}
	if st.Staged == nil || st.Staged.DownloadOnly {
		return nil
	}
	if got, _ := st.Staged.Pinned(); got != img {
		return nil // not ours: the agent's decision reports it
	}
	if _, err := c.run(ctx, "upgrade", "--download-only"); err != nil {
		return err
	}
	return c.checkLocked(ctx, img, StageOptions{})
}

// checkLocked reads status and checks the staged deployment is img, locked
// (and verified, when opts say so).
func (c *CLI) checkLocked(ctx context.Context, img imageref.Pinned, opts StageOptions) error {
	st, err := c.Status(ctx)
	if err != nil {
		return err
	}
	if st.Staged == nil {
		return fmt.Errorf("%w: nothing is staged", ErrNotLocked)
	}
	got, _ := st.Staged.Pinned()
	if got != img || !st.Staged.DownloadOnly {
		return fmt.Errorf("%w: staged is %q (download-only %v), want %q", ErrNotLocked, got.String(), st.Staged.DownloadOnly, img.String())
	}
	if opts.EnforceSignatures && st.Staged.Signature != SignatureContainerPolicy {
		return fmt.Errorf("%w: bootc reports signature %q for staged %q", ErrNotVerified, string(st.Staged.Signature), img.String())
	}
	return nil
}
