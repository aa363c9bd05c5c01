package integration

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
)

// push writes a random image to ref over real HTTP and returns it pinned.
func push(t *testing.T, ref string) imageref.Pinned {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	p, err := imageref.PinnedFromDigest(ref, d.String())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestImageChangeMidRollout(t *testing.T) {
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ref := host + "/fleet/os:stable"
	first := push(t, ref)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base := imageref.Pinned{Repository: host + "/fleet/os", Digest: digestOf('0')}
	f := newFleet(t, "retag", 6, base)
	f.run(ctx, 2)
	startCoordinator(t, "retag", func(o *controller.Options) { o.InsecureRegistries = []string{host} })
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = ref
		p.Spec.Rollout.MaxUnavailable = ptr.To(intstr.FromInt32(2))
		p.Spec.Rollout.MaxStaging = ptr.To(intstr.FromInt32(2))
	})
	eventually(t, 90*time.Second, "a node in phase Reboot or updated", func() (bool, string) {
		for _, l := range f.leases(ctx) {
			if g, err := lease.Parse(&l); err == nil && g.Phase == lease.PhaseReboot {
				return true, ""
			}
		}
		return f.getPool().Status.Updated > 0, ""
	})
	if got := f.getPool().Status.TargetImage; got != first.String() {
		t.Fatalf("target %s, want %s", got, first)
	}
	second := push(t, ref) // the tag moves mid-rollout
	eventually(t, 60*time.Second, "an ImageChanged event", func() (bool, string) {
		for _, e := range events(t, "retag", fleetv1.EventImageChanged) {
			if strings.Contains(e, second.String()) {
				return true, ""
			}
		}
		return false, fmt.Sprint(allEvents(t, "retag"))
	})
	f.allOn(t, second, 90*time.Second)
	cancel()
	f.assertBudgetHeld(t)
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, n := range f.nodes {
		if n.reboots < 1 || n.reboots > 2 {
			t.Errorf("node %s rebooted %d times, want 1 (straight to the new image) or 2 (old, then new)", name, n.reboots)
		}
		// A grant revoked while Draining (the tag moved before the node
		// rebooted) is a grant without a reboot; a reboot without a grant
		// of its own never is (I3).
		if n.reboots > len(f.rebootGrants[name]) {
			t.Errorf("node %s rebooted %d times under %d reboot grants", name, n.reboots, len(f.rebootGrants[name]))
		}
	}
}

func TestResolveFailureDegradesPool(t *testing.T) {
	srv := httptest.NewServer(registry.New())
	host := strings.TrimPrefix(srv.URL, "http://")
	srv.Close() // nothing listens there now
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "noreg", 2, pinned("registry.example/os", '0'))
	f.run(ctx, 1)
	startCoordinator(t, "noreg", func(o *controller.Options) { o.InsecureRegistries = []string{host}; o.ResolveTimeout = time.Second })
	f.createPool(func(p *fleetv1.BootcNodePool) { p.Spec.Image = host + "/fleet/os:stable" })
	eventually(t, 90*time.Second, "Degraded ResolveFailed", func() (bool, string) {
		c := f.condition(fleetv1.PoolDegraded)
		return c.Status == metav1.ConditionTrue && c.Reason == fleetv1.ReasonResolveFailed, c.Reason + ": " + c.Message
	})
	for _, l := range f.leases(ctx) {
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
			t.Fatalf("slot %s granted without a resolved image", l.Name)
		}
	}
}
