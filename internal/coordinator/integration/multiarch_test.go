package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	ggcrv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
)

// pushIndex writes a multi-arch index of random images, one per linux
// architecture, to ref over real HTTP; it returns the index and each
// architecture's image, pinned.
func pushIndex(t *testing.T, ref string, arches ...string) (imageref.Pinned, map[string]imageref.Pinned) {
	t.Helper()
	var adds []mutate.IndexAddendum
	imgs := map[string]imageref.Pinned{}
	for _, arch := range arches {
		img, err := random.Image(256, 1)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		if imgs[arch], err = imageref.PinnedFromDigest(ref, d.String()); err != nil {
			t.Fatal(err)
		}
		pl := &ggcrv1.Platform{OS: "linux", Architecture: arch}
		if arch == "arm64" {
			pl.Variant = "v8"
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: ggcrv1.Descriptor{Platform: pl}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	tag, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatal(err)
	}
	d, _ := idx.Digest()
	p, err := imageref.PinnedFromDigest(ref, d.String())
	if err != nil {
		t.Fatal(err)
	}
	return p, imgs
}

// TestMultiArchIndexPinnedByDigest rolls a digest-pinned multi-arch index
// (as fedora-bootc is published) over amd64 and arm64 nodes and one s390x
// node the index has no image for. Each node must be given, granted, and
// verified on its own platform's image; the s390x node gets nothing, is
// named on the pool and its BootcNode, and the others converge anyway.
func TestMultiArchIndexPinnedByDigest(t *testing.T) {
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	index, imgs := pushIndex(t, host+"/fleet/os:multi", "amd64", "arm64")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "multi", 5, imageref.Pinned{Repository: host + "/fleet/os", Digest: digestOf('0')})
	arch := map[string]string{"multi-n00": "amd64", "multi-n01": "arm64", "multi-n02": "amd64", "multi-n03": "arm64", "multi-n04": "s390x"}
	for n, a := range arch {
		f.nodes[n].arch = a
		f.writeNodeStatus(ctx, f.nodes[n])
	}
	f.peel = map[string]map[string]imageref.Pinned{index.Digest: imgs}
	f.run(ctx, 1)
	startCoordinator(t, "multi", func(o *controller.Options) { o.InsecureRegistries = []string{host} })
	f.createPool(func(p *fleetv1.BootcNodePool) {
		p.Spec.Image = index.String()
		p.Spec.Rollout.MaxStaging = ptr.To(intstr.FromInt32(2))
	})

	eventually(t, 120*time.Second, "the amd64 and arm64 nodes on their platform's image", func() (bool, string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		var behind []string
		for n, a := range arch {
			if want, ok := imgs[a]; ok && f.nodes[n].booted != want {
				behind = append(behind, n)
			}
		}
		sort.Strings(behind)
		return len(behind) == 0, fmt.Sprintf("behind: %v; pool %+v", behind, f.getPool().Status)
	})
	eventually(t, 30*time.Second, "the pool counting 4 updated and 1 degraded", func() (bool, string) {
		st := f.getPool().Status
		return st.Updated == 4 && st.Degraded == 1 && st.Rebooting == 0, fmt.Sprintf("%+v", st)
	})
	st := f.getPool().Status
	if st.TargetImage != index.String() || st.Failures != 0 {
		t.Fatalf("targetImage %s failures %d, want the index %s and none", st.TargetImage, st.Failures, index)
	}
	if c := f.condition(fleetv1.PoolPlatformImages); c.Status != metav1.ConditionFalse || c.Reason != fleetv1.ReasonPlatformMissing ||
		!strings.Contains(c.Message, "multi-n04 (PlatformNotInIndex") || !strings.Contains(c.Message, "linux/s390x") {
		t.Fatalf("PlatformImages %+v does not name multi-n04", c)
	}
	if c := f.condition(fleetv1.PoolHalted); c.Status != metav1.ConditionFalse {
		t.Fatalf("Halted %+v: a node without an image must not halt the pool", c)
	}
	if c := f.condition(fleetv1.PoolUpToDate); c.Status != metav1.ConditionFalse {
		t.Fatalf("UpToDate %+v with a node that has no image", c)
	}

	for n, a := range arch {
		var bn fleetv1.BootcNode
		if err := f.c.Get(ctx, client.ObjectKey{Name: n}, &bn); err != nil {
			t.Fatal(err)
		}
		want, ok := imgs[a]
		f.mu.Lock()
		grantImages, reboots := f.grantImages[n], f.nodes[n].reboots
		f.mu.Unlock()
		switch {
		case ok:
			if bn.Spec.DesiredImage != want.String() || bn.Annotations[fleetv1.AnnotationNoPlatformImage] != "" {
				t.Errorf("%s (%s): desired %s annotations %v, want %s", n, a, bn.Spec.DesiredImage, bn.Annotations, want)
			}
			// Every grant (and so the lease image annotation) named its platform's image.
			for img := range grantImages {
				if img != want.String() {
					t.Errorf("%s (%s) was granted %s, want only %s", n, a, img, want)
				}
			}
			if reboots != 1 {
				t.Errorf("%s rebooted %d times, want 1", n, reboots)
			}
		default:
			if bn.Spec.DesiredImage != "" || !strings.HasPrefix(bn.Annotations[fleetv1.AnnotationNoPlatformImage], fleetv1.ReasonPlatformNotInIndex+": ") {
				t.Errorf("%s (%s): desired %q annotations %v, want none and the annotation", n, a, bn.Spec.DesiredImage, bn.Annotations)
			}
			if len(grantImages) != 0 || reboots != 0 {
				t.Errorf("%s without an image got grants %v and rebooted %d times", n, grantImages, reboots)
			}
		}
	}
	eventually(t, 30*time.Second, "an Event on BootcNode multi-n04", func() (bool, string) {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx, &evs); err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.Regarding.Kind == "BootcNode" && e.Regarding.Name == "multi-n04" && e.Reason == fleetv1.ReasonPlatformNotInIndex &&
				e.Type == "Warning" && strings.Contains(e.Note, "linux/s390x") && e.Related != nil && e.Related.Name == "multi" {
				return true, ""
			}
		}
		return false, fmt.Sprint(allEvents(t, "multi-n04"))
	})
	cancel()
	f.assertBudgetHeld(t)
}

// TestMultiArchTargetKeptAcrossRestartWhileRegistryDown: a coordinator that
// restarts while the registry does not answer knows the pool's target only
// from its status, not whether it is an index. It must keep every node's
// platform image (not hand out the index digest), and pick up again once the
// registry answers.
func TestMultiArchTargetKeptAcrossRestartWhileRegistryDown(t *testing.T) {
	var down atomic.Bool
	reg := registry.New()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ref := host + "/fleet/os:multi"
	index, imgs := pushIndex(t, ref, "amd64", "arm64")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFleet(t, "marest", 2, imageref.Pinned{Repository: host + "/fleet/os", Digest: digestOf('0')})
	arch := map[string]string{"marest-n00": "amd64", "marest-n01": "arm64"}
	for n, a := range arch {
		f.nodes[n].arch = a
		f.writeNodeStatus(ctx, f.nodes[n])
	}
	f.peel = map[string]map[string]imageref.Pinned{index.Digest: imgs}
	f.run(ctx, 1)
	opts := func(o *controller.Options) { o.InsecureRegistries = []string{host}; o.ResolveTimeout = 2 * time.Second }
	stop := startCoordinator(t, "marest", opts)
	f.createPool(func(p *fleetv1.BootcNodePool) { p.Spec.Image = ref })
	desired := func() map[string]string {
		out := map[string]string{}
		for n := range arch {
			var bn fleetv1.BootcNode
			if err := f.c.Get(ctx, client.ObjectKey{Name: n}, &bn); err == nil {
				out[n] = bn.Spec.DesiredImage
			}
		}
		return out
	}
	want := map[string]string{"marest-n00": imgs["amd64"].String(), "marest-n01": imgs["arm64"].String()}
	eventually(t, 90*time.Second, "both nodes updated", func() (bool, string) {
		st := f.getPool().Status
		return st.Updated == 2 && st.Rebooting == 0, fmt.Sprintf("%+v", st)
	})

	stop()
	down.Store(true)
	startCoordinator(t, "marest-2", opts)
	eventually(t, 60*time.Second, "Degraded ResolveFailed from the new coordinator", func() (bool, string) {
		c := f.condition(fleetv1.PoolDegraded)
		return c.Status == metav1.ConditionTrue && c.Reason == fleetv1.ReasonResolveFailed, fmt.Sprintf("%+v", c)
	})
	eventually(t, 30*time.Second, "PlatformImages Unknown while the registry is down", func() (bool, string) {
		c := f.condition(fleetv1.PoolPlatformImages)
		return c.Status == metav1.ConditionUnknown && c.Reason == fleetv1.ReasonResolveFailed, fmt.Sprintf("%+v", c)
	})
	// A few reconciles later the nodes still have their platform images.
	time.Sleep(3 * time.Second)
	if got := desired(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("desired images while the registry is down %v, want %v", got, want)
	}
	if st := f.getPool().Status; st.Updated != 2 || st.TargetImage != index.String() {
		t.Fatalf("status while the registry is down %+v", st)
	}

	down.Store(false)
	eventually(t, 60*time.Second, "PlatformImages True again", func() (bool, string) {
		c := f.condition(fleetv1.PoolPlatformImages)
		return c.Status == metav1.ConditionTrue && c.Reason == fleetv1.ReasonPlatformsMatched, fmt.Sprintf("%+v", c)
	})
	if got := desired(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("desired images after the registry came back %v, want %v", got, want)
	}
	cancel()
	f.assertBudgetHeld(t)
	f.assertRebootsEach(t, 1)
}
