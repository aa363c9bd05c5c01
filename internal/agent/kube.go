package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/slotview"
)

// kube is the agent's view of the API server (API): an informer on its own
// BootcNode (field selector), one on each slot Lease the BootcNode names
// (slotview, amendment 39), consistent reads of single Leases, and patches
// of its own BootcNode's status. It writes nothing else: no Lease
// (docs/design.md, amendment 8).
type kube struct {
	node   string
	host   string
	leases rest.Interface // coordination.k8s.io/v1
	fleet  rest.Interface

	nodeInf cache.SharedIndexInformer
	slots   *slotview.View

	pokes chan struct{}

	mu       sync.Mutex
	listErrs map[string]listErr // by informer: the last list/watch failure
}

// listErr is an informer's failure and the version it had synced to then:
// once the informer moves past that version, a later list or watch worked.
type listErr struct {
	err error
	inf cache.SharedIndexInformer
	rv  string
}

func newKube(cfg *rest.Config, node string) (*kube, error) {
	fc := rest.CopyConfig(cfg)
	if fc.UserAgent == "" {
		fc.UserAgent = "bootc-fleet-agent/" + node
	}
	leases, err := newLeaseClient(fc)
	if err != nil {
		return nil, err
	}
	fleet, err := fleetv1.NewRESTClient(fc)
	if err != nil {
		return nil, err
	}
	k := &kube{node: node, host: cfg.Host, leases: leases, fleet: fleet, pokes: make(chan struct{}, 1),
		listErrs: map[string]listErr{}}
	nodeLW := cache.NewListWatchFromClient(fleet, "bootcnodes", metav1.NamespaceAll,
		fields.OneTermEqualSelector("metadata.name", node))
	nodeFC := &fromCache{ListWatch: nodeLW}
	k.nodeInf = cache.NewSharedIndexInformer(nodeFC, &fleetv1.BootcNode{}, 0, cache.Indexers{})
	nodeFC.synced = k.nodeInf.HasSynced
	k.slots = slotview.New(leases, node, func(lw *cache.ListWatch) cache.SharedIndexInformer {
		fc := &fromCache{ListWatch: lw}
		inf := cache.NewSharedIndexInformer(fc, &coordinationv1.Lease{}, 0, cache.Indexers{})
		fc.synced = inf.HasSynced
		k.onWatchError("leases", inf)
		return inf
	}, k.poke)
	// The agent's own status writes change its BootcNode too; only a spec
	// change (a new generation) is news to the agent, and a change of the
	// slots it names is news to its Lease view (which pokes once the new
	// informers have synced).
	if _, err := k.nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) {
			k.follow()
			k.poke()
		},
		UpdateFunc: func(old, cur any) {
			a, okA := old.(*fleetv1.BootcNode)
			b, okB := cur.(*fleetv1.BootcNode)
			if okA && okB && a.Annotations[fleetv1.AnnotationSlots] != b.Annotations[fleetv1.AnnotationSlots] {
				k.follow()
			}
			if !okA || !okB || a.Generation != b.Generation || a.DeletionTimestamp != b.DeletionTimestamp {
				k.poke()
			}
		},
		DeleteFunc: func(any) {
			k.follow()
			k.poke()
		},
	}); err != nil {
		return nil, err
	}
	if err := k.onWatchError("bootcnodes", k.nodeInf); err != nil {
		return nil, err
	}
	return k, nil
}

// onWatchError has inf's list and watch failures noted under name.
func (k *kube) onWatchError(name string, inf cache.SharedIndexInformer) error {
	return inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		k.noteListErr(name, inf, err)
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
}

// follow points the Lease view at what the cached BootcNode names.
func (k *kube) follow() { k.slots.Follow(k.BootcNode()) }

// fromCache starts an informer from the API server's watch cache. client-go
// opens an informer with a watch-list stream (sendInitialEvents) that, with
// no resourceVersion yet, is a consistent read: the watch cache first waits
// until etcd confirms it is current, and the API server asks etcd for that
// at most every 100 ms per resource. The nodes of one wave boot within that
// time of each other, and each agent's first view of its BootcNode and
// grants waited for it before the first report after the reboot, the one
// the coordinator releases the slot on. Until the informer first synced,
// the stream starts at resourceVersion 0 instead: the watch cache's current
// state, at once, in the same one request (a LIST at resourceVersion 0 where
// client-go lists instead). Later streams resume from the version last seen,
// as before. The view is a hint either way, as the watch that follows it is:
// every stage, unlock, rollback and reboot is confirmed with a consistent
// GET of its Lease first (docs/design.md, amendments 6 and 32).
type fromCache struct {
	*cache.ListWatch
	synced func() bool
}

func (f fromCache) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	if o.SendInitialEvents != nil && *o.SendInitialEvents && o.ResourceVersion == "" && !f.synced() {
		o.ResourceVersion = "0"
	}
	return f.ListWatch.WatchWithContext(ctx, o)
}

// Watch is WatchWithContext for callers without a context.
func (f fromCache) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return f.WatchWithContext(context.Background(), o)
}

// noteListErr remembers why an informer's list or watch failed, so the
// agent can say so (STATUS=, its BootcNode's APIAccess condition).
func (k *kube) noteListErr(informer string, inf cache.SharedIndexInformer, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.listErrs[informer] = listErr{err: err, inf: inf, rv: inf.LastSyncResourceVersion()}
	k.poke()
}

// ListErrors returns the informers' current failures: a failure is over once
// the informer synced past the version it had when it failed. A watch that
// merely broke after a good list heals by itself and is not reported.
func (k *kube) ListErrors() map[string]error {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string]error{}
	running := k.slots.Informers()
	for name, e := range k.listErrs {
		inf := e.inf
		if (inf.HasSynced() && inf.LastSyncResourceVersion() != e.rv) || (name == "leases" && !slices.Contains(running, inf)) {
			delete(k.listErrs, name) // healed, or an informer the view stopped
			continue
		}
		if !inf.HasSynced() || refused(e.err) {
			out[name] = e.err
		}
	}
	return out
}

// ClearListError forgets an informer's failure once a later request shows
// access works again (a status patch).
func (k *kube) ClearListError(informer string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.listErrs, informer)
}

func (k *kube) poke() {
	select {
	case k.pokes <- struct{}{}:
	default:
	}
}

// Start runs the informers until ctx ends. Informers re-list after a watch
// breaks, so an API outage heals by itself; grants meanwhile age out through
// the agent's own last accepted heartbeat.
func (k *kube) Start(ctx context.Context) {
	k.slots.Start(ctx)
	go k.nodeInf.RunWithContext(ctx)
	// The loop waits for Changed before it looks at Synced again, and an
	// informer's handlers run before it counts as synced (an informer that
	// lists nothing runs none): without this poke the agent's first
	// decision after a boot waited for its next 100 ms tick, on the path
	// from the boot to the report the coordinator releases the slot on.
	// The Lease view pokes once the informers it starts have synced.
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-k.nodeInf.HasSyncedChecker().Done():
		}
		k.follow()
		k.poke()
	}()
}

// Synced: the BootcNode informer listed successfully at least once, and so
// did every Lease informer it names.
func (k *kube) Synced() bool {
	if !k.nodeInf.HasSynced() {
		return false
	}
	k.follow()
	return k.slots.Synced()
}

// SlotsError says why the BootcNode's list of slots is not followed.
func (k *kube) SlotsError() error { return k.slots.Err() }

// BootcNode returns the cached BootcNode, or nil.
func (k *kube) BootcNode() *fleetv1.BootcNode {
	for _, o := range k.nodeInf.GetStore().List() {
		if n, ok := o.(*fleetv1.BootcNode); ok && n.Name == k.node {
			return n
		}
	}
	return nil
}

// Leases returns the cached Leases labelled with this node.
func (k *kube) Leases() []*coordinationv1.Lease { return k.slots.Leases() }

// ReadLease is a consistent read of one slot Lease: a GET without a
// resourceVersion, which the API server answers from etcd with a quorum
// read, never from its watch cache, so it reflects every write that
// completed before it (the informer's copy may lag behind).
func (k *kube) ReadLease(ctx context.Context, name string) (*coordinationv1.Lease, error) {
	l := &coordinationv1.Lease{}
	err := k.leases.Get().Namespace(lease.Namespace).Resource("leases").Name(name).Do(ctx).Into(l)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// newLeaseClient returns a REST client for coordination.k8s.io/v1 (JSON,
// typed Leases), the only built-in group the agent reads. The typed
// clientset (k8s.io/client-go/kubernetes) would serve the same requests but
// links in and registers every built-in API group and the discovery and
// OpenAPI clients: about half of the agent's binary, whose pages and init
// allocations made up most of its resident memory.
func newLeaseClient(cfg *rest.Config) (*rest.RESTClient, error) {
	scheme := runtime.NewScheme()
	if err := coordinationv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &coordinationv1.SchemeGroupVersion
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	return rest.RESTClientFor(c)
}

// Changed receives when the BootcNode's spec or one of this node's Leases
// changed, or an informer failed.
func (k *kube) Changed() <-chan struct{} { return k.pokes }

// Host is the API server's address.
func (k *kube) Host() string { return k.host }

// PatchStatus sends a merge patch to this node's BootcNode status.
func (k *kube) PatchStatus(ctx context.Context, body []byte) error {
	err := k.fleet.Patch(types.MergePatchType).Resource("bootcnodes").Name(k.node).SubResource("status").
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
	Grants             []fleetv1.GrantInUse
	AgentVersion       string
	// Host is what systemd said in the boot it names; nil when it could
	// not be read (status.host is then removed).
	Host           *fleetv1.HostHealth
	LastReportTime time.Time
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
	grants := s.Grants
	if grants == nil {
		grants = []fleetv1.GrantInUse{}
	}
	var host any
	if s.Host != nil {
		host = hostFields(s.Host)
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
		"grants":             grants,
		"agentVersion":       s.AgentVersion,
		"host":               host,
		"lastReportTime":     metav1.NewMicroTime(s.LastReportTime),
	}
}

// hostFields is status.host with every field named: the report is a merge
// patch, so a field left out (an empty list, a zero count) would keep the
// value of an earlier report; null removes it.
func hostFields(h *fleetv1.HostHealth) map[string]any {
	orNull := func(empty bool, v any) any {
		if empty {
			return nil
		}
		return v
	}
	return map[string]any{
		"bootID":           h.BootID,
		"softRebootCount":  orNull(h.SoftRebootCount == 0, h.SoftRebootCount),
		"systemState":      h.SystemState,
		"failedUnits":      orNull(len(h.FailedUnits) == 0, h.FailedUnits),
		"failedUnitsTotal": orNull(h.FailedUnitsTotal == 0, h.FailedUnitsTotal),
		"bootComplete":     orNull(h.BootComplete == "", h.BootComplete),
		"units":            orNull(len(h.Units) == 0, h.Units),
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
