package integration

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
)

// hangingRegistry is a registry that, once hung, accepts every request and
// never answers it (until the test ends).
type hangingRegistry struct {
	mu      sync.Mutex
	hung    bool
	held    chan struct{} // one per request taken while hung
	release chan struct{}
	once    sync.Once
}

func startHangingRegistry(t *testing.T) (*hangingRegistry, string) {
	t.Helper()
	h := &hangingRegistry{held: make(chan struct{}, 1024), release: make(chan struct{})}
	reg := registry.New()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		hung := h.hung
		h.mu.Unlock()
		if !hung {
			reg.ServeHTTP(w, r)
			return
		}
		select {
		case h.held <- struct{}{}:
		default:
		}
		<-h.release
		http.Error(w, "the test ended", http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close) // after the held requests are let go
	t.Cleanup(func() { h.once.Do(func() { close(h.release) }) })
	return h, strings.TrimPrefix(srv.URL, "http://")
}

func (h *hangingRegistry) hang() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hung = true
}

// Once the pool's image resolved, the registry stops answering: it takes
// the next lookup (due every 300 ms here) and holds it for the rest of the
// test, far inside the resolver's timeout (10 minutes). The pool's passes
// go on with the last digest the whole while (amendment 33): every node is
// granted, drained, rebooted and released, and the pool says it is up to
// date, on the digest resolved before the hang (no lookup answered since).
func TestARegistryThatDoesNotAnswerHoldsNoPass(t *testing.T) {
	reg, host := startHangingRegistry(t)
	ref := host + "/fleet/os:stable"
	target := push(t, ref)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "regstall", 3, pinned(host+"/fleet/os", '0'))
	f.run(ctx, 1)
	startCoordinator(t, "regstall", func(o *controller.Options) {
		o.InsecureRegistries = []string{host}
		o.ResolveTimeout = 10 * time.Minute
	})
	f.createPool(func(p *fleetv1.BootcNodePool) { p.Spec.Image = ref })
	eventually(t, 60*time.Second, "the pool's image resolved", func() (bool, string) {
		st := f.getPool().Status
		return st.TargetImage == target.String() && st.ResolvedTime != nil, st.TargetImage
	})

	hungAt := time.Now()
	reg.hang()
	select {
	case <-reg.held:
	case <-time.After(time.Minute):
		t.Fatal("no lookup reached the registry after it hung")
	}
	f.allOn(t, target, 90*time.Second)
	eventually(t, 60*time.Second, "the pool up to date", func() (bool, string) {
		c := f.condition(fleetv1.PoolUpToDate)
		return c.Status == metav1.ConditionTrue, c.Reason + ": " + c.Message
	})
	cancel()
	f.assertBudgetHeld(t)
	f.assertRebootsEach(t, 1)
	st := f.getPool().Status
	if st.TargetImage != target.String() || st.ResolvedTime == nil || st.ResolvedTime.After(hungAt) {
		t.Fatalf("target %s resolved at %v, want %s resolved before the hang (%s): no lookup answered since", st.TargetImage, st.ResolvedTime, target, hungAt.Format(time.RFC3339Nano))
	}
	if c := f.condition(fleetv1.PoolDegraded); c.Reason == fleetv1.ReasonResolveFailed {
		t.Fatalf("pool Degraded %s while a lookup is in flight within its timeout: %s", c.Reason, c.Message)
	}
}
