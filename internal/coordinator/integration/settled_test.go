package integration

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
)

// A settled pool whose text is multibyte everywhere (a hold reason cut at
// 100 bytes, agent messages cut at the rollout reason's 512 bytes, both in
// BootcNode annotations and in the pool's conditions) costs no write: what
// the coordinator computes, cut at rune boundaries, is what the API server
// stores, so pass after pass finds nothing to change.
func TestSettledPoolWithMultibyteTextWritesNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "utf8", 3, v1)
	held, degraded := "utf8-n00", []string{"utf8-n01", "utf8-n02"}
	patchNode := func(name, body string) {
		if err := f.c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch(types.MergePatchType, []byte(body))); err != nil {
			t.Fatal(err)
		}
	}
	// 60 two-byte runes: 120 bytes, cut at 100 in the middle of one.
	patchNode(held, `{"metadata":{"annotations":{"`+fleetv1.AnnotationHold+`":"`+strings.Repeat("ß", 60)+`"}}}`)
	// Passes every 100 ms; the image is resolved (status.resolvedTime, a
	// write of its own) only once in the test.
	// Count the coordinator's write requests: the API server skips an
	// update that changes nothing (the resourceVersion stays), so only the
	// requests show a pass that rewrites the same value again and again.
	cfg := rest.CopyConfig(env.Config)
	var (
		mu       sync.Mutex
		counting bool
		wrote    []string
	)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			switch req.Method {
			case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
				mu.Lock()
				if counting {
					wrote = append(wrote, req.Method+" "+req.URL.Path)
				}
				mu.Unlock()
			}
			return rt.RoundTrip(req)
		})
	})
	startCoordinatorAs(t, cfg, "utf8", func(o *controller.Options) {
		o.RequeueInterval, o.ResolveInterval, o.ResolveRetryInterval = 100*time.Millisecond, time.Hour, time.Hour
	})
	f.createPool(func(p *fleetv1.BootcNodePool) { p.Spec.Image = v1.String() })

	// Every agent reports once; two are Degraded on the old image with a
	// 630-byte message of three-byte runes (cut at 512 in the middle of one).
	for name, fn := range f.nodes {
		var bn fleetv1.BootcNode
		eventually(t, 60*time.Second, "BootcNode "+name, func() (bool, string) {
			err := f.c.Get(ctx, client.ObjectKey{Name: name}, &bn)
			return err == nil, "not created yet"
		})
		st := fleetv1.BootcNodeStatus{ObservedGeneration: bn.Generation, BootID: fn.bootID(), Booted: deployment(v1, false),
			Phase: fleetv1.PhaseIdle, LastReportTime: &metav1.MicroTime{Time: time.Now()}}
		if name != held {
			st.Booted, st.Phase = deployment(v0, false), fleetv1.PhaseDegraded
			st.Reason, st.Message = fleetv1.ReasonBootcUnsupported, strings.Repeat("日本語", 70)
		}
		bn.Status = st
		if err := f.c.Status().Update(ctx, &bn); err != nil {
			t.Fatal(err)
		}
	}
	// Settled: every node explained, the pool's status written.
	eventually(t, 60*time.Second, "the pool settled", func() (bool, string) {
		p := f.getPool()
		if p.Status.Held != 1 || p.Status.Degraded != 2 {
			return false, "pool status not written yet"
		}
		for _, name := range degraded {
			var bn fleetv1.BootcNode
			if err := f.c.Get(ctx, client.ObjectKey{Name: name}, &bn); err != nil || bn.Annotations[fleetv1.AnnotationRolloutState] != fleetv1.RolloutDegraded {
				return false, name + " not explained yet"
			}
		}
		return true, ""
	})
	time.Sleep(2 * time.Second) // let a last write in flight land

	versions := func() map[string]string {
		out := map[string]string{}
		out["pool"] = f.getPool().ResourceVersion
		var bns fleetv1.BootcNodeList
		if err := f.c.List(ctx, &bns); err != nil {
			t.Fatal(err)
		}
		for _, bn := range bns.Items {
			if strings.HasPrefix(bn.Name, "utf8-") {
				out["BootcNode/"+bn.Name] = bn.ResourceVersion
			}
		}
		var ls coordinationv1.LeaseList
		if err := f.c.List(ctx, &ls, client.InNamespace(lease.Namespace), client.MatchingLabels{lease.LabelPool: f.pool}); err != nil {
			t.Fatal(err)
		}
		for _, l := range ls.Items {
			out["Lease/"+l.Name] = l.ResourceVersion
		}
		var nodes corev1.NodeList
		if err := f.c.List(ctx, &nodes); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes.Items {
			if strings.HasPrefix(n.Name, "utf8-") {
				out["Node/"+n.Name] = n.ResourceVersion
			}
		}
		return out
	}
	before := versions()
	poolBefore := f.getPool().Status
	mu.Lock()
	counting = true
	mu.Unlock()
	// At a requeue interval of 100 ms, ten seconds are dozens of passes.
	time.Sleep(10 * time.Second)
	after := versions()
	mu.Lock()
	counting = false
	if len(wrote) > 0 {
		t.Errorf("a settled pool made %d write request(s) in 10 s, e.g. %v", len(wrote), wrote[:min(len(wrote), 5)])
	}
	mu.Unlock()
	if a := f.getPool().Status; !equality.Semantic.DeepEqual(a, poolBefore) {
		t.Logf("pool status before: %+v\nafter: %+v", poolBefore, a)
	}
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s was written by a settled pool (resourceVersion %s -> %s)", k, v, after[k])
		}
	}
	var bn fleetv1.BootcNode
	if err := f.c.Get(ctx, client.ObjectKey{Name: degraded[0]}, &bn); err != nil {
		t.Fatal(err)
	}
	if r := bn.Annotations[fleetv1.AnnotationRolloutReason]; !strings.HasSuffix(r, "…") || strings.ContainsRune(r, '\uFFFD') {
		t.Fatalf("rollout reason not cut at a rune boundary: %q", r)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
