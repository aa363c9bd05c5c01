package controller

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// slimNode keeps of a cached Node what the coordinator reads and drops the
// rest: of the metadata, managedFields, ownerReferences and the annotations
// of others (it reads its own, under fleet.bootc.dev/, and the autoscalers'
// marks it records and restores, lease.AutoscalerMarks); of the spec,
// unschedulable; of the status, the Ready condition's type and status and
// nodeInfo's boot ID, operating system and architecture. A kubelet reports
// up to 50 images with every name and size (nodeStatusMaxImages), often tens
// of kilobytes per Node, five conditions with their messages, volumes,
// addresses, capacities and runtime handlers besides, and network plugins
// and CSI drivers annotate Nodes with kilobytes more: at 5,000 nodes that is
// hundreds of megabytes the planner never looks at. Writes never rest on
// the slim copy: cordon, uncordon and the autoscaler marks send a merge
// patch of the fields they change, conditional on its resourceVersion.
// What Nodes share (labels, annotations, platform) is interned (intern.go).
func slimNode() cache.TransformFunc {
	strip := crcache.TransformStripManagedFields()
	return func(in any) (any, error) {
		n, ok := in.(*corev1.Node)
		if !ok {
			return strip(in)
		}
		n.ManagedFields, n.OwnerReferences = nil, nil
		n.Annotations = ownAnnotations(n.Annotations)
		internMeta(&n.ObjectMeta)
		n.Spec = corev1.NodeSpec{Unschedulable: n.Spec.Unschedulable}
		var ready []corev1.NodeCondition
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				ready = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: internUID(c.Status)}}
				break
			}
		}
		info := n.Status.NodeInfo
		n.Status = corev1.NodeStatus{Conditions: ready, NodeInfo: corev1.NodeSystemInfo{
			BootID: info.BootID, OperatingSystem: intern(info.OperatingSystem), Architecture: intern(info.Architecture)}}
		return n, nil
	}
}

// ownAnnotations are the annotations of a Node the coordinator reads (nil
// when there are none).
func ownAnnotations(all map[string]string) map[string]string {
	var out map[string]string
	for k, v := range all {
		if !strings.HasPrefix(k, fleetv1.GroupVersion.Group+"/") && !slices.Contains(lease.AutoscalerMarks, k) {
			continue
		}
		if out == nil {
			out = make(map[string]string, 4)
		}
		out[k] = v
	}
	return out
}
