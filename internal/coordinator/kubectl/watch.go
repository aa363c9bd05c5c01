package kubectl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// watchTarget is one list to watch.
type watchTarget struct {
	list     client.ObjectList
	opts     []client.ListOption
	resource string // for errors
}

// Timings of the watch loops.
const (
	// rewatchAfter: a watch the API server closed (they all time out) is
	// started again after this.
	rewatchAfter = time.Second
	// settleFor: changes that come together (a watch's first events, a
	// coordinator pass writing several objects) are read once.
	settleFor = 100 * time.Millisecond
	// redrawEvery: on a terminal the durations are redrawn this often.
	redrawEvery = time.Second
)

// watchable is cl if it can watch.
func watchable(cl client.Client) (client.WithWatch, error) {
	if wc, ok := cl.(client.WithWatch); ok {
		return wc, nil
	}
	return nil, errors.New("this client cannot watch (build it with client.NewWithWatch)")
}

// watchAll signals changed whenever an object of the targets changes, and
// each time a watch starts (so nothing between a read and the watch is
// missed). It returns nil when ctx ends, or the error of a watch the API
// server refused to start the first time (RBAC, no such resource); a watch
// that fails later is started again.
func watchAll(ctx context.Context, c client.WithWatch, targets []watchTarget, changed chan<- struct{}) error {
	errc := make(chan error, len(targets))
	for _, t := range targets {
		go func() { errc <- watchOne(ctx, c, t, changed) }()
	}
	for range targets {
		if err := <-errc; err != nil {
			return err
		}
	}
	return nil
}

func watchOne(ctx context.Context, c client.WithWatch, t watchTarget, changed chan<- struct{}) error {
	for first := true; ; first = false {
		w, err := c.Watch(ctx, t.list.DeepCopyObject().(client.ObjectList), t.opts...)
		switch {
		case ctx.Err() != nil:
			if w != nil {
				w.Stop()
			}
			return nil
		case err != nil && first:
			return apiError(err, "watch", t.resource)
		case err == nil:
			signal(changed)
			drain(w, changed)
			w.Stop()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(rewatchAfter):
		}
	}
}

// drain signals each event of w until it closes or reports an error.
func drain(w watch.Interface, changed chan<- struct{}) {
	for ev := range w.ResultChan() {
		if ev.Type == watch.Error {
			return
		}
		signal(changed)
	}
}

func signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// statusTargets are what `status [POOL]` reads: the pools (or POOL), their
// slot Leases and, with POOL, the Nodes and BootcNodes.
func statusTargets(pool string) []watchTarget {
	leases := watchTarget{list: &coordinationv1.LeaseList{}, resource: "leases.coordination.k8s.io in namespace " + lease.Namespace,
		opts: []client.ListOption{client.InNamespace(lease.Namespace), client.HasLabels{lease.LabelPool}}}
	if pool == "" {
		return []watchTarget{{list: &fleetv1.BootcNodePoolList{}, resource: "bootcnodepools.fleet.bootc.dev"}, leases}
	}
	leases.opts = []client.ListOption{client.InNamespace(lease.Namespace), client.MatchingLabels{lease.LabelPool: pool}}
	return []watchTarget{poolTarget(pool), leases,
		{list: &fleetv1.BootcNodeList{}, resource: "bootcnodes.fleet.bootc.dev"},
		{list: &corev1.NodeList{}, resource: "nodes"}}
}

// watchStatus is `status [POOL] --watch`. On a terminal it redraws the
// report in place as the pools move, and every redrawEvery for the
// durations, until interrupted. Otherwise it prints the report each time
// it changes, and ends once every pool shown is settled (up to date on its
// current target, or halted): a pipe has nobody to press Ctrl-C.
func (c *cli) watchStatus(ctx context.Context, pool, output string) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	wc, err := watchable(cl)
	if err != nil {
		return err
	}
	tty := isTerminal(c.o.Out)
	changed := make(chan struct{}, 1)
	errc := make(chan error, 1)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { errc <- watchAll(wctx, wc, statusTargets(pool), changed) }()
	var tick <-chan time.Time
	if tty {
		t := time.NewTicker(redrawEvery)
		defer t.Stop()
		tick = t.C
	}
	var shown []byte
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if err != nil || ctx.Err() != nil {
				return err
			}
			return errors.New("the watches ended")
		case <-tick:
		case <-changed:
			settle(ctx, changed)
		}
		r := &reader{c: cl, now: c.o.Now().UTC()}
		rep, err := r.status(ctx, pool)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		var b bytes.Buffer
		if err := printReport(&b, output, rep, func(w io.Writer) { writeStatus(w, rep) }); err != nil {
			return err
		}
		if !bytes.Equal(b.Bytes(), shown) {
			c.show(tty, shown == nil, pool, output, rep, b.Bytes())
			shown = b.Bytes()
		}
		if !tty && rep.settled {
			return nil
		}
	}
}

// settle waits settleFor, taking the changes that come meanwhile.
func settle(ctx context.Context, changed <-chan struct{}) {
	t := time.NewTimer(settleFor)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case <-changed:
		}
	}
}

// show prints one report: on a terminal over the last one, under a line
// saying what is shown and when; otherwise after the last one, a blank
// line between tables and a "---" before each YAML document.
func (c *cli) show(tty bool, first bool, pool, output string, rep *StatusReport, report []byte) {
	switch {
	case tty:
		what := "kubectl bootc-fleet status"
		if pool != "" {
			what += " " + pool
		}
		// Home, clear the screen.
		fmt.Fprintf(c.o.Out, "\x1b[H\x1b[2J%s --watch   %s   (Ctrl-C to stop)\n\n", what, rep.Time.UTC().Format(time.RFC3339))
	case output == FormatYAML:
		fmt.Fprintln(c.o.Out, "---")
	case output == FormatTable && !first:
		fmt.Fprintln(c.o.Out)
	}
	_, _ = c.o.Out.Write(report)
}

// isTerminal: w is a terminal that understands cursor movement.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb"
}
