// Package testcoord plays the coordinator in tests of bootc-fleet-agent (in
// internal/agent, internal/agent/integration and tests/e2e): it writes
// BootcNodes, and slot Leases through the api/lease codec the coordinator
// writes them with, so those tests can grant, advance and revoke exactly as
// the protocol says.
package testcoord

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Coordinator writes what the coordinator would write, through c.
type Coordinator struct {
	C    client.Client
	Pool string
	// LeaseSeconds is leaseDurationSeconds of grants (default 30).
	LeaseSeconds int32
	// StageTimeout is what stage grants carry (default
	// lease.DefaultStageTimeout, as a pool's spec.rollout.stageTimeout).
	StageTimeout time.Duration
}

// EnsureBootcNode creates (or updates the spec of) node's BootcNode.
func (k *Coordinator) EnsureBootcNode(ctx context.Context, node, desired string, policy fleetv1.RebootPolicy) error {
	if policy == "" {
		policy = fleetv1.RebootPolicyReboot
	}
	for range 10 {
		bn := &fleetv1.BootcNode{}
		err := k.C.Get(ctx, client.ObjectKey{Name: node}, bn)
		if apierrors.IsNotFound(err) {
			bn = &fleetv1.BootcNode{
				ObjectMeta: metav1.ObjectMeta{Name: node},
				Spec:       fleetv1.BootcNodeSpec{Pool: k.Pool, DesiredImage: desired, RebootPolicy: policy},
			}
			return k.C.Create(ctx, bn)
		}
		if err != nil {
			return err
		}
		bn.Spec.DesiredImage, bn.Spec.RebootPolicy = desired, policy
		err = k.C.Update(ctx, bn)
		if !apierrors.IsConflict(err) { // the agent's status writes may race us
			return err
		}
	}
	return fmt.Errorf("updating BootcNode %s: too many conflicts", node)
}

// Grant gives slot i of kind to node for image in bootID (soft-reboot count
// 0), creating the slot Lease if needed, as the coordinator does
// (lease.Issue): every grant is a new one (leaseTransitions counts it), a
// stage grant carries StageTimeout, a reboot grant starts in phase Draining
// with its cordon pending. phase Reboot then advances it at once
// (SetPhase). It returns the grant's identity.
func (k *Coordinator) Grant(ctx context.Context, kind lease.Kind, i int, node, image, bootID string, phase lease.Phase) (lease.ID, error) {
	img, err := imageref.ParsePinned(image)
	if err != nil {
		return lease.ID{}, err
	}
	return k.issue(ctx, i, lease.Terms{Kind: kind, Holder: node, Image: img, BootID: bootID, StageTimeout: k.stageTimeout()}, phase)
}

// GrantRollback gives reboot slot i to node as a rollback grant for image
// (its rollback deployment) in bootID, in phase Reboot, as the coordinator
// re-issues a failed update grant (docs/design.md, amendment 25).
func (k *Coordinator) GrantRollback(ctx context.Context, i int, node, image, bootID string) (lease.ID, error) {
	img, err := imageref.ParsePinned(image)
	if err != nil {
		return lease.ID{}, err
	}
	return k.issue(ctx, i, lease.Terms{Kind: lease.KindReboot, Holder: node, Image: img, BootID: bootID, Rollback: true}, lease.PhaseReboot)
}

func (k *Coordinator) issue(ctx context.Context, i int, t lease.Terms, phase lease.Phase) (lease.ID, error) {
	l := &coordinationv1.Lease{}
	err := k.C.Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: lease.SlotName(k.Pool, t.Kind, i)}, l)
	if apierrors.IsNotFound(err) {
		l = lease.NewSlot(k.Pool, t.Kind, i)
		if err := k.C.Create(ctx, l); err != nil {
			return lease.ID{}, err
		}
	} else if err != nil {
		return lease.ID{}, err
	}
	now := time.Now()
	secs := k.LeaseSeconds
	if secs == 0 {
		secs = 30
	}
	g := lease.Issue(l, t, now, time.Duration(secs)*time.Second)
	if t.Kind == lease.KindReboot && phase == lease.PhaseReboot {
		lease.Advance(l, false, now) // this coordinator cordons nothing
	}
	if err := k.C.Update(ctx, l); err != nil {
		return lease.ID{}, err
	}
	return g.ID, nil
}

func (k *Coordinator) stageTimeout() time.Duration {
	if k.StageTimeout == 0 {
		return lease.DefaultStageTimeout
	}
	return k.StageTimeout
}

// SetPhase moves held reboot slot i to phase, which must be Reboot: the
// coordinator advances a drained grant (lease.Advance). This coordinator
// cordons nothing, so the grant records the cordon as not ours.
func (k *Coordinator) SetPhase(ctx context.Context, i int, phase lease.Phase) error {
	if phase != lease.PhaseReboot {
		return fmt.Errorf("a reboot grant only advances to phase %s, not %q", lease.PhaseReboot, phase)
	}
	return k.update(ctx, lease.SlotName(k.Pool, lease.KindReboot, i), func(l *coordinationv1.Lease) {
		lease.Advance(l, false, time.Now())
	})
}

// Revoke frees slot i of kind (lease.Clear).
func (k *Coordinator) Revoke(ctx context.Context, kind lease.Kind, i int) error {
	return k.update(ctx, lease.SlotName(k.Pool, kind, i), lease.Clear)
}

// Lease returns slot i of kind.
func (k *Coordinator) Lease(ctx context.Context, kind lease.Kind, i int) (*coordinationv1.Lease, error) {
	l := &coordinationv1.Lease{}
	err := k.C.Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: lease.SlotName(k.Pool, kind, i)}, l)
	return l, err
}

// PutLease creates or replaces a Lease as given (for malformed grants).
func (k *Coordinator) PutLease(ctx context.Context, l *coordinationv1.Lease) error {
	err := k.C.Create(ctx, l)
	if apierrors.IsAlreadyExists(err) {
		cur := &coordinationv1.Lease{}
		if err := k.C.Get(ctx, client.ObjectKeyFromObject(l), cur); err != nil {
			return err
		}
		l.ResourceVersion = cur.ResourceVersion
		return k.C.Update(ctx, l)
	}
	return err
}

func (k *Coordinator) update(ctx context.Context, name string, fn func(*coordinationv1.Lease)) error {
	for range 10 {
		l := &coordinationv1.Lease{}
		if err := k.C.Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: name}, l); err != nil {
			return err
		}
		fn(l)
		err := k.C.Update(ctx, l)
		if !apierrors.IsConflict(err) { // an admin or a test may race us
			return err
		}
	}
	return fmt.Errorf("updating lease %s: too many conflicts", name)
}

// Status returns node's BootcNode status.
func (k *Coordinator) Status(ctx context.Context, node string) (fleetv1.BootcNodeStatus, error) {
	bn := &fleetv1.BootcNode{}
	err := k.C.Get(ctx, client.ObjectKey{Name: node}, bn)
	return bn.Status, err
}

// WaitStatus polls node's status until ok returns true or ctx ends; it
// returns the last status seen.
func (k *Coordinator) WaitStatus(ctx context.Context, node string, ok func(fleetv1.BootcNodeStatus) bool) (fleetv1.BootcNodeStatus, error) {
	var last fleetv1.BootcNodeStatus
	for {
		st, err := k.Status(ctx, node)
		if err == nil {
			last = st
			if ok(st) {
				return st, nil
			}
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("waiting for BootcNode %s: %w (last phase %s/%s: %s)", node, ctx.Err(), last.Phase, last.Reason, last.Message)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// HasLine reports whether one line of log contains every part.
func HasLine(log string, parts ...string) bool {
	for _, line := range strings.Split(log, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// PhaseIs matches a status phase (and reason, when given).
func PhaseIs(p fleetv1.NodePhase, reason string) func(fleetv1.BootcNodeStatus) bool {
	return func(s fleetv1.BootcNodeStatus) bool { return s.Phase == p && (reason == "" || s.Reason == reason) }
}

// Lists matches a status that lists grant id with the given release reason
// ("" while the agent uses it).
func Lists(id lease.ID, released string) func(fleetv1.BootcNodeStatus) bool {
	return func(s fleetv1.BootcNodeStatus) bool {
		g, ok := lease.FindClaim(s.Grants, id)
		return ok && g.Released == released
	}
}

// SetRequireSignedImages sets node's spec.requireSignedImages, as the
// coordinator copies it from the pool (amendment 14).
func (k *Coordinator) SetRequireSignedImages(ctx context.Context, node string, on bool) error {
	for range 10 {
		bn := &fleetv1.BootcNode{}
		if err := k.C.Get(ctx, client.ObjectKey{Name: node}, bn); err != nil {
			return err
		}
		bn.Spec.RequireSignedImages = on
		err := k.C.Update(ctx, bn)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
	return fmt.Errorf("updating BootcNode %s: too many conflicts", node)
}
