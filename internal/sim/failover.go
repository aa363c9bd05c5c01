package sim

// Leader failover with real processes: a process fleet with Replicas >= 2
// runs that many bootc-fleet-coordinator processes with --leader-elect.
// KillLeader sends the leading one SIGKILL (nothing is released: the
// leader-election Lease and every grant stay as the dead process left them),
// starts a new standby at once, and measures the takeover.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// CoordReplica is one coordinator process of a leader-elected set.
type CoordReplica struct {
	Name    string // replica-<n>, in start order
	Log     string // its own output
	Started time.Time
	proc    *Process
	killed  bool
}

// Takeover is one leader change after a SIGKILL, each time from the kill.
type Takeover struct {
	Killed, Successor string    // replica names
	At                time.Time // the SIGKILL
	// Acquired: the successor's acquireTime on the leader-election Lease.
	Acquired time.Duration
	// Working: the successor logged "Starting workers" (caches synced,
	// reconciling).
	Working time.Duration
	// FirstWrite: the first slot Lease version the harness's watch saw
	// after the successor started working (0: none before the run ended).
	FirstWrite time.Duration
	// HeldAtKill names the slots held when the leader was killed, with
	// their phase: what the successor took over mid-flight.
	HeldAtKill []string
}

func (t Takeover) String() string {
	fw := "none"
	if t.FirstWrite > 0 {
		fw = t.FirstWrite.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("killed %s holding [%s]; %s acquired the leader Lease after %s, started working after %s, first slot write after %s",
		t.Killed, strings.Join(t.HeldAtKill, " "), t.Successor, t.Acquired.Round(time.Millisecond), t.Working.Round(time.Millisecond), fw)
}

// StartReplica starts one more leader-elected coordinator process.
func (f *ProcFleet) StartReplica() (*CoordReplica, error) {
	f.mu.Lock()
	name := fmt.Sprintf("replica-%d", len(f.replicas))
	f.mu.Unlock()
	r := &CoordReplica{Name: name, Log: filepath.Join(f.Dir, "coordinator-"+name+".log"), Started: time.Now()}
	p, err := f.startCoordinatorProcess(r.Log, "--leader-elect")
	if err != nil {
		return nil, err
	}
	r.proc = p
	f.mu.Lock()
	f.replicas = append(f.replicas, r)
	f.mu.Unlock()
	return r, nil
}

// Replicas returns every replica started so far, killed ones included.
func (f *ProcFleet) Replicas() []*CoordReplica {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*CoordReplica(nil), f.replicas...)
}

func (f *ProcFleet) stopReplicas() {
	for _, r := range f.Replicas() {
		r.proc.Stop(10 * time.Second)
	}
}

// workingSince is when r logged "Starting workers": it won the election
// and its caches synced. ok is false while it has not.
func (r *CoordReplica) workingSince() (at time.Time, ok bool) {
	b, err := os.ReadFile(r.Log)
	if err != nil {
		return time.Time{}, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, `"msg":"Starting workers"`) {
			continue
		}
		var l struct {
			TS string `json:"ts"`
		}
		if json.Unmarshal([]byte(line), &l) == nil {
			if t, err := time.Parse(time.RFC3339Nano, l.TS); err == nil {
				return t, true
			}
		}
		return time.Now(), true
	}
	return time.Time{}, false
}

// WaitLeader waits for a live replica that is working, other than not.
func (f *ProcFleet) WaitLeader(ctx context.Context, not *CoordReplica, timeout time.Duration) (*CoordReplica, time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		for _, r := range f.Replicas() {
			if r == not || r.killed {
				continue
			}
			if at, ok := r.workingSince(); ok {
				return r, at, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, time.Time{}, fmt.Errorf("no coordinator replica became leader within %s", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// KillLeader sends the working leader SIGKILL, starts a new standby at
// once, and waits (up to timeout) for another replica to lead.
func (f *ProcFleet) KillLeader(ctx context.Context, timeout time.Duration) (Takeover, error) {
	leader, _, err := f.WaitLeader(ctx, nil, timeout)
	if err != nil {
		return Takeover{}, err
	}
	t := Takeover{Killed: leader.Name, HeldAtKill: f.HeldSlots(ctx)}
	t.At = time.Now()
	if err := syscall.Kill(-leader.proc.PID(), syscall.SIGKILL); err != nil {
		return t, fmt.Errorf("SIGKILL %s: %w", leader.Name, err)
	}
	<-leader.proc.done
	f.mu.Lock()
	leader.killed = true
	f.mu.Unlock()
	if _, err := f.StartReplica(); err != nil {
		return t, err
	}
	next, working, err := f.WaitLeader(ctx, leader, timeout)
	if err != nil {
		return t, err
	}
	t.Successor, t.Working = next.Name, working.Sub(t.At)
	if l, err := f.Kube.CoordinationV1().Leases(lease.Namespace).Get(ctx, controller.DefaultLeaderElectionID, metav1.GetOptions{}); err == nil &&
		l.Spec.AcquireTime != nil {
		t.Acquired = l.Spec.AcquireTime.Sub(t.At)
	}
	return t, nil
}

// HeldSlots lists the pool's held slots as lease=holder/phase.
func (f *ProcFleet) HeldSlots(ctx context.Context) []string {
	ls, err := f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + f.Pool})
	if err != nil {
		return []string{"(" + err.Error() + ")"}
	}
	var out []string
	for _, l := range ls.Items {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
			out = append(out, fmt.Sprintf("%s=%s/%s", l.Name, *l.Spec.HolderIdentity, l.Annotations[lease.AnnotationPhase]))
		}
	}
	return out
}

// BusySlots lists the pool's held slots as HeldSlots does, but for stage
// slots whose holders are done with them: those stay held until the next
// stage grant hands them on (design.md, amendment 31), so a converged pool
// may keep them.
func (f *ProcFleet) BusySlots(ctx context.Context) []string {
	ls, err := f.Kube.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + f.Pool})
	if err != nil {
		return []string{"(" + err.Error() + ")"}
	}
	nodes, err := f.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return []string{"(" + err.Error() + ")"}
	}
	byName := map[string]corev1.Node{}
	for _, n := range nodes.Items {
		byName[n.Name] = n
	}
	bns := map[string]*fleetv1.BootcNode{}
	var list fleetv1.BootcNodeList
	if err := f.Env.Client.List(ctx, &list); err != nil {
		return []string{"(" + err.Error() + ")"}
	}
	for i := range list.Items {
		bns[list.Items[i].Name] = &list.Items[i]
	}
	var out []string
	for i := range ls.Items {
		l := &ls.Items[i]
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && !finishedStage(f.Pool, l, byName, bns) {
			out = append(out, fmt.Sprintf("%s=%s/%s", l.Name, *l.Spec.HolderIdentity, l.Annotations[lease.AnnotationPhase]))
		}
	}
	return out
}

// FirstSlotWriteAfter is the first slot Lease version of the pool the
// harness saw after t (zero when none).
func (f *ProcFleet) FirstSlotWriteAfter(t time.Time) time.Time {
	for _, e := range f.Log.Events() {
		if e.Kind == invariant.LeaseVersion && e.Pool == f.Pool && e.At.After(t) {
			return e.At
		}
	}
	return time.Time{}
}

// KillLeaders kills the leader kills times while the rollout runs: each
// time once the current leader has written a slot Lease since it started
// working, and then a delay drawn from seed (0.5-3 s), so every kill lands
// mid-rollout at a different step. It stops early once done() says the
// rollout is over. Each takeover is bounded by timeout.
func (f *ProcFleet) KillLeaders(ctx context.Context, seed int64, kills int, timeout time.Duration, done func() bool) ([]Takeover, error) {
	r := rand.New(rand.NewPCG(uint64(seed), 0xfa11))
	var out []Takeover
	for i := 0; i < kills; i++ {
		_, working, err := f.WaitLeader(ctx, nil, timeout)
		if err != nil {
			return out, err
		}
		if !WaitFor(ctx, timeout, func() bool { return done() || !f.FirstSlotWriteAfter(working).IsZero() }) {
			return out, fmt.Errorf("kill %d: the leader wrote no slot Lease within %s", i+1, timeout)
		}
		delay := time.Duration(500+r.IntN(2500)) * time.Millisecond
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return out, ctx.Err()
		}
		if done() {
			return out, nil
		}
		t, err := f.KillLeader(ctx, timeout)
		if err != nil {
			return out, fmt.Errorf("kill %d: %w", i+1, err)
		}
		out = append(out, t)
	}
	return out, nil
}

// FillFirstWrites completes each takeover's FirstWrite from the event log.
func (f *ProcFleet) FillFirstWrites(ts []Takeover) {
	for i := range ts {
		w := ts[i].At.Add(ts[i].Working)
		if at := f.FirstSlotWriteAfter(w); !at.IsZero() {
			ts[i].FirstWrite = at.Sub(ts[i].At)
		}
	}
}
