package sim

import (
	"errors"
	"fmt"
	"strings"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/host"
)

// BadImageUnit is the unit that fails on a machine booted into an image
// pushed with PushBad: the image boots, the node is Ready, but its host
// check fails (tests/fleet's in-process fleet uses the same name).
const BadImageUnit = "bad-image-check.service"

// PushBad uploads a new image under tag, like Push, and marks its digest
// bad: a node booted into it finds its host bus saying what systemd says of
// a host whose image breaks a unit (SystemState degraded, BadImageUnit
// failed, boot-complete.target inactive), read by the real agent over
// D-Bus. Returns its repo@sha256.
func (f *ProcFleet) PushBad(tag string) (string, error) {
	pinned, err := f.Push(tag)
	if err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bad == nil {
		f.bad = map[string]bool{}
	}
	f.bad[digestOf(pinned)] = true
	return pinned, nil
}

// IsBad reports whether digest (sha256:...) was pushed with PushBad.
func (f *ProcFleet) IsBad(digest string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bad[digest]
}

func digestOf(ref string) string {
	if i := strings.LastIndex(ref, "@"); i >= 0 {
		return ref[i+1:]
	}
	return ref
}

// playHostHealth sets the node's fake systemd to what systemd says in a
// boot of the image the machine booted now: on a bad image degraded, with
// BadImageUnit failed and boot-complete.target inactive; on any other
// running, boot complete, no unit failed. A new boot starts from nothing,
// so a unit that failed in an earlier boot is gone. The harness calls it
// while the agent is stopped (a reboot being played) or not yet started.
func (n *ProcNode) playHostHealth() error {
	m, err := n.Bootc.Machine()
	if err != nil {
		return fmt.Errorf("%s: reading the machine for its host state: %w", n.Name, err)
	}
	if b := m.State().Booted; b != nil && n.f.IsBad(b.Digest) {
		n.Systemd.SetSystemState(string(fleetv1.SystemDegraded))
		return errors.Join(n.Systemd.SetUnit(BadImageUnit, "failed"), n.Systemd.SetUnit(host.BootCompleteTarget, "inactive"))
	}
	n.Systemd.SetSystemState(string(fleetv1.SystemRunning))
	n.Systemd.UnloadUnit(BadImageUnit)
	return n.Systemd.SetUnit(host.BootCompleteTarget, "active")
}

// hostPlayed records an error of playHostHealth in a reboot being played;
// CheckInvocations reports it.
func (n *ProcNode) hostPlayed(err error) {
	if err == nil {
		return
	}
	n.mu.Lock()
	n.traceErrs = append(n.traceErrs, err)
	n.mu.Unlock()
}
