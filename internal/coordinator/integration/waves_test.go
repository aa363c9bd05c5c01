package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// TestCanaryFirstThenZones (amendment 26) runs the real coordinator against
// a real API server: 4 nodes, maxUnavailable 4, the labelled canary waves-n02
// in zone-a with waves-n03, waves-n00 and waves-n01 in zone-b. The canary
// reboots alone, first; status.canary is written through the API server's
// schema. Every observation of the slots is checked: no node but the
// canary holds a reboot slot before status.canary says the canary passed,
// and reboot slots are never held in two zones at once.
func TestCanaryFirstThenZones(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "waves", 4, v0)
	zones := map[string]string{"waves-n00": "zone-b", "waves-n01": "zone-b", "waves-n02": "zone-a", "waves-n03": "zone-a"}
	for name, zone := range zones {
		var n corev1.Node
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			t.Fatal(err)
		}
		n.Labels[fleetv1.LabelZone] = zone
		if name == "waves-n02" {
			n.Labels[fleetv1.LabelCanary] = "true"
		}
		if err := env.Client.Update(ctx, &n); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var violations, order, twoZones []string
	// Every version of the pool's slot Leases, from one watch (the API
	// server's order): a poll could miss a slot held for less than a poll.
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	lw, err := cs.CoordinationV1().Leases(lease.Namespace).Watch(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=waves"})
	if err != nil {
		t.Fatal(err)
	}
	defer lw.Stop()
	go func() {
		slots := map[string]string{} // slot Lease -> "holder phase rv", reboot grants only
		for ev := range lw.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				continue
			}
			delete(slots, l.Name)
			if g, err := lease.Parse(l); err == nil && g.Kind == lease.KindReboot && ev.Type != watch.Deleted {
				slots[l.Name] = fmt.Sprintf("%s %s rv %s", g.Holder, g.Phase, l.ResourceVersion)
			}
			// The pool's status as read after the event: status.canary says
			// passed no earlier than the pass that released the canary.
			p := &fleetv1.BootcNodePool{}
			_ = env.Client.Get(ctx, client.ObjectKey{Name: "waves"}, p)
			passed := p.Status.Canary != nil && p.Status.Canary.PassedTime != nil
			held := map[string]bool{}
			var seen []string
			for _, name := range slices.Sorted(maps.Keys(slots)) {
				h, _, _ := strings.Cut(slots[name], " ")
				held[h] = true
				seen = append(seen, name+": "+slots[name])
			}
			mu.Lock()
			inZones := map[string]bool{}
			for _, h := range sortedNames(held) {
				inZones[zones[h]] = true
				if h != "waves-n02" && !passed {
					violations = append(violations, fmt.Sprintf("%s holds a reboot slot before the canary passed", h))
				}
				if !slices.Contains(order, h) {
					order = append(order, h)
				}
			}
			if len(inZones) > 1 {
				twoZones = append(twoZones, fmt.Sprintf("reboot slots held in %d zones at once: %v", len(inZones), seen))
			}
			mu.Unlock()
		}
	}()
	f.run(ctx, 4)
	startCoordinator(t, "waves", nil)
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = v1.String()
		p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(4))
		p.Spec.Rollout.Canary = &fleetv1.CanarySpec{Nodes: ptr.To(intstr.FromInt32(1)), Soak: &metav1.Duration{Duration: 0}}
	})
	f.allOn(t, v1, 180*time.Second)
	eventually(t, 30*time.Second, "pool UpToDate", func() (bool, string) {
		c := f.condition(fleetv1.PoolUpToDate)
		return c.Status == metav1.ConditionTrue, c.Message
	})
	cancel()
	f.assertRebootsEach(t, 1)
	c := f.getPool().Status.Canary
	if c == nil || c.Target != v1.String() || strings.Join(c.Nodes, " ") != "waves-n02" || c.PassedTime == nil {
		t.Fatalf("status.canary %+v, want waves-n02 for %s, passed", c, v1)
	}
	if len(events(t, "waves", fleetv1.EventCanariesPassed)) != 1 {
		t.Errorf("CanariesPassed Events: %q, want one", events(t, "waves", fleetv1.EventCanariesPassed))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Errorf("%d violations, first: %s", len(violations), violations[0])
	}
	if len(order) != 4 || order[0] != "waves-n02" {
		t.Errorf("reboot slots seen in the order %q, want the canary waves-n02 first, then the rest", order)
	}
	// One zone at a time, as the API server saw the slots: the pass that
	// releases a zone's last slot grants nothing, so the next zone's grants
	// are written after that release, never beside it.
	if len(twoZones) > 0 {
		t.Errorf("%d observations with reboot slots in two zones, first: %s", len(twoZones), twoZones[0])
	}
}

func sortedNames(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
