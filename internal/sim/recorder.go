package sim

import (
	"context"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
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
			log.Add(invariant.Event{Kind: invariant.Cordon, Node: n.Name, Pool: poolOf(n.Name), RV: nodeRV(&n)})
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
				log.Add(invariant.Event{Kind: kind, Node: n.Name, Pool: poolOf(n.Name), RV: nodeRV(n)})
			}
		}
	}()
	return nil
}

// nodeRV is the Node's resourceVersion, which orders its cordon against
// Lease versions (one etcd revision counter for both).
func nodeRV(n *corev1.Node) int64 {
	rv, _ := strconv.ParseInt(n.ResourceVersion, 10, 64)
	return rv
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
		e.Acquired, e.Rollback = g.Acquired, g.Rollback
	}
	e.ReleasedAt, _ = time.Parse(time.RFC3339Nano, l.Annotations[lease.AnnotationReleasedAt])
	log.Add(e)
}

// RecordPools watches every BootcNodePool and logs each change of its
// spec.image (PoolImage) and each new status.quarantine (Quarantine), with
// the pool's resourceVersion, until ctx ends: what I6 needs to tell when a
// digest was quarantined and while spec.image still named the same image.
// It returns once the watch is established.
func RecordPools(ctx context.Context, dyn dynamic.Interface, log *Log) error {
	res := dyn.Resource(fleetv1.GroupVersion.WithResource("bootcnodepools"))
	list, err := res.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	seen := map[string]poolSeen{}
	for i := range list.Items {
		logPool(log, seen, &list.Items[i], false)
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.GetResourceVersion(), &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return res.Watch(ctx, o)
		}})
	if err != nil {
		return err
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if u, ok := ev.Object.(*unstructured.Unstructured); ok && ev.Type != watch.Bookmark && ev.Type != watch.Error {
				logPool(log, seen, u, ev.Type == watch.Deleted)
			}
		}
	}()
	return nil
}

// poolSeen is what RecordPools last logged of a pool.
type poolSeen struct{ image, quarantine string }

func logPool(log *Log, seen map[string]poolSeen, u *unstructured.Unstructured, deleted bool) {
	name := u.GetName()
	if deleted {
		delete(seen, name)
		return
	}
	rv, _ := strconv.ParseInt(u.GetResourceVersion(), 10, 64)
	image, _, _ := unstructured.NestedString(u.Object, "spec", "image")
	specImage, _, _ := unstructured.NestedString(u.Object, "status", "quarantine", "specImage")
	digest, _, _ := unstructured.NestedString(u.Object, "status", "quarantine", "digest")
	s := seen[name]
	if image != s.image {
		log.Add(invariant.Event{Kind: invariant.PoolImage, Pool: name, RV: rv, Detail: image})
	}
	q := ""
	if digest != "" {
		q = specImage + " " + digest
	}
	if q != "" && q != s.quarantine {
		log.Add(invariant.Event{Kind: invariant.Quarantine, Pool: name, RV: rv, Image: digest, Detail: specImage})
	}
	seen[name] = poolSeen{image: image, quarantine: q}
}
