package plan

import (
	"fmt"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Per-node targets (docs/design.md, amendment 12). For a single manifest
// every node's target is the pool's. For a multi-arch index it is the image
// of the node's platform in the index: bootc peels an index and reports the
// platform image's digest, so that is the only digest staged and booted can
// ever equal. Grants, the desired image, and the verification of a reboot
// all use the node's target; the pool's status.targetImage stays the index.

// nodeTargets works out each pool member's target, or why it has none.
func (p *planner) nodeTargets() {
	if p.target.Digest == "" {
		return
	}
	for _, name := range p.members {
		n := p.nodes[name]
		switch {
		case p.in.Index != nil:
			d, prob := p.in.Index.For(n.OS, n.Arch)
			if prob != nil {
				p.noImage[name] = prob
				continue
			}
			p.targets[name] = imageref.Pinned{Repository: p.target.Repository, Digest: d}
		case p.in.IndexUnknown:
			// Whether the target is an index is not known: keep what the
			// node was told (nothing new is granted meanwhile).
			if bn := p.bns[name]; bn != nil && bn.Spec.Pool == p.pool {
				if d, err := imageref.ParsePinned(bn.Spec.DesiredImage); err == nil && d.Repository == p.target.Repository {
					p.targets[name] = d
				}
			}
		default:
			p.targets[name] = p.target
		}
	}
}

// targetOf is the image node name converges to; ok is false when it has none
// (nothing resolved, or the index has no image for its platform).
func (p *planner) targetOf(name string) (imageref.Pinned, bool) {
	t, ok := p.targets[name]
	return t, ok
}

// changedTarget says, for a grant's message, what the node's target is now.
func (p *planner) changedTarget(name string) string {
	if t, ok := p.targetOf(name); ok {
		return "the target changed to " + t.String()
	}
	if prob := p.noImage[name]; prob != nil {
		return fmt.Sprintf("the target %s has no image for the node (%s)", p.target, prob)
	}
	return "the node has no target image"
}

// maxAnnotation bounds the no-platform-image annotation.
const maxAnnotation = 1024

// noPlatformImage is the annotation value node name should carry, and the
// Events that record a change of it on its BootcNode.
func (p *planner) noPlatformImage(name string, bn *fleetv1.BootcNode) string {
	want := ""
	if prob := p.noImage[name]; prob != nil {
		want = text.Truncate(prob.String(), maxAnnotation)
	}
	had := ""
	if bn != nil {
		had = bn.Annotations[fleetv1.AnnotationNoPlatformImage]
	}
	switch {
	case want == had:
	case want != "":
		p.out.Events = append(p.out.Events, Event{Type: "Warning", Reason: p.noImage[name].Reason, BootcNode: name,
			Message: fmt.Sprintf("node %s gets no image from pool %s: %s; it gets no grants and counts as degraded until the index has exactly one image for its platform, or it leaves the pool", name, p.pool, p.noImage[name].Message)})
	case had != "":
		if t, ok := p.targetOf(name); ok {
			p.out.Events = append(p.out.Events, Event{Type: "Normal", Reason: fleetv1.EventPlatformImageFound, BootcNode: name,
				Message: fmt.Sprintf("node %s of pool %s now gets %s", name, p.pool, t)})
		}
	}
	return want
}

// platformCondition sets PlatformImages: how nodes get their image from the target.
func (p *planner) platformCondition(set func(typ string, status metav1.ConditionStatus, reason, msg string)) {
	typ := fleetv1.PoolPlatformImages
	switch {
	case p.target.Digest == "":
		set(typ, metav1.ConditionUnknown, fleetv1.ReasonResolveFailed, "the target image has not been resolved yet")
	case p.in.IndexUnknown:
		set(typ, metav1.ConditionUnknown, fleetv1.ReasonResolveFailed,
			fmt.Sprintf("whether %s is a multi-arch index is not known until spec.image resolves again; nodes keep their desiredImage", p.target))
	case p.in.Uninspected != "":
		set(typ, metav1.ConditionUnknown, fleetv1.ReasonNotInspected,
			fmt.Sprintf("spec.image names digest %s and the registry could not be asked whether it is a multi-arch index (%s): every node is given it as written. If it is an index, nodes will not converge (bootc reports the digest of its platform's image): let the coordinator reach the registry (--insecure-registry, pull credentials), or pin each pool to a platform image",
				p.target.Digest, text.Truncate(p.in.Uninspected, 300)))
	case p.in.Index == nil:
		set(typ, metav1.ConditionTrue, fleetv1.ReasonSingleManifest, fmt.Sprintf("%s is a single image manifest: every node's desiredImage is the target", p.target))
	case len(p.noImage) > 0:
		var missing []string
		for _, name := range sortedNames(p.noImage) {
			missing = append(missing, fmt.Sprintf("%s (%s)", name, p.noImage[name]))
		}
		set(typ, metav1.ConditionFalse, fleetv1.ReasonPlatformMissing,
			fmt.Sprintf("%d node(s) get no image from index %s: %s; they get no grants and count as degraded, the other nodes roll on. Add their platform to the index, or take them out of the pool",
				len(missing), p.target, joinMax(missing, 5)))
	default:
		count := map[string]int{}
		for _, t := range p.targets {
			count[t.Digest]++
		}
		var used []string
		for _, k := range p.in.Index.Platforms() {
			for _, e := range p.in.Index.Entries[k] {
				if count[e.Digest] > 0 {
					used = append(used, fmt.Sprintf("%s %s (%d node(s))", k, text.ShortDigest(e.Digest), count[e.Digest]))
				}
			}
		}
		set(typ, metav1.ConditionTrue, fleetv1.ReasonPlatformsMatched,
			fmt.Sprintf("%s is a multi-arch index: each node gets its platform's image: %s", p.target, orNothing(strings.Join(used, ", "))))
	}
}

// targetText describes the pool's target in a status message.
func (p *planner) targetText() string {
	if p.in.Index != nil {
		return p.target.String() + " (a multi-arch index: each node its platform's image)"
	}
	return p.target.String()
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func orNothing(s string) string {
	if s == "" {
		return "no node in the pool yet"
	}
	return s
}
