package controller

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/drain"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/metrics"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// NodeDrainer cordons, drains and uncordons Nodes (internal/coordinator/drain).
type NodeDrainer interface {
	// Cordon cordons node, marking it with mark (and the autoscaler marks)
	// in the same update; it
	// reports whether someone else had cordoned it already, and the Node it
	// wrote (nil if it wrote none). seen (may be nil) is the Node as last
	// seen, used for a conditional first write instead of a read.
	Cordon(ctx context.Context, node, mark string, seen *corev1.Node) (wasCordoned bool, written *corev1.Node, err error)
	// Uncordon uncordons node and restores the autoscaler marks in the
	// same update.
	Uncordon(ctx context.Context, node string, seen *corev1.Node) (written *corev1.Node, err error)
	// MarkAutoscalers holds node from autoscalers for reboot slot slot, or
	// with slot "" restores what a hold set (amendment 28).
	MarkAutoscalers(ctx context.Context, node, slot string, seen *corev1.Node) (written *corev1.Node, err error)
	Drain(ctx context.Context, node string, timeout time.Duration) error
}

// drainTracker runs one drain per node in the background and reconciles the
// pool when it ends. It runs as a manager Runnable, so drains run only on the
// leader and stop with it.
type drainTracker struct {
	drainer NodeDrainer
	log     logr.Logger
	events  chan event.TypedGenericEvent[*fleetv1.BootcNodePool]

	mu   sync.Mutex
	ctx  context.Context
	jobs map[string]*drainJob // by node
}

type drainJob struct {
	pool     string
	grant    lease.ID
	state    plan.DrainState
	message  string
	attempts int
	cancel   context.CancelFunc
}

func newDrainTracker(d NodeDrainer, log logr.Logger) *drainTracker {
	return &drainTracker{
		drainer: d,
		log:     log,
		events:  make(chan event.TypedGenericEvent[*fleetv1.BootcNodePool], 64),
		jobs:    map[string]*drainJob{},
	}
}

// Start implements manager.Runnable: it holds the context drains run under.
func (t *drainTracker) Start(ctx context.Context) error {
	t.mu.Lock()
	t.ctx = ctx
	t.mu.Unlock()
	<-ctx.Done()
	t.mu.Lock()
	defer t.mu.Unlock()
	for node, j := range t.jobs {
		j.cancel()
		delete(t.jobs, node)
	}
	return nil
}

// snapshot is the planner's view of the drains.
func (t *drainTracker) snapshot() map[string]plan.Drain {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]plan.Drain, len(t.jobs))
	for node, j := range t.jobs {
		out[node] = plan.Drain{Grant: j.grant, State: j.state, Message: j.message, Attempts: j.attempts}
	}
	return out
}

// start drains node for grant unless that drain is already running.
func (t *drainTracker) start(pool, node string, grant lease.ID, timeout time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctx == nil {
		return // not started (not the leader): nothing may drain
	}
	prev := t.jobs[node]
	if prev != nil && prev.grant == grant && prev.state == plan.DrainRunning {
		return
	}
	j := &drainJob{pool: pool, grant: grant, state: plan.DrainRunning, attempts: 1}
	if prev != nil {
		prev.cancel()
		if prev.grant == grant {
			j.attempts, j.message = prev.attempts+1, prev.message
		}
	}
	ctx, cancel := context.WithCancel(t.ctx)
	j.cancel = cancel
	t.jobs[node] = j
	go t.run(ctx, j, node, timeout)
}

func (t *drainTracker) run(ctx context.Context, j *drainJob, node string, timeout time.Duration) {
	began := time.Now()
	err := t.drainer.Drain(ctx, node, timeout)
	result := metrics.DrainSucceeded
	var be *drain.BlockedError
	switch {
	case err == nil:
	case errors.As(err, &be) && be.TimedOut:
		result = metrics.DrainTimedOut
	default:
		result = metrics.DrainFailed
	}
	t.mu.Lock()
	if t.jobs[node] != j || ctx.Err() != nil {
		t.mu.Unlock()
		return // stopped or replaced: its result is no one's
	}
	if err != nil {
		j.state, j.message = plan.DrainFailed, err.Error()
		t.log.Info("drain did not complete", "node", node, "pool", j.pool, "attempt", j.attempts, "error", err.Error())
	} else {
		j.state = plan.DrainDone
	}
	t.mu.Unlock()
	metrics.DrainDuration.WithLabelValues(j.pool, result).Observe(time.Since(began).Seconds())
	select {
	case t.events <- event.TypedGenericEvent[*fleetv1.BootcNodePool]{Object: &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: j.pool}}}:
	case <-ctx.Done():
	}
}

// startOnce drains node for grant unless a drain for that grant was started
// already (running, done or failed: retries are the planner's to decide).
func (t *drainTracker) startOnce(pool, node string, grant lease.ID, timeout time.Duration) bool {
	t.mu.Lock()
	prev := t.jobs[node]
	t.mu.Unlock()
	if prev != nil && prev.grant == grant {
		return false
	}
	t.start(pool, node, grant, timeout)
	return true
}

// stop cancels node's drain and forgets it.
func (t *drainTracker) stop(node string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if j := t.jobs[node]; j != nil {
		j.cancel()
		delete(t.jobs, node)
	}
}

// forgetExcept cancels and drops the pool's drains whose grant is not in live.
func (t *drainTracker) forgetExcept(pool string, live map[string]lease.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for node, j := range t.jobs {
		if j.pool == pool && live[node] != j.grant {
			j.cancel()
			delete(t.jobs, node)
		}
	}
}
