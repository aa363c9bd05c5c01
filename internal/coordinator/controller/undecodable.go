package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// The coordinator reads BootcNodes and pools through informers over the
// dynamic (unstructured) client and decodes each object on its own, with the
// same JSON codec its typed client uses. An object the typed scheme cannot
// decode (stored before the CRD schema refused such values, or by an API
// server that does not enforce an int32 field's range) is set aside: it is
// left out of the cache, named on its pool (condition ObjectsReadable and a
// Warning Event UndecodableObject), and everything else is read and planned
// as usual. With the typed informer one such object failed the whole list,
// so the coordinator planned on a frozen cache, and after a restart never
// synced (docs/design.md, amendment 22).

// undecodable is one object set aside.
type undecodable struct {
	kind, name string
	uid        string
	rv         string // as set aside (logged)
	pool       string // the pool it belongs to, if it says
	err        string
}

func (u undecodable) String() string {
	return fmt.Sprintf("%s %s cannot be decoded: %s", u.kind, u.name, u.err)
}

// same: a and b say the same. The resourceVersion does not count: writing
// the condition on an undecodable pool changes it, and must not call for
// another write.
func (u undecodable) same(b undecodable) bool {
	u.rv, b.rv = "", ""
	return u == b
}

// undecodables is the set of objects set aside, by kind and name. Each
// change enqueues the pool concerned, whose pass reports it.
type undecodables struct {
	log    logr.Logger
	events chan event.TypedGenericEvent[*fleetv1.BootcNodePool]

	mu   sync.Mutex
	objs map[string]undecodable // kind/name
	// reported: what an Event already named, by kind/name.
	reported map[string]undecodable
}

func newUndecodables(log logr.Logger) *undecodables {
	return &undecodables{log: log, objs: map[string]undecodable{}, reported: map[string]undecodable{},
		events: make(chan event.TypedGenericEvent[*fleetv1.BootcNodePool], 64)}
}

func (s *undecodables) set(u undecodable) {
	s.mu.Lock()
	old, had := s.objs[u.kind+"/"+u.name]
	s.objs[u.kind+"/"+u.name] = u
	s.mu.Unlock()
	if had && old.same(u) {
		return
	}
	s.log.Error(fmt.Errorf("%s", u.err), "object set aside: it cannot be decoded", "kind", u.kind, "name", u.name, "resourceVersion", u.rv, "pool", u.pool)
	s.enqueue(u.pool, old.pool)
}

func (s *undecodables) clear(kind, name string) {
	s.mu.Lock()
	old, had := s.objs[kind+"/"+name]
	delete(s.objs, kind+"/"+name)
	delete(s.reported, kind+"/"+name)
	s.mu.Unlock()
	if had {
		s.log.Info("object decodes again", "kind", kind, "name", name)
		s.enqueue(old.pool)
	}
}

// keepOnly drops the kind's entries not in names (gone since).
func (s *undecodables) keepOnly(kind string, names map[string]bool) {
	s.mu.Lock()
	var gone []undecodable
	for k, u := range s.objs {
		if u.kind == kind && !names[u.name] {
			gone = append(gone, u)
			delete(s.objs, k)
			delete(s.reported, k)
		}
	}
	s.mu.Unlock()
	for _, u := range gone {
		s.enqueue(u.pool)
	}
}

// enqueue asks for a pass of each named pool. It never blocks a watch:
// with the buffer full (a replica not leading has no controller reading
// it) the request is dropped; every pool is passed again within the
// requeue interval anyway, a set-aside pool too, and reads this set then.
func (s *undecodables) enqueue(pools ...string) {
	for i, p := range pools {
		if p == "" || slices.Contains(pools[:i], p) {
			continue
		}
		ev := event.TypedGenericEvent[*fleetv1.BootcNodePool]{Object: &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: p}}}
		select {
		case s.events <- ev:
		default:
		}
	}
}

// Start implements manager.Runnable (leader only, once the caches
// synced): it asks for a pass of every pool concerned by what is set
// aside, which enqueue may have dropped while this replica did not lead.
func (s *undecodables) Start(ctx context.Context) error {
	s.mu.Lock()
	pools := map[string]bool{}
	for _, u := range s.objs {
		if u.pool != "" {
			pools[u.pool] = true
		}
	}
	s.mu.Unlock()
	for p := range pools {
		select {
		case s.events <- event.TypedGenericEvent[*fleetv1.BootcNodePool]{Object: &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: p}}}:
		case <-ctx.Done():
			return nil
		}
	}
	<-ctx.Done()
	return nil
}

// ofPool lists what is set aside that concerns pool: the pool itself and
// BootcNodes that name it, sorted.
func (s *undecodables) ofPool(pool string) []undecodable {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []undecodable
	for _, u := range s.objs {
		if u.pool == pool {
			out = append(out, u)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].kind+"/"+out[i].name < out[j].kind+"/"+out[j].name })
	return out
}

// unreported says whether u is not yet named in an Event, and marks it so.
func (s *undecodables) unreported(u undecodable) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.reported[u.kind+"/"+u.name]; ok && r.same(u) {
		return false
	}
	s.reported[u.kind+"/"+u.name] = u
	return true
}

func (s *undecodables) get(kind, name string) (undecodable, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.objs[kind+"/"+name]
	return u, ok
}

// lenientKind is what the coordinator reads of one fleet kind this way.
type lenientKind struct {
	kind     string
	resource schema.GroupVersionResource
	newList  func() k8sruntime.Object
	newObj   func() k8sruntime.Object
	// poolOf says which pool an object (decoded or not) belongs to.
	poolOf func(u *unstructured.Unstructured) string
}

var lenientKinds = []lenientKind{
	{
		kind:     kindBootcNode,
		resource: fleetv1.GroupVersion.WithResource("bootcnodes"),
		newList:  func() k8sruntime.Object { return &fleetv1.BootcNodeList{} },
		newObj:   func() k8sruntime.Object { return &fleetv1.BootcNode{} },
		poolOf: func(u *unstructured.Unstructured) string {
			if p, ok, _ := unstructured.NestedString(u.Object, "spec", "pool"); ok && p != "" {
				return p
			}
			if ref := metav1.GetControllerOf(u); ref != nil && ref.Kind == kindPool {
				return ref.Name
			}
			return ""
		},
	},
	{
		kind:     kindPool,
		resource: fleetv1.GroupVersion.WithResource("bootcnodepools"),
		newList:  func() k8sruntime.Object { return &fleetv1.BootcNodePoolList{} },
		newObj:   func() k8sruntime.Object { return &fleetv1.BootcNodePool{} },
		poolOf:   func(u *unstructured.Unstructured) string { return u.GetName() },
	},
}

// newInformer is the cache's informer constructor: the fleet kinds get a
// lenient list and watch, every other kind controller-runtime's own.
func (s *undecodables) newInformer(dyn dynamic.Interface, scheme *k8sruntime.Scheme) func(toolscache.ListerWatcher, k8sruntime.Object, time.Duration, toolscache.Indexers) toolscache.SharedIndexInformer {
	decoder := serializer.NewCodecFactory(scheme).UniversalDeserializer()
	return func(lw toolscache.ListerWatcher, obj k8sruntime.Object, resync time.Duration, idx toolscache.Indexers) toolscache.SharedIndexInformer {
		for _, k := range lenientKinds {
			if fmt.Sprintf("%T", obj) == fmt.Sprintf("%T", k.newObj()) {
				lw = &lenientListWatch{k: k, res: dyn.Resource(k.resource), set: s, decoder: decoder}
				break
			}
		}
		return toolscache.NewSharedIndexInformer(lw, obj, resync, idx)
	}
}

// lenientListWatch lists and watches one kind as unstructured objects and
// hands the informer the typed ones that decode.
type lenientListWatch struct {
	k       lenientKind
	res     dynamic.NamespaceableResourceInterface
	set     *undecodables
	decoder k8sruntime.Decoder
}

var (
	_ toolscache.ListerWatcher            = &lenientListWatch{}
	_ toolscache.ListerWatcherWithContext = &lenientListWatch{}
)

func (l *lenientListWatch) List(opts metav1.ListOptions) (k8sruntime.Object, error) {
	return l.ListWithContext(context.Background(), opts)
}

func (l *lenientListWatch) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), opts)
}

func (l *lenientListWatch) ListWithContext(ctx context.Context, opts metav1.ListOptions) (k8sruntime.Object, error) {
	ul, err := l.res.List(ctx, opts)
	if err != nil {
		return nil, err
	}
	list := l.k.newList()
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return nil, err
	}
	lm.SetResourceVersion(ul.GetResourceVersion())
	lm.SetContinue(ul.GetContinue())
	lm.SetRemainingItemCount(ul.GetRemainingItemCount())
	items := make([]k8sruntime.Object, 0, len(ul.Items))
	present := make(map[string]bool, len(ul.Items))
	for i := range ul.Items {
		present[ul.Items[i].GetName()] = true
		if obj, ok := l.decode(&ul.Items[i]); ok {
			items = append(items, obj)
		}
		// Each unstructured object (6.8 kB for a 2.7 kB typed BootcNode)
		// can go as soon as it is decoded: after a restart at 5,000 nodes
		// the typed list is not held beside the whole unstructured one.
		ul.Items[i] = unstructured.Unstructured{}
	}
	if opts.Continue == "" && ul.GetContinue() == "" {
		l.set.keepOnly(l.k.kind, present)
	}
	if err := meta.SetList(list, items); err != nil {
		return nil, err
	}
	return list, nil
}

// decode decodes u into the typed kind, or sets it aside.
func (l *lenientListWatch) decode(u *unstructured.Unstructured) (k8sruntime.Object, bool) {
	obj, err := l.typed(u.Object)
	if err != nil {
		l.set.set(undecodable{kind: l.k.kind, name: u.GetName(), uid: string(u.GetUID()), rv: u.GetResourceVersion(),
			pool: l.k.poolOf(u), err: err.Error()})
		return nil, false
	}
	l.set.clear(l.k.kind, u.GetName())
	return obj, true
}

func (l *lenientListWatch) typed(content map[string]any) (k8sruntime.Object, error) {
	data, err := json.Marshal(content)
	if err != nil {
		return nil, err
	}
	into := l.k.newObj()
	if _, _, err := l.decoder.Decode(data, nil, into); err != nil {
		return nil, err
	}
	return into, nil
}

// stub is the typed object with u's metadata only: what the informer needs
// to drop an object that no longer decodes.
func (l *lenientListWatch) stub(u *unstructured.Unstructured) k8sruntime.Object {
	obj, err := l.typed(map[string]any{"apiVersion": u.GetAPIVersion(), "kind": u.GetKind(), "metadata": u.Object["metadata"]})
	if err != nil {
		obj = l.k.newObj()
		m := obj.(metav1.Object)
		m.SetName(u.GetName())
		m.SetNamespace(u.GetNamespace())
		m.SetUID(u.GetUID())
		m.SetResourceVersion(u.GetResourceVersion())
	}
	return obj
}

func (l *lenientListWatch) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	opts.AllowWatchBookmarks = true
	w, err := l.res.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	out := make(chan watch.Event)
	lw := &lenientWatch{in: w, out: out, done: make(chan struct{})}
	go lw.run(l)
	return lw, nil
}

type lenientWatch struct {
	in   watch.Interface
	out  chan watch.Event
	done chan struct{}
	once sync.Once
}

func (w *lenientWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *lenientWatch) Stop() {
	w.once.Do(func() {
		close(w.done)
		w.in.Stop()
	})
}

func (w *lenientWatch) run(l *lenientListWatch) {
	defer close(w.out)
	for ev := range w.in.ResultChan() {
		u, ok := ev.Object.(*unstructured.Unstructured)
		if ok {
			switch ev.Type {
			case watch.Added, watch.Modified:
				if obj, ok := l.decode(u); ok {
					ev.Object = obj
				} else {
					// Drop what the cache may hold of it: planning on an
					// old version of an object that has changed is what
					// this reading avoids.
					ev = watch.Event{Type: watch.Deleted, Object: l.stub(u)}
				}
			case watch.Deleted:
				l.set.clear(l.k.kind, u.GetName())
				if obj, err := l.typed(u.Object); err == nil {
					ev.Object = obj
				} else {
					ev.Object = l.stub(u)
				}
			case watch.Bookmark:
				ev.Object = l.stub(u)
			}
		}
		select {
		case w.out <- ev:
		case <-w.done:
			return
		}
	}
}

// undecodableMessage names the objects set aside, bounded for a condition.
func undecodableMessage(us []undecodable) string {
	var parts []string
	for _, u := range us {
		parts = append(parts, u.String())
	}
	return text.Truncate(strings.Join(parts, "; "), 2048)
}
