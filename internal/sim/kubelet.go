package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Kubelet plays one node's kubelet: it registers the Node and keeps its Ready
// condition and nodeInfo.bootID true to the simulated machine.
type Kubelet struct {
	Client kubernetes.Interface
	Node   string
	Labels map[string]string
	// OS and Arch are what it reports as nodeInfo.operatingSystem and
	// .architecture (a kubelet's runtime.GOOS and GOARCH); empty: not written.
	OS, Arch string

	mu sync.Mutex
	// written is the Ready condition this kubelet last wrote (nil: none
	// yet), whose lastTransitionTime a write of the same status keeps.
	written *corev1.NodeCondition
}

// Register creates the Node (or takes over an existing one), Ready in bootID.
func (k *Kubelet) Register(ctx context.Context, bootID string) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.Node, Labels: k.Labels}}
	if _, err := k.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("registering node %s: %w", k.Node, err)
	}
	return k.SetReady(ctx, true, bootID)
}

// SetReady writes the Ready condition and, when bootID is not empty,
// nodeInfo.bootID, in one strategic-merge PATCH of nodes/status. That is a
// kubelet's one request per status update: a kubelet takes its Node from
// its own informer's cache, not from the API server (a GET only on a
// retry), and patches the status it computed
// (pkg/kubelet/kubelet_node_status.go, tryUpdateNodeStatus). This one needs
// no base at all, only the Ready condition it last wrote: conditions merge
// by type, so the patch touches Ready alone.
func (k *Kubelet) SetReady(ctx context.Context, ready bool, bootID string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	status, reason := corev1.ConditionTrue, "KubeletReady"
	if !ready {
		status, reason = corev1.ConditionFalse, "KubeletNotReady"
	}
	now := metav1.Now()
	cond := corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: reason,
		LastHeartbeatTime: now, LastTransitionTime: now}
	if k.written != nil && k.written.Status == status {
		cond.LastTransitionTime = k.written.LastTransitionTime
	}
	info := map[string]string{}
	if bootID != "" {
		info["bootID"] = bootID
	}
	if k.Arch != "" {
		info["operatingSystem"], info["architecture"] = k.OS, k.Arch
	}
	st := map[string]any{"conditions": []corev1.NodeCondition{cond}}
	if len(info) > 0 {
		st["nodeInfo"] = info
	}
	patch, err := json.Marshal(map[string]any{"status": st})
	if err != nil {
		return err
	}
	harnessNodeStatusWrites.Add(1)
	if _, err := k.Client.CoreV1().Nodes().PatchStatus(ctx, k.Node, patch); err != nil {
		return fmt.Errorf("writing node %s status: %w", k.Node, err)
	}
	k.written = &cond
	return nil
}

// The harness's own requests, counted so a benchmark can tell them from
// the product's in the API server's metrics (which do not name the user).
var harnessNodeStatusWrites, harnessPodLists atomic.Int64

// HarnessRequests returns how many Node status writes and pod LISTs (the
// pod watch's lists: one, and one more after a watch it could not resume)
// the simulated kubelets have sent so far.
func HarnessRequests() (statusWrites, podLists int64) {
	return harnessNodeStatusWrites.Load(), harnessPodLists.Load()
}

// FinishPodDeletions plays every kubelet's part in evictions: a pod marked
// for deletion is removed for good, as a kubelet does once its containers
// stopped. Like a kubelet it watches pods (one list, then a watch) instead
// of polling them: a LIST of every pod a few times a second cost more API
// requests than the rollout it served, and its consistent reads kept the
// API server asking etcd for progress, which every other consistent pod
// LIST then waited on (amendment 32). A deletion that fails is tried again
// on the informer's resync, from its cache. It runs until ctx ends.
func FinishPodDeletions(ctx context.Context, c kubernetes.Interface) {
	pods := c.CoreV1().Pods(metav1.NamespaceAll)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			harnessPodLists.Add(1)
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return pods.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.Pod{}, time.Second, cache.Indexers{})
	finish := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && p.DeletionTimestamp != nil {
			_ = c.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    finish,
		UpdateFunc: func(_, obj any) { finish(obj) },
	}); err != nil {
		return
	}
	inf.RunWithContext(ctx)
}
