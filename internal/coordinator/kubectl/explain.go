package kubectl

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// MaxEvents is how many of the newest Events explain shows.
const MaxEvents = 10

// Explanation is `explain NODE -o json|yaml`.
type Explanation struct {
	Time metav1.Time `json:"time"` // when it was read
	Node string      `json:"node"`
	Pool string      `json:"pool"`
	// TargetImage is the pool's resolved target; DesiredImage what the
	// coordinator asks of this node (its platform's image of an index).
	TargetImage  string      `json:"targetImage,omitempty"`
	DesiredImage string      `json:"desiredImage,omitempty"`
	Booted       *Deployment `json:"booted,omitempty"`
	Staged       *Deployment `json:"staged,omitempty"`
	Agent        Agent       `json:"agent"`
	NodeObject   NodeObject  `json:"nodeObject"`
	// Rollout is the coordinator's view with the live part (as in status POOL).
	Rollout NodeReport `json:"rollout"`
	// BlockingPDBs (only when the rollout reason names a
	// PodDisruptionBudget): those allowing no disruption now that select a
	// pod on the node.
	BlockingPDBs []PDB `json:"blockingPDBs,omitempty"`
	// Events about the BootcNode and the Node, oldest first, at most MaxEvents.
	Events []Event `json:"events,omitempty"`
}

// Deployment is a bootc deployment as the agent reported it.
type Deployment struct {
	Image        string `json:"image,omitempty"`
	Digest       string `json:"digest,omitempty"`
	Version      string `json:"version,omitempty"`
	Signature    string `json:"signature,omitempty"`
	DownloadOnly bool   `json:"downloadOnly,omitempty"`
}

// Agent is what the node's agent reports.
type Agent struct {
	Phase      string       `json:"phase,omitempty"`
	Reason     string       `json:"reason,omitempty"`
	Message    string       `json:"message,omitempty"`
	Version    string       `json:"version,omitempty"`
	LastReport *metav1.Time `json:"lastReport,omitempty"`
}

// NodeObject is the Node as the API server has it.
type NodeObject struct {
	Exists   bool `json:"exists"`
	Ready    bool `json:"ready"`
	Cordoned bool `json:"cordoned"`
}

// PDB is a PodDisruptionBudget that blocks the node's drain.
type PDB struct {
	Name               string   `json:"name"` // namespace/name
	DisruptionsAllowed int32    `json:"disruptionsAllowed"`
	Pods               []string `json:"pods"` // namespace/name of the node's pods it selects
}

// Event is one Event about the node or its BootcNode.
type Event struct {
	Time   metav1.Time `json:"time"`
	Type   string      `json:"type"`
	Reason string      `json:"reason"`
	// Object is Kind/name, or both, comma-separated, for an Event
	// recorded on the BootcNode and the Node alike.
	Object  string `json:"object"`
	Message string `json:"message"`
	Count   int32  `json:"count,omitempty"`
}

func (r *reader) explain(ctx context.Context, name string) (*Explanation, error) {
	node := &corev1.Node{}
	nodeErr := r.c.Get(ctx, client.ObjectKey{Name: name}, node)
	if nodeErr != nil && !isNotFound(nodeErr) {
		return nil, apiError(nodeErr, "get", "nodes")
	}
	bn := &fleetv1.BootcNode{}
	if err := r.c.Get(ctx, client.ObjectKey{Name: name}, bn); err != nil {
		switch {
		case !isNotFound(err):
			return nil, apiError(err, "get", "bootcnodes.fleet.bootc.dev")
		case nodeErr != nil:
			return nil, fmt.Errorf("node %q not found", name)
		}
		return nil, fmt.Errorf("node %q is not a bootc-fleet node: it has no BootcNode (no BootcNodePool's nodeSelector matches its labels)", name)
	}
	ex := &Explanation{Time: metav1.Time{Time: r.now}, Node: name, Pool: bn.Spec.Pool, DesiredImage: bn.Spec.DesiredImage,
		Booted: deployment(bn.Status.Booted), Staged: deployment(bn.Status.Staged),
		Agent: Agent{Phase: string(bn.Status.Phase), Reason: bn.Status.Reason, Message: bn.Status.Message, Version: bn.Status.AgentVersion}}
	if t := bn.Status.LastReportTime; t != nil {
		ex.Agent.LastReport = &metav1.Time{Time: t.UTC()}
	}
	p, err := r.pool(ctx, bn.Spec.Pool)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	ex.TargetImage = p.Status.TargetImage
	v := r.newView(p)
	if err := r.withNodes(ctx, v); err != nil {
		return nil, err
	}
	// The slots last: never older than the notes on the BootcNodes.
	leases, err := r.slotLeases(ctx)
	if err != nil {
		return nil, err
	}
	v.setSlots(leases[p.Name])
	v.bns[name] = bn // even if it names another pool by now
	if n := v.nodes[name]; n != nil {
		ex.NodeObject = NodeObject{Exists: true, Ready: v.ready(name), Cordoned: n.Spec.Unschedulable}
	}
	ex.Rollout = v.nodeReport(name)
	if strings.Contains(ex.Rollout.CoordinatorReason, "PodDisruptionBudget") {
		if ex.BlockingPDBs, err = r.blockingPDBs(ctx, name); err != nil {
			return nil, err
		}
	}
	if ex.Events, err = r.events(ctx, name); err != nil {
		return nil, err
	}
	return ex, nil
}

func deployment(d *fleetv1.Deployment) *Deployment {
	if d == nil {
		return nil
	}
	return &Deployment{Image: d.Image, Digest: d.Digest, Version: d.Version, Signature: string(d.Signature), DownloadOnly: d.DownloadOnly}
}

// blockingPDBs finds the PodDisruptionBudgets that allow no disruption and
// select a pod on node, matched as the Eviction API matches them.
func (r *reader) blockingPDBs(ctx context.Context, node string) ([]PDB, error) {
	var pods corev1.PodList
	if err := r.c.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node}); err != nil {
		return nil, apiError(err, "list", "pods")
	}
	byNS := map[string][]corev1.Pod{}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			byNS[p.Namespace] = append(byNS[p.Namespace], p)
		}
	}
	var out []PDB
	for ns, ps := range byNS {
		var pdbs policyv1.PodDisruptionBudgetList
		if err := r.c.List(ctx, &pdbs, client.InNamespace(ns)); err != nil {
			return nil, apiError(err, "list", "poddisruptionbudgets.policy in namespace "+ns)
		}
		for _, b := range pdbs.Items {
			sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
			if err != nil || b.Status.DisruptionsAllowed > 0 {
				continue
			}
			pdb := PDB{Name: b.Namespace + "/" + b.Name, DisruptionsAllowed: b.Status.DisruptionsAllowed}
			for _, p := range ps {
				if sel.Matches(labels.Set(p.Labels)) {
					pdb.Pods = append(pdb.Pods, p.Namespace+"/"+p.Name)
				}
			}
			if len(pdb.Pods) > 0 {
				sort.Strings(pdb.Pods)
				out = append(out, pdb)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// events lists the Events regarding the Node or the BootcNode named node,
// in any namespace (Events about cluster-scoped objects land in default).
// events.k8s.io/v1 serves the core/v1 Events too: one list has both the
// coordinator's and the kubelet's.
func (r *reader) events(ctx context.Context, node string) ([]Event, error) {
	var l eventsv1.EventList
	if err := r.c.List(ctx, &l, client.MatchingFields{"regarding.name": node}); err != nil {
		return nil, apiError(err, "list", "events.events.k8s.io")
	}
	var out []Event
	for _, e := range l.Items {
		kind := e.Regarding.Kind
		if kind != "Node" && kind != "BootcNode" {
			continue
		}
		ev := Event{Time: metav1.Time{Time: eventTime(e).UTC()}, Type: e.Type, Reason: e.Reason, Object: kind + "/" + e.Regarding.Name, Message: e.Note}
		if e.Series != nil {
			ev.Count = e.Series.Count
		} else if e.DeprecatedCount > 1 {
			ev.Count = e.DeprecatedCount
		}
		out = append(out, ev)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Time.Equal(&out[j].Time) {
			return out[i].Time.Before(&out[j].Time)
		}
		return out[i].Object+out[i].Reason+out[i].Message < out[j].Object+out[j].Reason+out[j].Message
	})
	out = mergeTwins(out)
	if len(out) > MaxEvents {
		out = out[len(out)-MaxEvents:]
	}
	return out, nil
}

// mergeTwins shows once an Event recorded on both the BootcNode and the
// Node (the coordinator records most of a node's Events on both, so
// `kubectl describe node` has them too): same type, reason and message, at most a
// second apart.
func mergeTwins(evs []Event) []Event {
	var out []Event
	for _, e := range evs {
		twin := false
		for i := len(out) - 1; i >= 0 && e.Time.Sub(out[i].Time.Time) <= time.Second; i-- {
			o := &out[i]
			if o.Type == e.Type && o.Reason == e.Reason && o.Message == e.Message && !slices.Contains(strings.Split(o.Object, ","), e.Object) {
				o.Object += "," + e.Object
				twin = true
				break
			}
		}
		if !twin {
			out = append(out, e)
		}
	}
	return out
}

// eventTime is when an Event last happened.
func eventTime(e eventsv1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.DeprecatedLastTimestamp.IsZero():
		return e.DeprecatedLastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

func writeExplanation(w io.Writer, ex *Explanation) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	kv := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	kv("Node", ex.Node)
	kv("Pool", ex.Pool)
	kv("Target", orNone(ex.TargetImage))
	kv("Desired", orNone(ex.DesiredImage))
	kv("Booted", deploymentText(ex.Booted))
	kv("Staged", deploymentText(ex.Staged))
	agent := orNone(ex.Agent.Phase)
	if ex.Agent.Reason != "" {
		agent += " (" + ex.Agent.Reason + ")"
	}
	if ex.Agent.Message != "" {
		agent += ": " + ex.Agent.Message
	}
	kv("Agent", agent)
	if ex.Agent.LastReport != nil {
		kv("Last report", fmt.Sprintf("%s (%s ago), agent %s", ex.Agent.LastReport.Format(time.RFC3339), age(ex.Time.Sub(ex.Agent.LastReport.Time)), orNone(ex.Agent.Version)))
	}
	switch n := ex.NodeObject; {
	case !n.Exists:
		kv("Node object", "deleted")
	default:
		kv("Node object", yesNo(n.Ready, "Ready", "NotReady")+", "+yesNo(n.Cordoned, "cordoned", "schedulable"))
	}
	ro := ex.Rollout
	kv("Rollout", orNone(ro.State))
	kv("Why", orNone(ro.Reason))
	switch {
	case ro.CoordinatorState != "":
		kv("Coordinator", ro.CoordinatorState+": "+ro.CoordinatorReason)
	case ro.CoordinatorReason != ro.Reason:
		kv("Coordinator", ro.CoordinatorReason)
	}
	if len(ro.Slots) == 0 {
		kv("Slot", "none")
	}
	for _, s := range ro.Slots {
		text := fmt.Sprintf("%s (%s slot), %s", s.Slot, s.Kind, strings.ToLower(s.Phase))
		if s.Since != nil {
			text += fmt.Sprintf(" since %s (%s)", s.Since.Format(time.RFC3339), s.For)
		}
		kv("Slot", text)
	}
	if q := ro.Queue; q != nil {
		kv("Queue", fmt.Sprintf("%d of %d waiting for a %s slot", q.Position, q.Of, q.Kind))
	} else {
		kv("Queue", "not queued")
	}
	switch {
	case ro.Hold == nil:
		kv("Hold", "none")
	case *ro.Hold == "":
		kv("Hold", "held ("+fleetv1.AnnotationHold+", no reason given)")
	default:
		kv("Hold", fmt.Sprintf("held (%s): %s", fleetv1.AnnotationHold, *ro.Hold))
	}
	for _, p := range ex.BlockingPDBs {
		kv("Blocking PDB", fmt.Sprintf("%s: %d disruptions allowed; selects %s", p.Name, p.DisruptionsAllowed, strings.Join(p.Pods, ", ")))
	}
	_ = tw.Flush()
	writeEvents(w, ex)
}

// writeEvents is the Events table of explain.
func writeEvents(w io.Writer, ex *Explanation) {
	if len(ex.Events) == 0 {
		fmt.Fprintln(w, "Events: <none>")
		return
	}
	fmt.Fprintln(w, "Events:")
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "  TYPE\tREASON\tAGE\tOBJECT\tMESSAGE")
	for _, e := range ex.Events {
		a := age(ex.Time.Sub(e.Time.Time))
		if e.Count > 1 {
			a += fmt.Sprintf(" (x%d)", e.Count)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", e.Type, e.Reason, a, e.Object, e.Message)
	}
	_ = tw.Flush()
}

func deploymentText(d *Deployment) string {
	if d == nil {
		return "<none>"
	}
	parts := []string{orNone(d.Image)}
	if d.Digest != "" {
		parts[0] += " (" + shortDigest("@"+d.Digest) + ")"
	}
	if d.Version != "" {
		parts = append(parts, "version "+d.Version)
	}
	parts = append(parts, "signature "+orNone(d.Signature))
	if d.DownloadOnly {
		parts = append(parts, "download-only")
	}
	return strings.Join(parts, ", ")
}

func yesNo(b bool, yes, no string) string {
	if b {
		return yes
	}
	return no
}

func isNotFound(err error) bool { return kerrors.IsNotFound(err) }
