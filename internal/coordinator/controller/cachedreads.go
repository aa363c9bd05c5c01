package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// A pass reads the Nodes and BootcNodes the informers hold, not copies:
// client.List, even without a deep copy, copies every object's struct into
// the list it returns (784 bytes a Node, 512 a BootcNode), which at 5,000
// nodes made each pass build and drop megabytes for a read. A pass only
// reads these objects: every write starts from a DeepCopy or sends a patch
// of its own fields (TestPassLeavesCachedObjectsAsTheyWere checks it against
// a real API server), and the informer replaces an object on an update, it
// never changes one in place.

// storeOf is the informer's store of obj's kind, or nil when the cache's
// informer does not give one (then the caller lists through the client).
func storeOf(ctx context.Context, c cache.Cache, obj client.Object) (toolscache.Store, error) {
	if c == nil {
		return nil, nil
	}
	inf, err := c.GetInformer(ctx, obj)
	if err != nil {
		return nil, err
	}
	if s, ok := inf.(interface{ GetStore() toolscache.Store }); ok {
		return s.GetStore(), nil
	}
	return nil, nil
}

// cachedNodes are the cache's Nodes (read only).
func (r *poolReconciler) cachedNodes(ctx context.Context) ([]*corev1.Node, error) {
	store, err := storeOf(ctx, r.cache, &corev1.Node{})
	if err != nil {
		return nil, err
	}
	if store != nil {
		return storeItems[corev1.Node](store)
	}
	var list corev1.NodeList
	if err := r.client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	return pointers(list.Items), nil
}

// cachedBootcNodes are the cache's BootcNodes (read only).
func (r *poolReconciler) cachedBootcNodes(ctx context.Context) ([]*fleetv1.BootcNode, error) {
	store, err := storeOf(ctx, r.cache, &fleetv1.BootcNode{})
	if err != nil {
		return nil, fmt.Errorf("listing BootcNodes: %w", err)
	}
	if store != nil {
		return storeItems[fleetv1.BootcNode](store)
	}
	var list fleetv1.BootcNodeList
	if err := r.client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing BootcNodes: %w", err)
	}
	return pointers(list.Items), nil
}

func storeItems[T any](store toolscache.Store) ([]*T, error) {
	objs := store.List()
	out := make([]*T, 0, len(objs))
	for _, o := range objs {
		t, ok := o.(*T)
		if !ok {
			return nil, fmt.Errorf("cache holds %T where %T was expected", o, out)
		}
		out = append(out, t)
	}
	return out, nil
}

func pointers[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}
