package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// kube is the agent's view of the API server: an informer on its own
// BootcNode (field selector) and one on the Leases labelled with its name.
// Nothing else is read or written.
type kube struct {
	node   string
	leases kubernetes.Interface
	fleet  rest.Interface

	nodeInf, leaseInf cache.SharedIndexInformer

	pokes chan struct{}
}

func newKube(cfg *rest.Config, node string) (*kube, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := fleetv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	fc := rest.CopyConfig(cfg)
	fc.GroupVersion = &fleetv1.GroupVersion
	fc.APIPath = "/apis"
	fc.ContentType = runtime.ContentTypeJSON
	fc.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if fc.UserAgent == "" {
		fc.UserAgent = "bootc-fleet-agent/" + node
	}
	fleet, err := rest.RESTClientFor(fc)
	if err != nil {
		return nil, err
	}
	k := &kube{node: node, leases: cs, fleet: fleet, pokes: make(chan struct{}, 1)}
	nodeLW := cache.NewListWatchFromClient(fleet, "bootcnodes", metav1.NamespaceAll,
		fields.OneTermEqualSelector("metadata.name", node))
	k.nodeInf = cache.NewSharedIndexInformer(nodeLW, &fleetv1.BootcNode{}, 0, cache.Indexers{})
	leaseLW := cache.NewFilteredListWatchFromClient(cs.CoordinationV1().RESTClient(), "leases", lease.Namespace,
		func(o *metav1.ListOptions) { o.LabelSelector = lease.LabelHolder + "=" + node })
	k.leaseInf = cache.NewSharedIndexInformer(leaseLW, &coordinationv1.Lease{}, 0, cache.Indexers{})
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { k.poke() },
		UpdateFunc: func(any, any) { k.poke() },
		DeleteFunc: func(any) { k.poke() },
	}
	if _, err := k.nodeInf.AddEventHandler(h); err != nil {
		return nil, err
	}
	if _, err := k.leaseInf.AddEventHandler(h); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *kube) poke() {
	select {
	case k.pokes <- struct{}{}:
	default:
	}
}

// start runs the informers until ctx ends. Informers re-list after a watch
// breaks, so an API outage heals by itself; grants meanwhile age out through
// the agent's own renew time.
func (k *kube) start(ctx context.Context) {
	go k.nodeInf.RunWithContext(ctx)
	go k.leaseInf.RunWithContext(ctx)
}

// synced: both informers listed successfully at least once.
func (k *kube) synced() bool { return k.nodeInf.HasSynced() && k.leaseInf.HasSynced() }

// bootcNode returns the cached BootcNode, or nil.
func (k *kube) bootcNode() *fleetv1.BootcNode {
	for _, o := range k.nodeInf.GetStore().List() {
		if n, ok := o.(*fleetv1.BootcNode); ok && n.Name == k.node {
			return n
		}
	}
	return nil
}

// cachedLeases returns the cached Leases labelled with this node.
func (k *kube) cachedLeases() []*coordinationv1.Lease {
	var out []*coordinationv1.Lease
	for _, o := range k.leaseInf.GetStore().List() {
		if l, ok := o.(*coordinationv1.Lease); ok {
			out = append(out, l)
		}
	}
	return out
}

// renew reads the Lease fresh and updates its renewTime (nothing else) on
// the object just read, so a concurrent change by the coordinator makes the
// update fail with a conflict instead of being overwritten. It returns the
// updated Lease.
func (k *kube) renew(ctx context.Context, name string, now time.Time) (fresh, updated *coordinationv1.Lease, err error) {
	leases := k.leases.CoordinationV1().Leases(lease.Namespace)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	fresh = l.DeepCopy()
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != k.node {
		return fresh, nil, nil // no longer ours: nothing to renew
	}
	l.Spec.RenewTime = &metav1.MicroTime{Time: now}
	u, err := leases.Update(ctx, l, metav1.UpdateOptions{})
	return fresh, u, err
}

// patchStatus writes the whole agent-owned status with a merge patch on the
// status subresource. Every field is present (null when empty), so a field
// the agent no longer reports is removed rather than left stale.
func (k *kube) patchStatus(ctx context.Context, st statusReport) error {
	body, err := json.Marshal(map[string]any{"status": st.fields()})
	if err != nil {
		return err
	}
	err = k.fleet.Patch(types.MergePatchType).Resource("bootcnodes").Name(k.node).SubResource("status").
		Body(body).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("patching BootcNode %s status: %w", k.node, err)
	}
	return nil
}

// statusReport is what the agent reports in BootcNode.status.
type statusReport struct {
	ObservedGeneration int64
	BootID             string
	SoftRebootCount    uint32
	Booted             *fleetv1.Deployment
	Staged             *fleetv1.Deployment
	Rollback           *fleetv1.Deployment
	Phase              fleetv1.NodePhase
	Reason             string
	Message            string
	Conditions         []metav1.Condition
	AgentVersion       string
	LastReportTime     time.Time
}

func (s statusReport) fields() map[string]any {
	dep := func(d *fleetv1.Deployment) any {
		if d == nil {
			return nil
		}
		return d
	}
	conds := s.Conditions
	if conds == nil {
		conds = []metav1.Condition{}
	}
	return map[string]any{
		"observedGeneration": s.ObservedGeneration,
		"bootID":             s.BootID,
		"softRebootCount":    s.SoftRebootCount,
		"booted":             dep(s.Booted),
		"staged":             dep(s.Staged),
		"rollback":           dep(s.Rollback),
		"phase":              s.Phase,
		"reason":             s.Reason,
		"message":            s.Message,
		"conditions":         conds,
		"agentVersion":       s.AgentVersion,
		"lastReportTime":     metav1.NewTime(s.LastReportTime),
	}
}

// sameAs compares two reports, ignoring the report time.
func (s statusReport) sameAs(o statusReport) bool {
	a, _ := json.Marshal(s.withoutTime())
	b, _ := json.Marshal(o.withoutTime())
	return string(a) == string(b)
}

func (s statusReport) withoutTime() map[string]any {
	f := s.fields()
	delete(f, "lastReportTime")
	return f
}
