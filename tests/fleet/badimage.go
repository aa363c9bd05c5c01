package fleet

import (
	"context"
	"strings"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/host"
)

// BadImageUnit is the unit that fails on a machine booted into an image
// pushed with PushBad: the image boots, Ready, but its host check fails.
const BadImageUnit = "bad-image-check.service"

// PushBad uploads a new image as repo:tag, like Push, and marks its digest
// bad: a machine booted into it reports systemd "degraded" with
// BadImageUnit failed and boot-complete.target never reached, as a host
// whose image breaks a unit does. Returns its repo@sha256.
func (p *Pool) PushBad(tag string) string {
	return p.PushBadOn(tag, func(string) bool { return true })
}

// PushBadOn is PushBad for the nodes on says yes to (by node name): the
// image breaks only those hosts, as an image that fails on one hardware
// type or in one zone does.
func (p *Pool) PushBadOn(tag string, on func(node string) bool) string {
	ref := p.Push(tag)
	p.f.mu.Lock()
	defer p.f.mu.Unlock()
	if p.f.bad == nil {
		p.f.bad = map[string]func(string) bool{}
	}
	p.f.bad[digestOf(ref)] = on
	return ref
}

// IsBad reports whether digest (sha256:...) breaks node (PushBad, PushBadOn).
func (f *Fleet) IsBad(digest, node string) bool {
	f.mu.Lock()
	on := f.bad[digest]
	f.mu.Unlock()
	return on != nil && on(node)
}

func digestOf(ref string) string {
	if i := strings.LastIndex(ref, "@"); i >= 0 {
		return ref[i+1:]
	}
	return ref
}

// HostHealth is what systemd says of the machine in its current boot: a
// machine booted into a bad image is degraded with BadImageUnit failed and
// boot-complete.target inactive; any other is running, boot complete, with
// every asked-for unit active (BadImageUnit, asked for, is failed on a bad
// image). The agent reads it as it reads host.Systemd over D-Bus.
func (h memHost) HostHealth(_ context.Context, units []string) (host.Health, error) {
	st := h.n.Machine.State()
	bad := st.Booted != nil && h.n.fleet != nil && h.n.fleet.IsBad(st.Booted.Digest, h.n.Name)
	out := host.Health{SystemState: fleetv1.SystemRunning, BootComplete: "active"}
	if bad {
		out = host.Health{SystemState: fleetv1.SystemDegraded, BootComplete: "inactive",
			FailedUnits: []string{BadImageUnit}, FailedUnitsTotal: 1}
	}
	for i, u := range units {
		if i >= fleetv1.MaxRequiredUnits || !host.ValidUnitName(u) {
			continue
		}
		state := "active"
		if bad && u == BadImageUnit {
			state = "failed"
		}
		out.Units = append(out.Units, fleetv1.UnitState{Name: u, ActiveState: state})
	}
	return out, nil
}
