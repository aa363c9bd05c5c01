package plan

import (
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/platform"
)

// A multi-arch index and its images: the index digest is the pool's target,
// each node must be told its platform's image.
var (
	imgIndex = mustPinned("quay.io/example/os@sha256:" + hex('a'))
	imgAMD   = mustPinned("quay.io/example/os@sha256:" + hex('b'))
	imgARM   = mustPinned("quay.io/example/os@sha256:" + hex('c'))
	imgARM2  = mustPinned("quay.io/example/os@sha256:" + hex('d'))
	imgS390  = mustPinned("quay.io/example/os@sha256:" + hex('e'))
)

type indexEntry struct{ os, arch, variant string }

func newIndex(t *testing.T, dgst string, entries map[indexEntry]imageref.Pinned) *platform.Index {
	t.Helper()
	ix := &platform.Index{Digest: dgst}
	for e, img := range entries {
		if err := ix.Add(e.os, e.arch, e.variant, img.Digest); err != nil {
			t.Fatal(err)
		}
	}
	return ix
}

// mixedWorld is a pool of node-00 (amd64), node-01 (arm64), node-02 (amd64)
// and node-03 (arch), booted on imgV0 and waiting, rolling out index ix.
func mixedWorld(ix *platform.Index, arch3 string) *world {
	w := newWorld(4, 1, 4)
	for name, arch := range map[string]string{"node-00": "amd64", "node-01": "arm64", "node-02": "amd64", "node-03": arch3} {
		w.nodes[name].OS, w.nodes[name].Arch = "linux", arch
	}
	w.target, w.index = mustPinned("quay.io/example/os@"+ix.Digest), ix
	w.step()
	for _, name := range sortedKeys(w.nodes) {
		w.agentReports(name, imgV0, imageref.Pinned{}, fleetv1.PhaseWaiting)
	}
	return w
}

func twoArch(t *testing.T) *platform.Index {
	return newIndex(t, imgIndex.Digest, map[indexEntry]imageref.Pinned{
		{"linux", "amd64", ""}: imgAMD, {"linux", "arm64", "v8"}: imgARM,
	})
}

func TestEachNodeIsGivenItsPlatformsImage(t *testing.T) {
	all := func(amd, arm imageref.Pinned) map[string]imageref.Pinned {
		return map[string]imageref.Pinned{"node-00": amd, "node-01": arm, "node-02": amd, "node-03": arm}
	}
	for _, c := range []struct {
		name    string
		index   func(t *testing.T) *platform.Index // nil: a single manifest
		arch3   string                             // node-03's architecture
		want    map[string]imageref.Pinned
		missing map[string]string // nodes with no image, and why
	}{
		{name: "index with every platform", index: twoArch, arch3: "arm64", want: all(imgAMD, imgARM)},
		{name: "variant-less arm64 and amd64/v1 entries", arch3: "arm64", index: func(t *testing.T) *platform.Index {
			return newIndex(t, imgIndex.Digest, map[indexEntry]imageref.Pinned{{"linux", "amd64", "v1"}: imgAMD, {"linux", "arm64", ""}: imgARM})
		}, want: all(imgAMD, imgARM)},
		{name: "arm64/v9 and 32-bit arm do not serve an arm64 node", arch3: "amd64", index: func(t *testing.T) *platform.Index {
			return newIndex(t, imgIndex.Digest, map[indexEntry]imageref.Pinned{{"linux", "amd64", ""}: imgAMD, {"linux", "arm64", "v9"}: imgARM, {"linux", "arm", "v7"}: imgARM2})
		}, want: map[string]imageref.Pinned{"node-00": imgAMD, "node-02": imgAMD, "node-03": imgAMD},
			missing: map[string]string{"node-01": fleetv1.ReasonPlatformNotInIndex}},
		{name: "two arm64 images that cannot be told apart", arch3: "amd64", index: func(t *testing.T) *platform.Index {
			return newIndex(t, imgIndex.Digest, map[indexEntry]imageref.Pinned{{"linux", "amd64", ""}: imgAMD, {"linux", "arm64", ""}: imgARM, {"linux", "arm64", "v8"}: imgARM2})
		}, want: map[string]imageref.Pinned{"node-00": imgAMD, "node-02": imgAMD, "node-03": imgAMD},
			missing: map[string]string{"node-01": fleetv1.ReasonPlatformAmbiguous}},
		{name: "platform missing from the index", index: twoArch, arch3: "s390x",
			want:    map[string]imageref.Pinned{"node-00": imgAMD, "node-01": imgARM, "node-02": imgAMD},
			missing: map[string]string{"node-03": fleetv1.ReasonPlatformNotInIndex}},
		{name: "node reporting no architecture", index: twoArch, arch3: "",
			want:    map[string]imageref.Pinned{"node-00": imgAMD, "node-01": imgARM, "node-02": imgAMD},
			missing: map[string]string{"node-03": fleetv1.ReasonNodePlatformUnknown}},
		{name: "single manifest: every node the target, architecture or not", arch3: "", want: all(imgV1, imgV1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			ix := &platform.Index{Digest: imgV1.Digest}
			if c.index != nil {
				ix = c.index(t)
			}
			w := mixedWorld(ix, c.arch3)
			if c.index == nil {
				w.index = nil
			}
			// Stage grants go out in the pass that gives each BootcNode
			// its target (amendment 29).
			out := w.step()
			grants := map[string]imageref.Pinned{}
			for _, g := range changes(out, OpGrant, lease.KindStage) {
				grants[g.Node] = g.Image
			}
			if !reflect.DeepEqual(grants, c.want) {
				t.Fatalf("stage grants %v, want %v", grants, c.want)
			}
			for _, name := range sortedKeys(w.nodes) {
				want := ""
				if img, ok := c.want[name]; ok {
					want = img.String()
				}
				bn := w.bns[name]
				if bn.Spec.DesiredImage != want {
					t.Errorf("%s desiredImage %q, want %q", name, bn.Spec.DesiredImage, want)
				}
				if a := bn.Annotations[fleetv1.AnnotationNoPlatformImage]; (a == "") != (c.missing[name] == "") || !strings.HasPrefix(a, c.missing[name]) {
					t.Errorf("%s annotation %q, want reason %q", name, a, c.missing[name])
				}
			}
			if out.Status.TargetImage != w.target.String() {
				t.Fatalf("targetImage %s, want %s", out.Status.TargetImage, w.target)
			}
			if out.Status.Degraded != int32(len(c.missing)) {
				t.Fatalf("degraded %d, want %d", out.Status.Degraded, len(c.missing))
			}
			pc := cond(out, fleetv1.PoolPlatformImages)
			switch {
			case c.index == nil:
				if pc.Status != metav1.ConditionTrue || pc.Reason != fleetv1.ReasonSingleManifest {
					t.Fatalf("PlatformImages %+v", pc)
				}
			case len(c.missing) > 0:
				if pc.Status != metav1.ConditionFalse || pc.Reason != fleetv1.ReasonPlatformMissing {
					t.Fatalf("PlatformImages %+v", pc)
				}
				for name, why := range c.missing {
					if !strings.Contains(pc.Message, name+" ("+why+": ") {
						t.Fatalf("PlatformImages message %q does not name %s (%s)", pc.Message, name, why)
					}
				}
			default:
				if pc.Status != metav1.ConditionTrue || pc.Reason != fleetv1.ReasonPlatformsMatched {
					t.Fatalf("PlatformImages %+v", pc)
				}
			}
		})
	}
}

func TestIndexRolloutConvergesEachNodeOnItsPlatformImage(t *testing.T) {
	w := mixedWorld(twoArch(t), "arm64")
	w.converge(60, func(out Output) {
		for _, c := range out.Changes {
			if c.Op == OpGrant && c.Image == imgIndex {
				t.Fatalf("granted the index digest to %s: bootc would never report it", c.Node)
			}
		}
	})
	out := w.plan()
	want := map[string]imageref.Pinned{"node-00": imgAMD, "node-01": imgARM, "node-02": imgAMD, "node-03": imgARM}
	for name, img := range want {
		if got := bootedOf(w.bns[name]); got != img {
			t.Errorf("%s booted %s, want %s", name, got, img)
		}
	}
	if out.Status.Updated != 4 || cond(out, fleetv1.PoolUpToDate).Status != metav1.ConditionTrue {
		t.Fatalf("status %+v", out.Status)
	}
	if !strings.Contains(cond(out, fleetv1.PoolUpToDate).Message, "multi-arch index") {
		t.Fatalf("UpToDate message %q does not say the target is an index", cond(out, fleetv1.PoolUpToDate).Message)
	}
	if m := cond(out, fleetv1.PoolPlatformImages).Message; !strings.Contains(m, "linux/amd64 sha256:bbbbbbbbbbbb… (2 node(s))") || !strings.Contains(m, "linux/arm64 sha256:cccccccccccc… (2 node(s))") {
		t.Fatalf("PlatformImages message %q does not count nodes per platform", m)
	}
}

func TestRebootVerifiedOnlyOnTheNodesPlatformImage(t *testing.T) {
	for _, c := range []struct {
		name   string
		booted imageref.Pinned
		ok     bool
	}{
		{"its platform's image", imgARM, true},
		{"the index digest", imgIndex, false},
		{"another platform's image", imgAMD, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := mixedWorld(twoArch(t), "arm64")
			w.agentReports("node-01", imgV0, imgARM, fleetv1.PhaseStaged)
			w.step() // reboot grant for node-01
			s, ok := w.grantOf("node-01", lease.KindReboot)
			if !ok || s.Grant.Image != imgARM {
				t.Fatalf("reboot grant %+v, want one for %s", s.Grant, imgARM)
			}
			w.drains["node-01"] = Drain{Grant: s.Grant.ID, State: DrainDone}
			w.step()
			w.step()
			if s, _ := w.grantOf("node-01", lease.KindReboot); s.Grant.Phase != lease.PhaseReboot {
				t.Fatalf("grant not in phase Reboot: %+v", s.Grant)
			}
			w.boots["node-01"]++
			w.nodes["node-01"].BootID = bootID("node-01", w.boots["node-01"])
			w.agentReports("node-01", c.booted, imageref.Pinned{}, fleetv1.PhaseIdle)
			out := w.step()
			released := len(changes(out, OpRelease, lease.KindReboot)) == 1
			if released != c.ok {
				t.Fatalf("booted %s: released %v, want %v (%+v)", c.booted, released, c.ok, out.Changes)
			}
		})
	}
}

func TestNodeWithoutPlatformImageNeitherWedgesNorCountsAsDone(t *testing.T) {
	w := mixedWorld(twoArch(t), "s390x")
	out := w.plan()
	var bnEvents []Event
	for _, e := range out.Events {
		if e.BootcNode != "" {
			bnEvents = append(bnEvents, e)
		}
	}
	// mixedWorld's first step already wrote the annotation and its Event.
	if len(bnEvents) != 0 {
		t.Fatalf("Event repeated without a change: %+v", bnEvents)
	}
	w.converge(60, nil)
	out = w.plan()
	st := out.Status
	if st.Updated != 3 || st.Degraded != 1 || st.Failures != 0 || st.Nodes != 4 {
		t.Fatalf("status %+v, want 3 updated, 1 degraded, no failures", st)
	}
	if w.held(lease.KindReboot)+w.held(lease.KindStage) != 0 {
		t.Fatal("slots held at the end")
	}
	if c := cond(out, fleetv1.PoolUpToDate); c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "node-03") {
		t.Fatalf("UpToDate %+v: a node with no image is not done", c)
	}
	if c := cond(out, fleetv1.PoolHalted); c.Status != metav1.ConditionFalse {
		t.Fatalf("Halted %+v", c)
	}
	if c := cond(out, fleetv1.PoolDegraded); c.Reason != fleetv1.ReasonNodesDegraded || !strings.Contains(c.Message, "node-03 (PlatformNotInIndex)") {
		t.Fatalf("Degraded %+v", c)
	}
	if bootedOf(w.bns["node-03"]) != imgV0 || w.bns["node-03"].Spec.DesiredImage != "" {
		t.Fatalf("node-03: booted %s desired %q", bootedOf(w.bns["node-03"]), w.bns["node-03"].Spec.DesiredImage)
	}

	// The first plan that saw node-03 recorded it on the BootcNode.
	w2 := newWorld(1, 1, 1)
	w2.nodes["node-00"].OS, w2.nodes["node-00"].Arch = "linux", "s390x"
	w2.target, w2.index = imgIndex, twoArch(t)
	out = w2.step()
	if len(out.Events) == 0 || !hasBootcNodeEvent(out, "node-00", fleetv1.ReasonPlatformNotInIndex, "has no image for linux/s390x (it has linux/amd64, linux/arm64)") {
		t.Fatalf("no Event on BootcNode node-00: %+v", out.Events)
	}
	if len(out.CreateBootcNodes) != 1 || !strings.HasPrefix(out.CreateBootcNodes[0].NoPlatformImage, fleetv1.ReasonPlatformNotInIndex) {
		t.Fatalf("BootcNode created without the annotation: %+v", out.CreateBootcNodes)
	}
	// The index gains s390x: annotation removed, desired set, an Event says so.
	w2.index = newIndex(t, imgIndex.Digest, map[indexEntry]imageref.Pinned{{"linux", "s390x", ""}: imgS390})
	out = w2.step()
	if w2.bns["node-00"].Spec.DesiredImage != imgS390.String() || w2.bns["node-00"].Annotations[fleetv1.AnnotationNoPlatformImage] != "" {
		t.Fatalf("after the index gained s390x: %+v", w2.bns["node-00"])
	}
	if !hasBootcNodeEvent(out, "node-00", fleetv1.EventPlatformImageFound, imgS390.String()) {
		t.Fatalf("events %+v", out.Events)
	}
}

func hasBootcNodeEvent(out Output, bn, reason, substr string) bool {
	for _, e := range out.Events {
		if e.BootcNode == bn && e.Reason == reason && strings.Contains(e.Message, substr) {
			return true
		}
	}
	return false
}

func TestNewIndexMovesEachNodesTarget(t *testing.T) {
	w := mixedWorld(twoArch(t), "arm64")
	w.agentReports("node-01", imgV0, imgARM, fleetv1.PhaseStaged)
	w.step() // node-01 reboot grant (Draining); the others stage
	if s, ok := w.grantOf("node-01", lease.KindReboot); !ok || s.Grant.Image != imgARM {
		t.Fatal("setup: node-01 has no reboot grant")
	}
	// The tag moves to an index without arm64, and a new amd64 image.
	amd2 := mustPinned("quay.io/example/os@sha256:" + hex('f'))
	w.target = mustPinned("quay.io/example/os@sha256:" + hex('9'))
	w.index = newIndex(t, w.target.Digest, map[indexEntry]imageref.Pinned{{"linux", "amd64", ""}: amd2})
	out := w.step()
	if rv := changes(out, OpRevoke, lease.KindReboot); len(rv) != 1 || rv[0].Node != "node-01" || !rv[0].Uncordon {
		t.Fatalf("reboot revokes %+v", rv)
	}
	if !hasEvent(out, fleetv1.EventGrantRevoked, "has no image for the node (PlatformNotInIndex") {
		t.Fatalf("revoke event does not say why: %+v", out.Events)
	}
	if got := nodesOf(changes(out, OpRevoke, lease.KindStage)); !reflect.DeepEqual(got, []string{"node-00", "node-02", "node-03"}) {
		t.Fatalf("stage revokes %v", got)
	}
	for name, want := range map[string]string{"node-00": amd2.String(), "node-01": "", "node-02": amd2.String(), "node-03": ""} {
		if got := w.bns[name].Spec.DesiredImage; got != want {
			t.Errorf("%s desired %q, want %q", name, got, want)
		}
	}
	// The same pass grants the amd64 nodes their new target (amendment 29).
	if got := nodesOf(changes(out, OpGrant, lease.KindStage)); !reflect.DeepEqual(got, []string{"node-00", "node-02"}) {
		t.Fatalf("stage grants after the change %v, want the amd64 nodes", got)
	}
	for _, c := range changes(out, OpGrant, lease.KindStage) {
		if c.Image != amd2 {
			t.Fatalf("stage grant for %s", c.Image)
		}
	}
}

func TestTargetOfUnknownKindKeepsEachNodesDesiredImage(t *testing.T) {
	w := mixedWorld(twoArch(t), "arm64")
	w.step()
	before := map[string]string{}
	for name, bn := range w.bns {
		before[name] = bn.Spec.DesiredImage
	}
	// A restarted coordinator whose registry is down: the target from the
	// pool's status, not known to be an index.
	w.index, w.indexUnknown, w.resolveErr = nil, true, "RegistryUnreachable: connection refused"
	out := w.step()
	if len(changes(out, OpRevoke, lease.KindStage))+len(changes(out, OpGrant, lease.KindStage)) != 0 || len(out.UpdateBootcNodes) != 0 {
		t.Fatalf("acted on an unknown target: changes %+v updates %+v", out.Changes, out.UpdateBootcNodes)
	}
	for name, bn := range w.bns {
		if bn.Spec.DesiredImage != before[name] {
			t.Fatalf("%s desired moved from %s to %s", name, before[name], bn.Spec.DesiredImage)
		}
	}
	if c := cond(out, fleetv1.PoolPlatformImages); c.Status != metav1.ConditionUnknown {
		t.Fatalf("PlatformImages %+v", c)
	}
}

func TestUninspectedDigestIsGivenAsWritten(t *testing.T) {
	w := settled(2, 1, 2)
	w.uninspected = "RegistryUnreachable: dial tcp: connection refused"
	out := w.step()
	if len(changes(out, OpGrant, lease.KindStage)) != 2 || w.bns["node-00"].Spec.DesiredImage != imgV1.String() {
		t.Fatalf("grants %+v desired %s", out.Changes, w.bns["node-00"].Spec.DesiredImage)
	}
	c := cond(out, fleetv1.PoolPlatformImages)
	if c.Status != metav1.ConditionUnknown || c.Reason != fleetv1.ReasonNotInspected || !strings.Contains(c.Message, "connection refused") {
		t.Fatalf("PlatformImages %+v", c)
	}
}
