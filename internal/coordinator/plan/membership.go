package plan

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeletapis "k8s.io/kubelet/pkg/apis"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// SelfSettableLabel reports whether a kubelet may set label key on its own
// Node under the NodeRestriction admission plugin (kubernetes
// plugin/pkg/admission/noderestriction/admission.go, getForbiddenLabels):
// everything except keys in the node-restriction.kubernetes.io namespace and
// kubernetes.io / k8s.io keys that are not kubelet labels
// (k8s.io/kubelet/pkg/apis, IsKubeletLabel: kubernetes.io/hostname,
// kubernetes.io/arch, node.kubernetes.io/*, ...). A kubelet's own labels are
// self-settable: it can write any value into them.
func SelfSettableLabel(key string) bool {
	ns, _, found := strings.Cut(key, "/")
	if !found {
		return true // no prefix: anyone with write access to the Node, the kubelet included
	}
	if inNamespace(ns, corev1.LabelNamespaceNodeRestriction) {
		return false
	}
	if inNamespace(ns, "kubernetes.io") || inNamespace(ns, "k8s.io") {
		return kubeletapis.IsKubeletLabel(key)
	}
	return true
}

func inNamespace(ns, domain string) bool { return ns == domain || strings.HasSuffix(ns, "."+domain) }

// selfSettableKeys lists the selector's keys a node can set on itself.
func selfSettableKeys(sel metav1.LabelSelector) []string {
	seen := map[string]bool{}
	for k := range sel.MatchLabels {
		seen[k] = true
	}
	for _, e := range sel.MatchExpressions {
		seen[e.Key] = true
	}
	var out []string
	for k := range seen {
		if SelfSettableLabel(k) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// membershipCondition sets NodeSelectorRestricted: whether a node could put
// itself into the pool, or take itself out, by relabelling its own Node. It
// warns and changes nothing else: the selector is the operator's choice.
func (p *planner) membershipCondition(prev []metav1.Condition, set func(typ string, status metav1.ConditionStatus, reason, msg string)) {
	keys := selfSettableKeys(p.in.Pool.Spec.NodeSelector)
	if len(keys) == 0 {
		set(fleetv1.PoolNodeSelectorRestricted, metav1.ConditionTrue, fleetv1.ReasonRestrictedLabels,
			"spec.nodeSelector uses only labels a kubelet cannot set on its own Node")
		return
	}
	quoted := make([]string, len(keys))
	for i, k := range keys {
		quoted[i] = fmt.Sprintf("%q", k)
	}
	msg := fmt.Sprintf("spec.nodeSelector keys on %s, which a node's kubelet may set on its own Node: a node could join or leave this pool by relabelling itself. Select on labels under %s/ (set by an administrator; kubelets may not) instead",
		joinMax(quoted, 5), corev1.LabelNamespaceNodeRestriction)
	set(fleetv1.PoolNodeSelectorRestricted, metav1.ConditionFalse, fleetv1.ReasonSelfSettableLabels, msg)
	if old := meta.FindStatusCondition(prev, fleetv1.PoolNodeSelectorRestricted); old == nil || old.Status != metav1.ConditionFalse || old.Message != msg {
		p.event("Warning", fleetv1.ReasonSelfSettableLabels, "%s", msg)
	}
}
