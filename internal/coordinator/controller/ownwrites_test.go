package controller

import (
	"context"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func TestCaughtUp(t *testing.T) {
	for _, c := range []struct {
		cached, written string
		want            bool
	}{
		{"100", "100", true},
		{"101", "100", true},
		{"99", "100", false},
		{"1000", "999", true}, // longer is later, not lexically smaller
		{"999", "1000", false},
		{"abc", "abc", true}, // not comparable: only equal counts
		{"abd", "abc", false},
	} {
		if got := caughtUp(c.cached, c.written); got != c.want {
			t.Errorf("caughtUp(%q, %q) = %v, want %v", c.cached, c.written, got, c.want)
		}
	}
}

// versions is a cache of Leases whose versions a test moves on; only Get is used.
type versions struct {
	client.Reader
	mu sync.Mutex
	rv map[string]string // name -> resourceVersion; missing: NotFound
}

func (v *versions) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	rv, ok := v.rv[key.Name]
	if !ok {
		return kerrors.NewNotFound(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, key.Name)
	}
	obj.SetResourceVersion(rv)
	return nil
}

func (v *versions) set(name, rv string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if rv == "" {
		delete(v.rv, name)
		return
	}
	v.rv[name] = rv
}

func leaseAt(name, rv string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", ResourceVersion: rv}}
}

func TestOwnWritesWaitForTheCache(t *testing.T) {
	ctx := context.Background()
	cache := &versions{rv: map[string]string{"a": "10", "b": "11", "gone": "12"}}
	o := newOwnWrites()
	o.wrote("pool", kindLease, leaseAt("a", "20"))
	o.deleted("pool", kindLease, leaseAt("gone", "12"))
	o.wrote("pool", kindBootcNode, leaseAt("b", "30")) // a kind not waited for
	o.wrote("other", kindLease, leaseAt("b", "40"))    // another pool's write

	done := make(chan int)
	go func() { done <- o.awaitKinds(ctx, "pool", cache, time.Minute, kindLease) }()
	select {
	case n := <-done:
		t.Fatalf("returned (%d left) before the cache showed the writes", n)
	case <-time.After(50 * time.Millisecond):
	}
	cache.set("a", "21") // a later version than written counts
	select {
	case n := <-done:
		t.Fatalf("returned (%d left) while the cache still showed the Lease deleted", n)
	case <-time.After(50 * time.Millisecond):
	}
	cache.set("gone", "")
	select {
	case n := <-done:
		if n != 0 {
			t.Fatalf("%d writes left, want 0", n)
		}
	case <-time.After(time.Minute):
		t.Fatal("still waiting once the cache showed every write")
	}
	// Done with: the next pass does not wait; the other kinds and pools were not touched.
	if n := o.awaitKinds(ctx, "pool", cache, 0, kindLease); n != 0 {
		t.Fatalf("a met write waited for again (%d left)", n)
	}
	if n := o.awaitKinds(ctx, "other", cache, 0, kindLease); n != 1 {
		t.Fatalf("the other pool's write: %d left, want 1 (cache at 11 < 40)", n)
	}
	// Given up on after the timeout, and forgotten.
	o.wrote("pool", kindLease, leaseAt("a", "99"))
	if n := o.awaitKinds(ctx, "pool", cache, 30*time.Millisecond, kindLease); n != 1 {
		t.Fatalf("timed-out wait left %d, want 1", n)
	}
	if n := o.awaitKinds(ctx, "pool", cache, 0, kindLease); n != 0 {
		t.Fatalf("a write given up on is still waited for (%d)", n)
	}
}
