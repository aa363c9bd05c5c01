// Package slotview is an agent's view of its slot Leases: one informer per
// Lease its BootcNode names in fleetv1.AnnotationSlots, each watching that
// Lease by name (docs/design.md, amendment 39), or, while the BootcNode does
// not carry the annotation (a coordinator that predates it), one informer on
// the Leases labelled with the node.
//
// Why by name: the API server's watch cache hands an event to the watchers
// of that object's name only, but to every label-selected watcher of the
// namespace, which then filters it; with one such watch per node, each slot
// write cost the API server work for every node of the cluster, and at 1,000
// nodes it closed thousands of those watches as too slow to keep up.
//
// The real agent (internal/agent) and the benchmark's light agents
// (tests/fleet) both use it, so the API server sees the same watches.
package slotview

import (
	"context"
	"slices"
	"strings"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// NewInformer makes the informer for lw (the caller's list/watch options,
// error handler, and start from the watch cache; see internal/agent).
type NewInformer func(lw *cache.ListWatch) cache.SharedIndexInformer

// View is the set of Lease informers a node's BootcNode asks for.
type View struct {
	client   rest.Interface // coordination.k8s.io/v1
	node     string
	newInf   NewInformer
	onChange func()

	mu    sync.Mutex
	ctx   context.Context // nil until Start
	key   string          // what infs follow: "" nothing, byLabel, or the names joined
	infs  map[string]*entry
	err   error // the annotation did not parse
	ready bool  // Follow ran since Start
}

type entry struct {
	inf    cache.SharedIndexInformer
	cancel context.CancelFunc
}

// byLabel is the key of the label-selected informer (no Lease name has a
// slash).
const byLabel = "/label"

// New returns node's view; onChange runs when a Lease changes or a new
// informer has synced. Nothing runs before Start.
func New(client rest.Interface, node string, newInf NewInformer, onChange func()) *View {
	return &View{client: client, node: node, newInf: newInf, onChange: onChange, infs: map[string]*entry{}}
}

// Start lets the view run informers until ctx ends.
func (v *View) Start(ctx context.Context) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.ctx = ctx
}

// Follow makes the view watch what bn asks for: nothing without a
// BootcNode (the coordinator grants only to a node its pool has a
// BootcNode for), the named Leases, or every Lease labelled with the node
// while bn has no annotation. A bad annotation is followed not at all (Err
// says why) rather than in part; the coordinator writes it again. Idempotent.
func (v *View) Follow(bn *fleetv1.BootcNode) {
	want, err := wanted(bn)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.ctx == nil {
		return
	}
	v.err = err
	v.ready = true
	key := strings.Join(want, ",")
	if key == v.key {
		return
	}
	v.key = key
	for k, e := range v.infs {
		if !slices.Contains(want, k) {
			e.cancel()
			delete(v.infs, k)
		}
	}
	for _, k := range want {
		if _, ok := v.infs[k]; !ok {
			v.infs[k] = v.start(k)
		}
	}
}

func wanted(bn *fleetv1.BootcNode) ([]string, error) {
	if bn == nil {
		return nil, nil
	}
	names, present, err := fleetv1.SlotsOf(bn)
	switch {
	case err != nil:
		return nil, err
	case !present:
		return []string{byLabel}, nil
	}
	return names, nil
}

// start runs an informer for k; v.mu is held.
func (v *View) start(k string) *entry {
	var lw *cache.ListWatch
	if k == byLabel {
		lw = cache.NewFilteredListWatchFromClient(v.client, "leases", lease.Namespace,
			func(o *metav1.ListOptions) { o.LabelSelector = lease.LabelHolder + "=" + v.node })
	} else {
		lw = cache.NewListWatchFromClient(v.client, "leases", lease.Namespace, fields.OneTermEqualSelector("metadata.name", k))
	}
	inf := v.newInf(lw)
	poke := func(any) { v.onChange() }
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(any, any) { v.onChange() }, DeleteFunc: poke})
	ctx, cancel := context.WithCancel(v.ctx)
	go inf.RunWithContext(ctx)
	// An informer's handlers run before it counts as synced, and one that
	// lists nothing runs none: say so once it has (internal/agent, Start).
	go func() {
		select {
		case <-ctx.Done():
		case <-inf.HasSyncedChecker().Done():
			v.onChange()
		}
	}()
	return &entry{inf: inf, cancel: cancel}
}

// Synced says whether Follow ran and every informer it asked for has listed.
func (v *View) Synced() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.ready {
		return false
	}
	for _, e := range v.infs {
		if !e.inf.HasSynced() {
			return false
		}
	}
	return true
}

// Err is why the BootcNode's annotation was not followed, or nil.
func (v *View) Err() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.err
}

// Informers are the informers running now.
func (v *View) Informers() []cache.SharedIndexInformer {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]cache.SharedIndexInformer, 0, len(v.infs))
	for _, e := range v.infs {
		out = append(out, e.inf)
	}
	return out
}

// Leases are the cached Leases labelled with the node's name: a Lease the
// annotation names but another node holds (the coordinator's write of the
// names lags its grants) is not this node's.
func (v *View) Leases() []*coordinationv1.Lease {
	var out []*coordinationv1.Lease
	for _, inf := range v.Informers() {
		for _, o := range inf.GetStore().List() {
			if l, ok := o.(*coordinationv1.Lease); ok && l.Labels[lease.LabelHolder] == v.node {
				out = append(out, l)
			}
		}
	}
	slices.SortFunc(out, func(a, b *coordinationv1.Lease) int { return strings.Compare(a.Name, b.Name) })
	return out
}
