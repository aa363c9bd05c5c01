package integration_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
)

// requestLog records the URL of every request the agent sends.
type requestLog struct {
	mu   sync.Mutex
	reqs []*url.URL
}

// recording is one of the agent's transports, logging into log.
type recording struct {
	log  *requestLog
	next http.RoundTripper
}

func (r recording) RoundTrip(req *http.Request) (*http.Response, error) {
	r.log.mu.Lock()
	r.log.reqs = append(r.log.reqs, req.URL)
	r.log.mu.Unlock()
	return r.next.RoundTrip(req)
}

// first is the first request whose path ends with resource.
func (l *requestLog) first(resource string) *url.URL {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, u := range l.reqs {
		if strings.HasSuffix(u.Path, resource) {
			return u
		}
	}
	return nil
}

// The agent's first view of its BootcNode and grants starts from the API
// server's watch cache (resourceVersion 0), not with a consistent read,
// which waits up to 100 ms for etcd's progress notification and held the
// first report after a reboot behind it (amendment 32): a watch-list stream
// (one request, as before) or, where client-go lists, a LIST. The agent
// still works from it: it reports, in its boot.
func TestFirstViewStartsFromTheWatchCache(t *testing.T) {
	var rec requestLog
	h := startWith(t, "fromcache", time.Minute, imgV2, func(c *agent.Config) {
		rc := rest.CopyConfig(c.RESTConfig)
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return recording{&rec, rt} })
		c.RESTConfig = rc
	})
	h.wait("Waiting without a grant", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))
	for _, resource := range []string{"/bootcnodes", "/leases"} {
		u := rec.first(resource)
		if u == nil {
			t.Fatalf("no request for %s", resource)
		}
		t.Logf("first request for %s: %s", resource, u.RawQuery)
		q := u.Query()
		stream := q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true"
		list := q.Get("watch") == "" && q.Get("sendInitialEvents") == ""
		fromCache := (stream || list) && q.Get("resourceVersion") == "0"
		if !fromCache {
			t.Errorf("first request for %s: %s, want a watch-list stream or a LIST at resourceVersion 0 (from the watch cache)", resource, u.RawQuery)
		}
	}
}

// After a reboot, the round that clears the reboot record reads bootc
// status, and the round that follows at once reports the node on that read:
// no second bootc status between the reboot and the report the coordinator
// releases the slot on (amendment 32).
func TestReportAfterTheRebootReusesTheClearingRead(t *testing.T) {
	h := start(t, "mem-clear", time.Minute)
	ctx := context.Background()
	boot1 := h.m.BootID()
	h.wait("Waiting without a grant", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))
	if _, err := h.k.Grant(ctx, lease.KindStage, 0, h.node, imgV2, boot1, ""); err != nil {
		t.Fatal(err)
	}
	h.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant))
	if err := h.k.Revoke(ctx, lease.KindStage, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := h.k.Grant(ctx, lease.KindReboot, 0, h.node, imgV2, boot1, lease.PhaseReboot); err != nil {
		t.Fatal(err)
	}
	h.until("one reboot request", func() bool { r, _ := h.host.count(); return r == 1 })
	// Counted from the round that clears the record: it logs its decision
	// after its own read and before the next round.
	h.bootc.countReads(func() bool { return h.log.has("action=ClearRecord") })
	h.m.Reboot(testbootc.RebootOptions{})
	h.wait("Idle on the new image", testcoord.PhaseIs(fleetv1.PhaseIdle, fleetv1.ReasonUpToDate))
	if n := h.bootc.statusReads(); n != 0 {
		t.Errorf("%d bootc status reads between clearing the record and the report, want 0 (the clearing round's read)", n)
	}
}
