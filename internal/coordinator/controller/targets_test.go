package controller

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/authn"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/resolve"
)

// heldResolver answers each lookup only when the test lets it (answer),
// with the digest for the reference asked; a lookup whose context ends
// returns its error.
type heldResolver struct {
	mu      sync.Mutex
	calls   []string
	answers chan struct{}
	gaveUp  chan string // the lookups whose context ended
}

func (h *heldResolver) Resolve(ctx context.Context, ref string, _ authn.Keychain) (resolve.Target, error) {
	h.mu.Lock()
	h.calls = append(h.calls, ref)
	h.mu.Unlock()
	select {
	case <-h.answers:
	case <-ctx.Done():
		h.gaveUp <- ref
		return resolve.Target{}, ctx.Err()
	}
	p, err := imageref.PinnedFromDigest(ref, digestFor(ref))
	return resolve.Target{Image: p}, err
}

// waitAsked waits until n lookups reached the resolver (they start in
// goroutines of their own) and returns them.
func (h *heldResolver) waitAsked(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		a := h.asked()
		if len(a) >= n || time.Now().After(deadline) {
			return a
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *heldResolver) asked() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.calls...)
}

func digestFor(ref string) string {
	if strings.HasSuffix(ref, ":2") {
		return "sha256:" + strings.Repeat("2", 64)
	}
	return "sha256:" + strings.Repeat("1", 64)
}

// awaitWake waits for the lookup's request for a pass of pool.
func awaitWake(t *testing.T, c *targetCache, pool string) {
	t.Helper()
	select {
	case e := <-c.events:
		if e.Object.Name != pool {
			t.Fatalf("a pass asked for pool %s, want %s", e.Object.Name, pool)
		}
	case <-time.After(time.Minute):
		t.Fatal("the lookup's end asked for no pass")
	}
}

// Lookups run in the background (amendment 33): a pass waits for the first
// answer for a spec.image at most firstWait, then goes on with no new
// grants (the status's digest, not known to be an index); once a digest is
// known, a pass never waits for a lookup, and uses the last digest while
// one is in flight; one lookup at a time per pool; a new spec.image drops
// the lookup in flight for the old one.
func TestLookupsRunInTheBackground(t *testing.T) {
	res := &heldResolver{answers: make(chan struct{}), gaveUp: make(chan string, 8)}
	c := newTargetCache(res, &registryAuth{}, time.Minute, time.Minute, logr.Discard())
	c.firstWait = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = c.Start(ctx) }()

	const last = "registry.example/os@sha256:0000000000000000000000000000000000000000000000000000000000000000"
	pool := &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: fleetv1.BootcNodePoolSpec{Image: "registry.example/os:1"},
		Status: fleetv1.BootcNodePoolStatus{TargetImage: last}}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	got, _ := c.get(ctx, pool, now)
	if got.err != noAnswerYet || got.pinned.String() != last || !got.indexUnknown {
		t.Fatalf("first pass without an answer: %+v; want no answer yet, the status's digest, index unknown", got)
	}
	got, _ = c.get(ctx, pool, now.Add(time.Second))
	if a := res.waitAsked(t, 1); got.err != noAnswerYet || len(a) != 1 {
		t.Fatalf("second pass: %+v after lookups %v; want still no answer, one lookup", got, a)
	}
	res.answers <- struct{}{}
	awaitWake(t, c, "p")
	got, _ = c.get(ctx, pool, now.Add(2*time.Second))
	if got.err != "" || got.pinned.Digest != digestFor("registry.example/os:1") || got.indexUnknown {
		t.Fatalf("after the answer: %+v", got)
	}

	// Due again, and the registry does not answer: passes go on with the
	// last digest, and no second lookup starts.
	for i := range 3 {
		got, _ = c.get(ctx, pool, now.Add(2*time.Minute+time.Duration(i)*time.Second))
		if got.err != "" || got.pinned.Digest != digestFor("registry.example/os:1") {
			t.Fatalf("pass %d while a re-lookup is in flight: %+v, want the last digest", i, got)
		}
	}
	if a := res.waitAsked(t, 2); len(a) != 2 {
		t.Fatalf("lookups %v, want 2 (one in flight)", a)
	}

	// spec.image changes: the lookup in flight is dropped, a new one asks
	// for the new image.
	pool.Spec.Image = "registry.example/os:2"
	got, _ = c.get(ctx, pool, now.Add(3*time.Minute))
	if got.err != noAnswerYet {
		t.Fatalf("new spec.image, no answer yet: %+v", got)
	}
	if a := res.waitAsked(t, 3); len(a) != 3 || a[2] != "registry.example/os:2" {
		t.Fatalf("lookups %v, want a third, for the new image", a)
	}
	select {
	case ref := <-res.gaveUp:
		if ref != "registry.example/os:1" {
			t.Fatalf("the lookup of %s was dropped, want the old image's", ref)
		}
	case <-time.After(time.Minute):
		t.Fatal("the lookup of the old spec.image goes on")
	}
	res.answers <- struct{}{}
	awaitWake(t, c, "p")
	got, _ = c.get(ctx, pool, now.Add(3*time.Minute+time.Second))
	if got.err != "" || got.pinned.Digest != digestFor("registry.example/os:2") {
		t.Fatalf("after the new image's answer: %+v", got)
	}
}
