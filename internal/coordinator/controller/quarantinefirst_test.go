package controller

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// writeLog records, in order, the pool status and Lease writes that reached
// a real API server, and fails the pool's status writes while failStatus is
// set.
type writeLog struct {
	mu         sync.Mutex
	writes     []string
	failStatus atomic.Bool
}

func (l *writeLog) add(w string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes = append(l.writes, w)
}

func (l *writeLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.writes)
}

// A pass that quarantines its target writes the quarantine first: the
// slot writes of that pass and the next take away what it was derived
// from (amendment 34). If the status write fails, no slot is written; once
// it succeeds, the status is written before the slot, and once.
func TestAQuarantineIsRecordedBeforeThePassActsOnIt(t *testing.T) {
	env := envtest.Start(t)
	ctx := t.Context()
	base, err := client.NewWithWatch(env.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	log := &writeLog{}
	c := interceptor.NewClient(base, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if _, ok := obj.(*fleetv1.BootcNodePool); ok && sub == "status" {
				if log.failStatus.Load() {
					return errors.New("injected: the pool's status update failed")
				}
				log.add("status")
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if l, ok := obj.(*coordinationv1.Lease); ok {
				log.add("lease " + l.Name)
			}
			return c.Update(ctx, obj, opts...)
		},
	})

	const name = "quarantine-first"
	pool := &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: fleetv1.BootcNodePoolSpec{
		Image: "registry.example/os:1", NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": name}}}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	slot := plan.NewSlotLease(name, plan.SlotRef{Kind: lease.KindStage, Index: 0})
	if err := c.Create(ctx, slot); err != nil {
		t.Fatal(err)
	}
	img, err := imageref.ParsePinned("registry.example/os@sha256:" + strings.Repeat("b", 64))
	if err != nil {
		t.Fatal(err)
	}
	r := &poolReconciler{client: c, writes: newOwnWrites(), bootcNodes: newBootcNodeWriter(c, newOwnWrites(), logr.Discard()),
		progress: newPoolProgress(), waiting: map[string]time.Time{}, statusWritten: map[string]time.Time{},
		statusDue: map[string]time.Duration{}, log: logr.Discard(), opts: Options{LeaseDuration: time.Minute}}
	out := plan.Output{
		Changes: []plan.SlotChange{{Slot: slot.Name, Kind: lease.KindStage, Op: plan.OpGrant, Node: "node-a", Image: img, Why: "test"}},
		Status: fleetv1.BootcNodePoolStatus{Quarantine: &fleetv1.Quarantine{SpecImage: pool.Spec.Image,
			Digest: "registry.example/os@sha256:" + strings.Repeat("a", 64), Node: "node-b", Reason: fleetv1.ReasonHostUnitFailed,
			Message: "check Host: failed", Since: metav1.NewTime(time.Now()).Rfc3339Copy()}},
	}
	pass := func() error {
		w := &observed{leases: map[string]*coordinationv1.Lease{}, bootcNodes: map[string]*fleetv1.BootcNode{}}
		var l coordinationv1.Lease
		if err := c.Get(ctx, client.ObjectKeyFromObject(slot), &l); err != nil {
			t.Fatal(err)
		}
		w.leases[l.Name] = &l
		var p fleetv1.BootcNodePool
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
			t.Fatal(err)
		}
		p.SetGroupVersionKind(fleetv1.GroupVersion.WithKind("BootcNodePool"))
		_, err := r.apply(ctx, logr.Discard(), &p, w, plan.Input{Now: time.Now()}, out)
		return err
	}

	log.failStatus.Store(true)
	if err := pass(); err == nil || !strings.Contains(err.Error(), "quarantine") {
		t.Fatalf("a pass whose quarantine could not be recorded returned %v, want an error naming the quarantine", err)
	}
	if got := log.get(); len(got) != 0 {
		t.Fatalf("a pass whose quarantine could not be recorded wrote %v, want nothing", got)
	}

	log.failStatus.Store(false)
	if err := pass(); err != nil {
		t.Fatal(err)
	}
	if got, want := log.get(), []string{"status", "lease " + slot.Name}; !slices.Equal(got, want) {
		t.Fatalf("writes %v, want %v: the quarantine first, then the slot, and the status once", got, want)
	}
	var p fleetv1.BootcNodePool
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	if p.Status.Quarantine == nil || p.Status.Quarantine.Node != "node-b" {
		t.Fatalf("status.quarantine %+v, want node-b's", p.Status.Quarantine)
	}
}
