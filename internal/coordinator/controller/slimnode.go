package controller

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
)

// slimNode keeps of a cached Node what the coordinator reads (metadata
// without managedFields, the spec, the conditions and nodeInfo) and drops
// the rest of its status. A kubelet reports up to 50 images with every name
// and size (nodeStatusMaxImages), often tens of kilobytes per Node, and
// volumes, addresses, capacities and runtime handlers besides: at 5,000
// nodes that is hundreds of megabytes the planner never looks at. Writes
// never rest on the slim copy: cordon and uncordon send a merge patch of
// two fields, conditional on its resourceVersion.
func slimNode() cache.TransformFunc {
	strip := crcache.TransformStripManagedFields()
	return func(in any) (any, error) {
		n, ok := in.(*corev1.Node)
		if !ok {
			return strip(in)
		}
		n.ManagedFields = nil
		n.Status = corev1.NodeStatus{Conditions: n.Status.Conditions, NodeInfo: n.Status.NodeInfo}
		return n, nil
	}
}
