package fleet

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// StatusTimes records, per BootcNode, when the harness first saw it ask
// for the target image (spec.desiredImage) and first saw its status in each
// phase since: where the time before the first stage grant goes.
type StatusTimes struct {
	mu    sync.Mutex
	first map[string]map[string]time.Time // node -> "desired" or a phase -> first seen
}

// WatchStatus starts recording until ctx ends, for BootcNodes whose desired
// image is target.
func (f *Fleet) WatchStatus(ctx context.Context, target string) (*StatusTimes, error) {
	rc, err := fleetREST(f.Env.Config)
	if err != nil {
		return nil, err
	}
	s := &StatusTimes{first: map[string]map[string]time.Time{}}
	inf := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(rc, "bootcnodes", metav1.NamespaceAll, fields.Everything()),
		&fleetv1.BootcNode{}, 0, cache.Indexers{})
	see := func(o any) {
		bn, ok := o.(*fleetv1.BootcNode)
		if !ok {
			return
		}
		now := time.Now()
		s.mu.Lock()
		defer s.mu.Unlock()
		m := s.first[bn.Name]
		if m == nil {
			m = map[string]time.Time{}
			s.first[bn.Name] = m
		}
		mark := func(k string) {
			if _, ok := m[k]; !ok {
				m[k] = now
			}
		}
		if bn.Spec.DesiredImage == target {
			mark("desired")
			if bn.Status.Phase != "" {
				mark(string(bn.Status.Phase))
			}
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, o any) { see(o) }})
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, ctx.Err()
	}
	return s, nil
}

// Report renders, for each key, the median and p95 of when it was first
// seen after created.
func (s *StatusTimes) Report(created time.Time, keys ...string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, k := range keys {
		var ds []time.Duration
		for _, m := range s.first {
			if at, ok := m[k]; ok {
				ds = append(ds, at.Sub(created))
			}
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		fmt.Fprintf(&b, "  change→%-25s median %8s  p95 %8s  (n=%d)\n", "BootcNode "+k, ms(Quantile(ds, 0.5)), ms(Quantile(ds, 0.95)), len(ds))
	}
	return b.String()
}
