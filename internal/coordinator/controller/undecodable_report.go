package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// noteUndecodable names on the pool's new status, and in a Warning Event
// once per version, the objects of the pool the cache set aside; with none
// the condition goes.
func (r *poolReconciler) noteUndecodable(pool *fleetv1.BootcNodePool, st *fleetv1.BootcNodePoolStatus) {
	us := r.undecodable.ofPool(pool.Name)
	if len(us) == 0 {
		meta.RemoveStatusCondition(&st.Conditions, fleetv1.PoolObjectsReadable)
		return
	}
	for _, u := range us {
		if r.undecodable.unreported(u) {
			r.recorder.Eventf(pool, nil, corev1.EventTypeWarning, fleetv1.ReasonUndecodableObject, "Read", "%s", u.String())
		}
	}
	setCondition(st, fleetv1.PoolObjectsReadable, metav1.ConditionFalse, fleetv1.ReasonUndecodableObject,
		undecodableMessage(us)+": the coordinator leaves it out until it decodes", pool.Generation)
	sort.Slice(st.Conditions, func(i, j int) bool { return st.Conditions[i].Type < st.Conditions[j].Type })
}

// reportUndecodablePool names an undecodable pool on itself: a Warning
// Event, and the ObjectsReadable condition written with a merge patch of
// the unstructured status, which needs no decoding (ratcheting lets the
// API server take it even when the stored pool breaks today's schema).
func (r *poolReconciler) reportUndecodablePool(ctx context.Context, u undecodable) error {
	stub := &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: u.name, UID: types.UID(u.uid)}}
	stub.SetGroupVersionKind(fleetv1.GroupVersion.WithKind(kindPool))
	if r.undecodable.unreported(u) {
		r.recorder.Eventf(stub, nil, corev1.EventTypeWarning, fleetv1.ReasonUndecodableObject, "Read", "%s", u.String())
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(fleetv1.GroupVersion.WithKind(kindPool))
	if err := r.apiReader.Get(ctx, client.ObjectKey{Name: u.name}, obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	msg := undecodableMessage([]undecodable{u}) + ": the coordinator leaves this pool alone until it decodes"
	status, _, _ := unstructured.NestedMap(obj.Object, "status")
	if status == nil {
		status = map[string]any{}
	}
	conds, _, _ := unstructured.NestedSlice(status, "conditions")
	var kept []any
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m != nil && m["type"] == fleetv1.PoolObjectsReadable {
			if m["status"] == string(metav1.ConditionFalse) && m["message"] == msg {
				return nil // already says so
			}
			continue
		}
		kept = append(kept, c)
	}
	kept = append(kept, map[string]any{
		"type": fleetv1.PoolObjectsReadable, "status": string(metav1.ConditionFalse), "reason": fleetv1.ReasonUndecodableObject,
		"message": msg, "lastTransitionTime": metav1.NewTime(r.opts.Clock()).UTC().Format("2006-01-02T15:04:05Z"),
		"observedGeneration": obj.GetGeneration(),
	})
	patch := map[string]any{"conditions": kept}
	// The counts the schema requires, when the pool never had a status.
	for _, f := range []string{"nodes", "updated", "staging", "staged", "rebooting", "degraded", "waiting"} {
		if _, ok := status[f]; !ok {
			patch[f] = 0
		}
	}
	data, err := json.Marshal(map[string]any{"status": patch})
	if err != nil {
		return err
	}
	if err := r.client.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, data)); err != nil {
		return fmt.Errorf("naming the undecodable pool %s on its status: %w", u.name, err)
	}
	return nil
}
