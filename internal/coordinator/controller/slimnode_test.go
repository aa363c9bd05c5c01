package controller

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A kubelet's Node as the API server holds it: 50 images (its default
// nodeStatusMaxImages), addresses, capacities, volumes, managedFields.
func kubeletNode() *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1", ResourceVersion: "42",
			Labels: map[string]string{"pool": "a", "kubernetes.io/arch": "amd64"},
			Annotations: map[string]string{"fleet.bootc.dev/hold": "db migration", "karpenter.sh/do-not-disrupt": "false",
				"csi.volume.kubernetes.io/nodeid": `{"ebs.csi.aws.com":"i-0123456789abcdef0"}`, "node.alpha.kubernetes.io/ttl": "0"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate}}},
		Spec: corev1.NodeSpec{Unschedulable: true, PodCIDR: "10.0.1.0/24", Taints: []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"},
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status",
					LastHeartbeatTime: metav1.Unix(1, 0), LastTransitionTime: metav1.Unix(1, 0)}},
			NodeInfo:     corev1.NodeSystemInfo{BootID: "b1", OperatingSystem: "linux", Architecture: "amd64", KubeletVersion: "v1.34.1"},
			Addresses:    []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.7"}, {Type: corev1.NodeHostName, Address: "n1"}},
			Capacity:     corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")},
			Allocatable:  corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("7800m")},
			VolumesInUse: []corev1.UniqueVolumeName{"kubernetes.io/csi/ebs.csi.aws.com^vol-0123456789abcdef0"},
		},
	}
	for i := range 50 {
		repo := fmt.Sprintf("registry.example.com/team-%02d/service-with-a-long-name", i)
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{SizeBytes: 123456789, Names: []string{
			repo + "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", repo + ":v1.2.3"}})
	}
	return n
}

func TestSlimNodeKeepsWhatThePlannerReads(t *testing.T) {
	full := kubeletNode()
	before, _ := json.Marshal(full)
	out, err := slimNode()(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	n := out.(*corev1.Node)
	want := kubeletNode()
	// Of the annotations, the coordinator's own and the autoscalers' marks
	// it records and restores; of the conditions, Ready's status.
	ours := map[string]string{"fleet.bootc.dev/hold": "db migration", "karpenter.sh/do-not-disrupt": "false"}
	ready := []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	info := corev1.NodeSystemInfo{BootID: "b1", OperatingSystem: "linux", Architecture: "amd64"}
	if n.Name != want.Name || n.UID != want.UID || n.ResourceVersion != want.ResourceVersion ||
		!reflect.DeepEqual(n.Labels, want.Labels) || !reflect.DeepEqual(n.Annotations, ours) ||
		n.Spec.Unschedulable != want.Spec.Unschedulable || !reflect.DeepEqual(n.Status.Conditions, ready) ||
		n.Status.NodeInfo != info || nodeReady(n) != nodeReady(want) {
		t.Fatalf("slim node lost what the coordinator reads:\n%+v", n)
	}
	if n.Spec.Taints != nil || n.Spec.PodCIDR != "" {
		t.Fatalf("slim node kept spec the coordinator never reads: %+v", n.Spec)
	}
	if a := ownAnnotations(map[string]string{"other": "x"}); a != nil {
		t.Fatalf("a Node with none of the coordinator's annotations keeps %v", a)
	}
	if n.ManagedFields != nil || n.Status.Images != nil || n.Status.Addresses != nil || n.Status.Capacity != nil || n.Status.VolumesInUse != nil {
		t.Fatalf("slim node kept status the coordinator never reads: %+v", n.Status)
	}
	after, _ := json.Marshal(n)
	t.Logf("a kubelet's Node with 50 images: %d bytes of JSON, %d slim", len(before), len(after))
	// Other kinds only lose managedFields.
	l := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}}
	if o, err := slimNode()(l); err != nil || o.(*corev1.Pod).ManagedFields != nil {
		t.Fatalf("another kind: %v, %+v", err, o)
	}
}
