package agent

import (
	"context"
	"time"

	"github.com/bootc-fleet/bootc-fleet/internal/agent/bootc"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/decide"
)

// statusRead is a bootc status read in a known boot.
type statusRead struct {
	boot decide.BootIdentity
	st   bootc.Status
}

// bootcProbe is what the installed bootc supports, learned in boot boot.
type bootcProbe struct {
	boot    decide.BootIdentity
	caps    bootc.Capabilities
	support decide.BootcSupport
	retryAt time.Time // when a failed probe runs again
}

// readStatus runs bootc status, feeding the watchdog while it waits (bootc
// status waits for the sysroot lock while another bootc holds it).
func (r *runner) readStatus(ctx context.Context) (bootc.Status, error) {
	return awaitBootc(ctx, r, r.deps.Bootc.Status)
}

// awaitBootc runs fn under the command timeout, feeding the watchdog while
// it waits.
func awaitBootc[T any](ctx context.Context, r *runner, fn func(context.Context) (T, error)) (T, error) {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	var v T
	done := make(chan error, 1)
	go func() {
		var err error
		v, err = fn(cctx)
		done <- err
	}()
	err := r.await(ctx, done)
	return v, err
}

// bootcSupport probes bootc once per boot (again after a failed probe).
func (r *runner) bootcSupport(ctx context.Context, boot decide.BootIdentity) decide.BootcSupport {
	if p := r.probe; p != nil && p.boot == boot && (p.support.Known || r.now().Before(p.retryAt)) {
		return p.support
	}
	if r.stage != nil && r.probe != nil {
		return r.probe.support // never probe behind our own pull
	}
	caps, err := awaitBootc(ctx, r, r.deps.Bootc.Probe)
	p := &bootcProbe{boot: boot}
	if err != nil {
		p.support = decide.BootcSupport{Problem: "bootc probe failed: " + err.Error()}
		p.retryAt = r.now().Add(max(r.cfg.RereadInterval, time.Second))
		r.log.Error("could not learn what bootc supports; retrying", "err", err, "retryIn", p.retryAt.Sub(r.now()))
	} else {
		p.caps = caps
		p.support = decide.BootcSupport{Known: true, Version: caps.Version, SoftReboot: caps.SoftReboot}
		method, merr := caps.StageMethod()
		if merr != nil {
			p.support.Problem = merr.Error()
			r.log.Error("this bootc cannot stage an image locked; the node will not update", "version", caps.Version, "err", merr)
		} else {
			p.support.CanStage = true
			r.log.Info("bootc probed", "version", caps.Version, "stage", string(method), "softReboot", caps.SoftReboot)
		}
	}
	r.probe = p
	return p.support
}
