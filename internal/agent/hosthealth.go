package agent

import (
	"context"
	"fmt"
	"time"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/decide"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/host"
)

// HostHealthReader is a Host that also reads the host's health from
// systemd for the pool's health gate (host.Systemd does; docs/design.md,
// amendment 24). A Host without it reports no status.host.
type HostHealthReader interface {
	HostHealth(ctx context.Context, units []string) (host.Health, error)
}

// hostHealthTimeout bounds the D-Bus reads of one report: a slow or absent
// systemd costs the report its host block, never the report.
const hostHealthTimeout = 5 * time.Second

// hostHealth reads status.host for a report in boot: what systemd says now,
// with the units the BootcNode's spec.health names, stamped with the boot
// it was read in. A read that fails, or during which the boot changed,
// gives none (and a log line when the failure is new).
func (r *runner) hostHealth(ctx context.Context, n *fleetv1.BootcNode, boot decide.BootIdentity) *fleetv1.HostHealth {
	hr, ok := r.deps.Host.(HostHealthReader)
	if !ok || !boot.Known() {
		return nil
	}
	var units []string
	if h := n.Spec.Health; h != nil {
		units = h.RequiredUnits // host.HostHealth validates and bounds them again
	}
	hctx, cancel := context.WithTimeout(ctx, hostHealthTimeout)
	defer cancel()
	h, err := hr.HostHealth(hctx, units)
	if err == nil {
		if now, _, idErr := r.identity(hctx); idErr != nil || now != boot {
			err = fmt.Errorf("the boot changed while reading (%s, now %s)", boot, now)
		}
	}
	if err != nil {
		if msg := err.Error(); msg != r.hostErr {
			r.log.Error("could not read the host's health from systemd; reporting no host", "err", err)
			r.hostErr = msg
		}
		return nil
	}
	if r.hostErr != "" {
		r.log.Info("reading the host's health from systemd again")
		r.hostErr = ""
	}
	return &fleetv1.HostHealth{BootID: boot.BootID, SoftRebootCount: int64(boot.SoftRebootCount), SystemState: h.SystemState,
		FailedUnits: h.FailedUnits, FailedUnitsTotal: h.FailedUnitsTotal, BootComplete: h.BootComplete, Units: h.Units}
}
