package drain

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
)

// stallingProxy stands in front of the test API server and, while stalled,
// takes every pod LIST and never answers it, as an API server whose watch
// cache or etcd hangs does: it does not even notice the client leaving.
type stallingProxy struct {
	mu       sync.Mutex
	stalled  bool
	podLists int
	release  chan struct{}
	once     sync.Once
}

func startStallingProxy(t *testing.T) (*stallingProxy, kubernetes.Interface) {
	t.Helper()
	target, err := url.Parse(shared.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := rest.TransportFor(shared.Config)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = tr
	p := &stallingProxy{release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/api/v1/pods" {
			p.mu.Lock()
			p.podLists++
			stalled := p.stalled
			p.mu.Unlock()
			if stalled {
				<-p.release
				http.Error(w, "stalled", http.StatusServiceUnavailable)
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	// Held requests end before the server closes (Close waits for them).
	t.Cleanup(srv.Close)
	t.Cleanup(p.recover)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return p, cs
}

func (p *stallingProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = true
}

// recover answers again, and lets the requests held go (with an error).
func (p *stallingProxy) recover() {
	p.mu.Lock()
	p.stalled = false
	p.mu.Unlock()
	p.once.Do(func() { close(p.release) })
}

func (p *stallingProxy) lists() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.podLists
}

// A drain whose pod LIST gets no answer ends when its timeout passes, as
// "timed out", saying the API server did not answer the pod list (the words
// the tracker logs and the DrainFailed Event carries), without a second
// LIST for its report, which would wait on the same API server; once the
// API server answers again, the next drain of the node lists once and
// completes (amendment 33).
func TestDrainOnAStalledAPIServerSaysSoAndRecovers(t *testing.T) {
	c := newCluster(t)
	c.node("drain-stall", true)
	p, cs := startStallingProxy(t)
	d := New(cs, logr.Discard())

	p.stall()
	err := d.Drain(c.ctx(), "drain-stall", 2*time.Second)
	var be *BlockedError
	if !errors.As(err, &be) || !be.TimedOut || !be.Unlisted {
		t.Fatalf("Drain on a stalled API server = %v, want a timed-out BlockedError without a pod list", err)
	}
	if want := "drain of drain-stall timed out after 2s: the API server did not answer the pod list"; err.Error() != want {
		t.Fatalf("message %q, want %q", err, want)
	}
	// It returned while the proxy still holds the list: it did not wait
	// for the request, and did not list again for its report.
	if n := p.lists(); n != 1 {
		t.Fatalf("%d pod LISTs during the stalled drain, want 1", n)
	}

	p.recover()
	// A wide timeout: the loaded machine, not the drain, would be timed.
	if err := d.Drain(c.ctx(), "drain-stall", time.Minute); err != nil {
		t.Fatalf("Drain once the API server answers again = %v, want it drained", err)
	}
	if n := p.lists(); n != 2 {
		t.Fatalf("%d pod LISTs in all, want 2: the drain after the stall lists once and finds nothing to evict", n)
	}
}

// The uncordon log line names the grant whose cordon it lifted (the mark
// on the Node as read), as the cordon's names the grant it made it for.
func TestUncordonLogNamesTheGrantItLifted(t *testing.T) {
	c := newCluster(t)
	var logs logLines
	d := New(c.cs, logs.logger())
	c.node("uncordon-named", false)
	mark := lease.CordonMark(lease.ID{Lease: "named-reboot-0", UID: "uid-1", Transitions: 7})
	if _, _, err := d.Cordon(c.ctx(), "uncordon-named", mark, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Uncordon(c.ctx(), "uncordon-named", nil); err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{`"msg"="cordoned node"`, `"msg"="uncordoned node"`} {
		if !logs.has(msg, `"node"="uncordon-named"`, `"grant"="`+mark+`"`) {
			t.Fatalf("no log line %s naming grant %s; lines: %v", msg, mark, logs.lines)
		}
	}
}
