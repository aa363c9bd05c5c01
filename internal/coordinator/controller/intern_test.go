package controller

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// reportingBootcNode is the JSON of node i's BootcNode mid-rollout, as the
// API server sends it: the coordinator's spec and annotations, the agent's
// status, managedFields.
func reportingBootcNode(t testing.TB, i int) []byte {
	repo := "quay.example.com/fleet/os"
	d := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	now := metav1.NewTime(time.Unix(1700000000, 0))
	bn := fleetv1.BootcNode{
		TypeMeta: metav1.TypeMeta{APIVersion: fleetv1.GroupVersion.String(), Kind: "BootcNode"},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%04d", i), UID: types.UID(fmt.Sprintf("0000%04d-0000-4000-8000-000000000000", i)),
			ResourceVersion: fmt.Sprint(1000 + i), Generation: 3, CreationTimestamp: now,
			Annotations: map[string]string{fleetv1.AnnotationRolloutState: "WaitingForRebootSlot", fleetv1.AnnotationRolloutReason: "staged; every reboot slot is held (maxUnavailable 500)"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: fleetv1.GroupVersion.String(), Kind: "BootcNodePool", Name: "workers",
				UID: "11111111-2222-4333-8444-555555555555", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "bootc-fleet-agent", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status"}}},
		Spec: fleetv1.BootcNodeSpec{Pool: "workers", DesiredImage: repo + "@" + d("2"), RebootPolicy: fleetv1.RebootPolicyReboot},
		Status: fleetv1.BootcNodeStatus{ObservedGeneration: 3, BootID: fmt.Sprintf("b%07d-0000-4000-8000-000000000000", i), Phase: fleetv1.PhaseStaged,
			Booted:         &fleetv1.Deployment{Image: repo + "@" + d("1"), Digest: d("1"), Version: "42.20261201.0", Timestamp: &now},
			Staged:         &fleetv1.Deployment{Image: repo + "@" + d("2"), Digest: d("2"), Version: "42.20261202.0", DownloadOnly: true, Timestamp: &now},
			Rollback:       &fleetv1.Deployment{Image: repo + "@" + d("0"), Digest: d("0"), Version: "42.20261130.0", Timestamp: &now},
			Conditions:     []metav1.Condition{{Type: fleetv1.ConditionAPIAccess, Status: metav1.ConditionTrue, Reason: "Reachable", Message: "the API server answers", LastTransitionTime: now}},
			AgentVersion:   "v0.1.0",
			LastReportTime: &metav1.MicroTime{Time: now.Time}},
	}
	b, err := json.Marshal(bn)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCachedBootcNodeKeepsWhatTheCoordinatorReads(t *testing.T) {
	transform := sharedStrings(crcache.TransformStripManagedFields())
	var got []*fleetv1.BootcNode
	for i := range 2 {
		var bn, want fleetv1.BootcNode
		b := reportingBootcNode(t, i)
		if err := json.Unmarshal(b, &bn); err != nil {
			t.Fatal(err)
		}
		_ = json.Unmarshal(b, &want)
		// What the coordinator never reads goes.
		want.ManagedFields, want.Status.AgentVersion = nil, ""
		for _, d := range []*fleetv1.Deployment{want.Status.Booted, want.Status.Staged, want.Status.Rollback} {
			d.Version, d.Timestamp = "", nil
		}
		out, err := transform(&bn)
		if err != nil {
			t.Fatal(err)
		}
		if !equalJSON(t, out, &want) {
			t.Fatalf("the transform changed what a BootcNode says:\n%+v\nwant\n%+v", out, &want)
		}
		got = append(got, out.(*fleetv1.BootcNode))
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	a, b := got[0], got[1]
	if !same(a.Spec.DesiredImage, b.Spec.DesiredImage) || !same(a.Status.Staged.Image, b.Status.Staged.Image) ||
		!same(a.Annotations[fleetv1.AnnotationRolloutReason], b.Annotations[fleetv1.AnnotationRolloutReason]) ||
		!same(a.OwnerReferences[0].Name, b.OwnerReferences[0].Name) {
		t.Error("two BootcNodes naming the same images each keep a copy")
	}
	if same(a.Status.BootID, b.Status.BootID) {
		t.Error("different boot IDs share memory")
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// The heap 5,000 cached BootcNodes take, decoded as the cache decodes them,
// with managedFields stripped only (before) and with shared strings (now).
func TestInternedBootcNodesTakeLessHeap(t *testing.T) {
	const n = 5000
	raw := make([][]byte, n)
	for i := range raw {
		raw[i] = reportingBootcNode(t, i)
	}
	heapOf := func(transform func(any) (any, error)) int64 {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		keep := make([]any, n)
		for i, b := range raw {
			bn := &fleetv1.BootcNode{}
			if err := json.Unmarshal(b, bn); err != nil {
				t.Fatal(err)
			}
			out, err := transform(bn)
			if err != nil {
				t.Fatal(err)
			}
			keep[i] = out
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(keep)
		return int64(after.HeapAlloc) - int64(before.HeapAlloc)
	}
	strip := heapOf(crcache.TransformStripManagedFields())
	shared := heapOf(sharedStrings(crcache.TransformStripManagedFields()))
	runtime.KeepAlive(raw)
	t.Logf("%d cached BootcNodes: %.1f MiB with managedFields stripped, %.1f MiB with shared strings (%d and %d bytes each)",
		n, float64(strip)/(1<<20), float64(shared)/(1<<20), strip/n, shared/n)
	if shared >= strip*3/4 {
		t.Errorf("shared strings saved too little: %d bytes a BootcNode against %d", shared/n, strip/n)
	}
}
