// Package drain cordons, drains and uncordons the Nodes the coordinator is
// about to reboot, with kubectl's drain library.
//
// A drain evicts through the Eviction API, so the API server enforces every
// PodDisruptionBudget. It leaves DaemonSet pods (their controller would put
// them right back, and they must keep running on the node until the reboot)
// and mirror pods (the kubelet owns them). It also evicts:
//   - pods with emptyDir volumes: their data does not survive the node's
//     reboot anyway;
//   - pods without a controller: a reboot would kill them just the same, and
//     refusing them would let any stray pod halt a rollout forever. Such a
//     pod is logged, and is not recreated anywhere.
//
// Each pod gets its own terminationGracePeriodSeconds. Cordon first: Drain
// does not cordon, so the caller controls (and records) who cordoned.
package drain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/kubernetes"
	kdrain "k8s.io/kubectl/pkg/drain"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
)

const (
	// defaultRetryDelay is the pause between eviction attempts that a
	// PodDisruptionBudget refused (kubectl drain waits 5s).
	defaultRetryDelay = 2 * time.Second
	// reportTimeout bounds the API reads that explain a failed drain.
	reportTimeout = 10 * time.Second
	// maxListed bounds how many pods an error message names.
	maxListed = 5
)

// Drainer cordons, drains and uncordons Nodes.
type Drainer struct {
	client     kubernetes.Interface
	log        logr.Logger
	retryDelay time.Duration
}

// New returns a Drainer that acts through client and logs progress to log.
func New(client kubernetes.Interface, log logr.Logger) *Drainer {
	return &Drainer{client: client, log: log, retryDelay: defaultRetryDelay}
}

// Cordon marks node unschedulable and, in the same conditional update,
// annotates it with mark (lease.NodeAnnotationCordonedFor: the grant it is
// cordoned for). wasCordoned reports that the Node was already cordoned
// (then nothing is written), whoever did it and whatever mark it carries:
// only a cordon this very call made is the caller's, because anyone who may
// write the Node's annotations can copy a mark (amendment 21). The write is
// conditional on the Node's resourceVersion, so a cordon by someone else
// between the read and the write is seen, not claimed.
//
// written is the Node as the API server returned it after the write (nil
// when nothing was written), so the caller can wait for its cache to show it.
//
// seen, if not nil, is the Node as the caller last saw it (say, in its
// cache): it stands in for the first read, which saves a round trip. That
// is safe because the write is conditional on its resourceVersion: a stale
// copy fails with Conflict, and the Node is then read afresh.
//
// The same update sets the autoscaler marks for the grant's slot (the Lease
// name mark begins with) and records them (HoldFromAutoscalers); a Node
// cordoned already gets them from MarkAutoscalers.
func (d *Drainer) Cordon(ctx context.Context, node, mark string, seen *corev1.Node) (wasCordoned bool, written *corev1.Node, err error) {
	written, err = d.setUnschedulable(ctx, node, true, mark, &wasCordoned, seen)
	return wasCordoned, written, err
}

// Uncordon marks node schedulable and removes the mark and, in the same
// update, the autoscaler marks the coordinator set (ReleaseFromAutoscalers);
// a no-op if there is nothing to change. written and seen are as for Cordon.
func (d *Drainer) Uncordon(ctx context.Context, node string, seen *corev1.Node) (written *corev1.Node, err error) {
	return d.setUnschedulable(ctx, node, false, "", nil, seen)
}

func (d *Drainer) setUnschedulable(ctx context.Context, node string, want bool, mark string, already *bool, seen *corev1.Node) (*corev1.Node, error) {
	verb := map[bool]string{true: "cordoning", false: "uncordoning"}[want]
	for {
		n := seen
		seen = nil
		if n == nil || n.Name != node {
			var err error
			if n, err = d.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
				return nil, fmt.Errorf("%s node %s: %w", verb, node, err)
			}
		} else if n.Spec.Unschedulable == want {
			// What decides "someone else's cordon" or "nothing to do" is
			// read afresh; only a write may rest on the copy.
			continue
		}
		_, marked := n.Annotations[lease.NodeAnnotationCordonedFor]
		marks := d.autoscalerMarks(n, want, mark)
		if n.Spec.Unschedulable == want {
			if already != nil {
				*already = true
			}
			if want || (!marked && len(marks) == 0) {
				return nil, nil
			}
		}
		// A merge patch carrying resourceVersion is a conditional write:
		// it fails with Conflict if the Node changed since the read.
		annotations := map[string]any{lease.NodeAnnotationCordonedFor: nil} // null removes it
		if want && mark != "" {
			annotations[lease.NodeAnnotationCordonedFor] = mark
		}
		for k, v := range marks {
			annotations[k] = v
		}
		body, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": n.ResourceVersion, "annotations": annotations},
			"spec":     map[string]any{"unschedulable": want},
		})
		if err != nil {
			return nil, err
		}
		written, err := d.client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s node %s: %w", verb, node, err)
		}
		if want {
			d.log.Info("cordoned node", "node", node, "grant", mark)
		} else {
			// The grant whose cordon this lifted: the mark as read.
			lifted := n.Annotations[lease.NodeAnnotationCordonedFor]
			if lifted == "" {
				lifted = "(the Node carried no grant's mark)"
			}
			d.log.Info("uncordoned node", "node", node, "grant", lifted)
		}
		return written, nil
	}
}

// Drain evicts the pods of node (see the package comment for which) and
// waits until they are gone, for at most timeout (<= 0: until ctx ends).
// On failure it returns a *BlockedError naming the pods still on the node and
// the PodDisruptionBudgets covering them. If ctx ended, the error also
// matches ctx.Err() with errors.Is.
func (d *Drainer) Drain(ctx context.Context, node string, timeout time.Duration) error {
	dctx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		dctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()

	log := d.log.WithValues("node", node)
	h := d.helper(dctx, timeout, log)
	list, errs := h.GetPodsForDeletion(node)
	if list == nil {
		// The list itself failed, or got no answer before the timeout:
		// which pods are on the node is not known, and a second list for
		// the report would wait on the same API server (amendment 33).
		log.Info("the pod list of the drain failed", "error", utilerrors.NewAggregate(errs).Error())
		return d.unlisted(ctx, dctx, node, timeout, utilerrors.NewAggregate(errs))
	}
	if len(errs) > 0 {
		// Pods the drain may not remove: the list says which.
		return d.report(ctx, dctx, node, timeout, utilerrors.NewAggregate(errs), list)
	}
	if w := list.Warnings(); w != "" {
		log.Info("drain leaves or force-evicts some pods", "warnings", w)
	}
	pods := list.Pods()
	log.Info("draining node", "pods", len(pods), "timeout", timeout.String())
	if err := h.DeleteOrEvictPods(pods); err != nil {
		return d.blocked(ctx, dctx, node, timeout, err)
	}
	log.Info("drained node", "evicted", len(pods))
	return nil
}

func (d *Drainer) helper(ctx context.Context, timeout time.Duration, log logr.Logger) *kdrain.Helper {
	return &kdrain.Helper{
		Ctx:                  ctx,
		Client:               d.client,
		Force:                true,
		GracePeriodSeconds:   -1,
		IgnoreAllDaemonSets:  true,
		DeleteEmptyDirData:   true,
		Timeout:              max(timeout, 0),
		EvictErrorRetryDelay: d.retryDelay,
		// kubectl's printed progress: "evicting pod" lines and the
		// PodDisruptionBudget refusals it retries.
		Out:    logWriter{log.V(2)},
		ErrOut: logWriter{log.V(1)},
		OnPodDeletionOrEvictionStarted: func(pod *corev1.Pod, usingEviction bool) {
			log.V(1).Info("evicting pod", "pod", key(pod), "eviction", usingEviction)
		},
		OnPodDeletionOrEvictionFinished: func(pod *corev1.Pod, _ bool, err error) {
			if err != nil {
				log.Info("pod eviction failed", "pod", key(pod), "error", err.Error())
				return
			}
			log.Info("evicted pod", "pod", key(pod))
		},
	}
}

// newBlocked is the BlockedError of a drain that failed with cause.
func newBlocked(ctx, dctx context.Context, node string, timeout time.Duration, cause error) *BlockedError {
	be := &BlockedError{Node: node, Err: cause, Timeout: timeout}
	switch {
	case ctx.Err() != nil:
		be.Err = fmt.Errorf("%w: %w", ctx.Err(), cause)
	case timeout > 0 && errors.Is(dctx.Err(), context.DeadlineExceeded):
		be.TimedOut = true
	}
	return be
}

// unlisted is the BlockedError of a drain whose pod list failed (or got no
// answer in time): it names no pod, and lists none again.
func (d *Drainer) unlisted(ctx, dctx context.Context, node string, timeout time.Duration, cause error) error {
	be := newBlocked(ctx, dctx, node, timeout, cause)
	be.Unlisted = true
	return be
}

// blocked explains a drain that failed while it evicted: which pods are
// still on the node (listed again) and which PodDisruptionBudgets cover
// them.
func (d *Drainer) blocked(ctx, dctx context.Context, node string, timeout time.Duration, cause error) error {
	be := newBlocked(ctx, dctx, node, timeout, cause)
	// The drain's context may be over; the report gets its own, short one.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportTimeout)
	defer cancel()
	h := d.helper(rctx, 0, logr.Discard())
	list, errs := h.GetPodsForDeletion(node)
	if list == nil {
		be.Err = also(be.Err, fmt.Errorf("listing the pods left on node %s: %w", node, utilerrors.NewAggregate(errs)))
		return be
	}
	return d.explain(rctx, be, list)
}

// report explains a drain whose list named pods it may not remove, from
// that list.
func (d *Drainer) report(ctx, dctx context.Context, node string, timeout time.Duration, cause error, list *kdrain.PodDeleteList) error {
	be := newBlocked(ctx, dctx, node, timeout, cause)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportTimeout)
	defer cancel()
	return d.explain(rctx, be, list)
}

// explain fills be with the pods of list and the PodDisruptionBudgets
// covering them.
func (d *Drainer) explain(rctx context.Context, be *BlockedError, list *kdrain.PodDeleteList) error {
	pdbs := map[string][]pdbSelector{} // by namespace
	seen := map[string]bool{}
	for _, p := range list.Pods() {
		block := PodBlock{Pod: key(&p), Terminating: p.DeletionTimestamp != nil}
		sels, ok := pdbs[p.Namespace]
		if !ok {
			var err error
			if sels, err = d.pdbsIn(rctx, p.Namespace); err != nil {
				be.Err = also(be.Err, err)
			}
			pdbs[p.Namespace] = sels
		}
		for _, s := range sels {
			if s.selector.Matches(labels.Set(p.Labels)) {
				block.PDBs = append(block.PDBs, s.name)
				if !seen[s.name] {
					seen[s.name] = true
					be.PDBs = append(be.PDBs, s.name)
				}
			}
		}
		be.Pods = append(be.Pods, block.Pod)
		be.Details = append(be.Details, block)
	}
	sort.Strings(be.Pods)
	sort.Strings(be.PDBs)
	sort.Slice(be.Details, func(i, j int) bool { return be.Details[i].Pod < be.Details[j].Pod })
	return be
}

// also adds more to err, on one line (the message ends up in a condition).
func also(err, more error) error {
	if err == nil {
		return more
	}
	return fmt.Errorf("%w; %w", err, more)
}

type pdbSelector struct {
	name     string // namespace/name
	selector labels.Selector
}

// pdbsIn lists the PodDisruptionBudgets of namespace with their selectors,
// matched the way the Eviction API matches them (an empty selector matches
// every pod of the namespace in policy/v1).
func (d *Drainer) pdbsIn(ctx context.Context, namespace string) ([]pdbSelector, error) {
	list, err := d.client.PolicyV1().PodDisruptionBudgets(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing PodDisruptionBudgets in %s: %w", namespace, err)
	}
	var out []pdbSelector
	for _, p := range list.Items {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil {
			continue // the API server would not match it either
		}
		out = append(out, pdbSelector{name: p.Namespace + "/" + p.Name, selector: sel})
	}
	return out, nil
}

// BlockedError is a drain that did not complete.
type BlockedError struct {
	Node string
	Pods []string // namespace/name of the pods still on the node
	PDBs []string // namespace/name of the PodDisruptionBudgets covering them
	Err  error    // the drain's own failure

	Timeout  time.Duration // the drain's timeout (<= 0: none)
	TimedOut bool          // the timeout ran out (not the caller's ctx)
	Details  []PodBlock    // per pod, what holds it
	// Unlisted: the drain's pod list failed or got no answer, so which
	// pods are on the node is not known (Pods is empty).
	Unlisted bool
}

// PodBlock is one pod a drain could not remove.
type PodBlock struct {
	Pod         string   // namespace/name
	PDBs        []string // namespace/name of the PodDisruptionBudgets covering it
	Terminating bool     // evicted, waiting for its containers to stop
}

func (e *BlockedError) Error() string {
	var b strings.Builder
	b.WriteString("drain of " + e.Node)
	if e.TimedOut {
		fmt.Fprintf(&b, " timed out after %s", e.Timeout)
	} else {
		b.WriteString(" failed")
	}
	if e.Unlisted {
		if e.TimedOut {
			b.WriteString(": the API server did not answer the pod list")
		} else {
			fmt.Fprintf(&b, ": listing the pods on the node: %v", e.Err)
		}
		return b.String()
	}
	details := e.Details
	if len(details) == 0 {
		for _, p := range e.Pods {
			details = append(details, PodBlock{Pod: p})
		}
	}
	for i, p := range details {
		if i == maxListed {
			fmt.Fprintf(&b, "; and %d more pods", len(details)-maxListed)
			break
		}
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	// A timeout is fully told by the pods; any other failure needs its cause.
	if !e.TimedOut && e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

func (e *BlockedError) Unwrap() error { return e.Err }

func (p PodBlock) String() string {
	switch {
	case p.Terminating:
		return "pod " + p.Pod + " still terminating"
	case len(p.PDBs) == 1:
		return "pod " + p.Pod + " blocked by PodDisruptionBudget " + p.PDBs[0]
	case len(p.PDBs) > 1:
		return "pod " + p.Pod + " blocked by PodDisruptionBudgets " + strings.Join(p.PDBs, ", ")
	default:
		return "pod " + p.Pod + " not evicted"
	}
}

func key(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

// logWriter turns kubectl's printed lines into log lines.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	if w.log.Enabled() {
		for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
			if line != "" {
				w.log.Info(line)
			}
		}
	}
	return len(p), nil
}
