// Package integration tests bootc-fleet-agent against real parts: a real
// kube-apiserver, a private dbus-daemon with fake logind/systemd1, a real
// NOTIFY_SOCKET and the test bootc. This file plays the coordinator: it
// writes BootcNodes and slot Leases exactly as the protocol says, so tests
// of the agent (in this package and in internal/agent) can grant and revoke.
package integration

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Coordinator writes what the coordinator would write, through c.
type Coordinator struct {
	C    client.Client
	Pool string
	// LeaseSeconds is leaseDurationSeconds of grants (default 30).
	LeaseSeconds int32
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

// Grant gives slot i of kind to node for image in bootID (phase only for
// reboot slots), creating the slot Lease if needed. It returns the grant's
// identity.
func (k *Coordinator) Grant(ctx context.Context, kind lease.Kind, i int, node, image, bootID string, phase lease.Phase) (lease.ID, error) {
	name := lease.SlotName(k.Pool, kind, i)
	l := &coordinationv1.Lease{}
	err := k.C.Get(ctx, client.ObjectKey{Namespace: lease.Namespace, Name: name}, l)
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
			Namespace: lease.Namespace, Name: name,
			Labels: map[string]string{lease.LabelPool: k.Pool, lease.LabelSlot: string(kind)},
		}}
		if err := k.C.Create(ctx, l); err != nil {
			return lease.ID{}, err
		}
	} else if err != nil {
		return lease.ID{}, err
	}
	now := metav1.NewMicroTime(time.Now())
	secs := k.LeaseSeconds
	if secs == 0 {
		secs = 30
	}
	transitions := int32(0)
	if l.Spec.LeaseTransitions != nil {
		transitions = *l.Spec.LeaseTransitions
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != node {
		transitions++
	}
	l.Spec.HolderIdentity = ptr.To(node)
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	l.Spec.LeaseDurationSeconds = ptr.To(secs)
	l.Spec.LeaseTransitions = ptr.To(transitions)
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[lease.LabelHolder] = node
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[lease.AnnotationImage] = image
	l.Annotations[lease.AnnotationBootID] = bootID
	delete(l.Annotations, lease.AnnotationPhase)
	if kind == lease.KindReboot {
		l.Annotations[lease.AnnotationPhase] = string(phase)
	}
	if err := k.C.Update(ctx, l); err != nil {
		return lease.ID{}, err
	}
	return lease.ID{Lease: name, UID: l.UID, Transitions: transitions}, nil
}

// SetPhase moves a held reboot slot to phase.
func (k *Coordinator) SetPhase(ctx context.Context, i int, phase lease.Phase) error {
	return k.update(ctx, lease.SlotName(k.Pool, lease.KindReboot, i), func(l *coordinationv1.Lease) {
		l.Annotations[lease.AnnotationPhase] = string(phase)
	})
}

// Revoke frees slot i of kind.
func (k *Coordinator) Revoke(ctx context.Context, kind lease.Kind, i int) error {
	return k.update(ctx, lease.SlotName(k.Pool, kind, i), func(l *coordinationv1.Lease) {
		l.Spec.HolderIdentity = nil
		l.Spec.AcquireTime, l.Spec.RenewTime = nil, nil
		delete(l.Labels, lease.LabelHolder)
		for _, a := range []string{lease.AnnotationImage, lease.AnnotationBootID, lease.AnnotationSoftRebootCount, lease.AnnotationPhase, lease.AnnotationFailure} {
			delete(l.Annotations, a)
		}
	})
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
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
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
		for _, g := range s.Grants {
			if g.Lease == id.Lease && g.UID == id.UID && g.LeaseTransitions == id.Transitions && g.Released == released {
				return true
			}
		}
		return false
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
