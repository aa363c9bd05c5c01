package sim

import (
	"context"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// Record watches every slot Lease and every Node and logs each new version
// of a Lease and each change of a Node's cordon, in the API server's order,
// until ctx ends. poolOf maps a node to its pool. It returns once both
// watches are established.
func Record(ctx context.Context, c kubernetes.Interface, log *Log, poolOf func(node string) string) error {
	leases, err := c.CoordinationV1().Leases(lease.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range leases.Items {
		logLease(log, &leases.Items[i])
	}
	cordoned := map[string]bool{}
	for _, n := range nodes.Items {
		cordoned[n.Name] = n.Spec.Unschedulable
		if n.Spec.Unschedulable {
			log.Add(invariant.Event{Kind: invariant.Cordon, Node: n.Name, Pool: poolOf(n.Name)})
		}
	}
	lw, err := watchtools.NewRetryWatcherWithContext(ctx, leases.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.CoordinationV1().Leases(lease.Namespace).Watch(ctx, o)
		}})
	if err != nil {
		return err
	}
	nw, err := watchtools.NewRetryWatcherWithContext(ctx, nodes.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.CoreV1().Nodes().Watch(ctx, o)
		}})
	if err != nil {
		return err
	}
	go func() {
		defer lw.Stop()
		for ev := range lw.ResultChan() {
			if l, ok := ev.Object.(*coordinationv1.Lease); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				logLease(log, l)
			}
		}
	}()
	go func() {
		defer nw.Stop()
		for ev := range nw.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok || ev.Type == watch.Bookmark {
				continue
			}
			now := n.Spec.Unschedulable && ev.Type != watch.Deleted
			if now != cordoned[n.Name] {
				cordoned[n.Name] = now
				kind := invariant.Uncordon
				if now {
					kind = invariant.Cordon
				}
				log.Add(invariant.Event{Kind: kind, Node: n.Name, Pool: poolOf(n.Name)})
			}
		}
	}()
	return nil
}

func logLease(log *Log, l *coordinationv1.Lease) {
	pool, kind, _, err := lease.ParseSlotName(l.Name)
	if err != nil {
		return
	}
	rv, _ := strconv.ParseInt(l.ResourceVersion, 10, 64)
	e := invariant.Event{Kind: invariant.LeaseVersion, Pool: pool, Lease: l.Name, RV: rv, Slot: kind}
	if g, err := lease.Parse(l); err == nil {
		e.Holder, e.Node, e.Image, e.BootID, e.SoftRebootCount, e.Phase = g.Holder, g.Holder, g.Image.String(), g.BootID, g.SoftRebootCount, g.Phase
		e.Acquired = g.Acquired
	}
	e.ReleasedAt, _ = time.Parse(time.RFC3339Nano, l.Annotations[lease.AnnotationReleasedAt])
	log.Add(e)
}
