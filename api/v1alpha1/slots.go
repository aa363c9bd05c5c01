package v1alpha1

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// AnnotationSlots names, on a BootcNode, the slot Leases (namespace
// bootc-fleet-system) whose live grants the coordinator holds for that node:
// comma-separated, sorted, "" for none. The agent watches those Leases by
// name instead of every Lease labelled with its node: the API server's watch
// cache hands each event only to the watchers of that one object, where a
// label-selected watch is handed every Lease event of the namespace, so with
// one watch per node every slot write cost the API server work for every
// node in the cluster (docs/design.md, amendment 39). Only a hint: the agent
// acts only on a grant whose Lease names it as holder, confirmed by a
// consistent read; a missing or forged name hides a grant from this node's
// agent and nothing else, and the coordinator writes it again on its next
// pass. Absent (a coordinator that predates it): the agent watches by label.
const AnnotationSlots = "fleet.bootc.dev/slots"

// MaxSlots bounds the names AnnotationSlots may carry: a node holds at most
// a stage and a reboot grant at a time.
const MaxSlots = 4

// SlotsOf parses bn's AnnotationSlots. present is false when the annotation
// is absent; an error names the first bad entry, and then names is nil: a
// hint that does not parse is not followed in part.
func SlotsOf(bn *BootcNode) (names []string, present bool, err error) {
	v, ok := bn.Annotations[AnnotationSlots]
	if !ok {
		return nil, false, nil
	}
	if v == "" {
		return []string{}, true, nil
	}
	parts := strings.Split(v, ",")
	if len(parts) > MaxSlots {
		return nil, true, fmt.Errorf("annotation %s names %d Leases; at most %d", AnnotationSlots, len(parts), MaxSlots)
	}
	for _, p := range parts {
		if errs := validation.IsDNS1123Subdomain(p); len(errs) > 0 {
			return nil, true, fmt.Errorf("annotation %s: %q is not a Lease name: %s", AnnotationSlots, p, strings.Join(errs, "; "))
		}
		if slices.Contains(names, p) {
			return nil, true, fmt.Errorf("annotation %s names %q twice", AnnotationSlots, p)
		}
		names = append(names, p)
	}
	slices.Sort(names)
	return names, true, nil
}

// SlotsValue is the AnnotationSlots value for names (sorted copy, joined).
func SlotsValue(names []string) string {
	s := slices.Clone(names)
	slices.Sort(s)
	return strings.Join(s, ",")
}

// SetSlots writes AnnotationSlots (always present once the coordinator
// wrote a BootcNode, "" for no slot, so the agent knows to follow it).
func (bn *BootcNode) SetSlots(names []string) {
	if bn.Annotations == nil {
		bn.Annotations = map[string]string{}
	}
	bn.Annotations[AnnotationSlots] = SlotsValue(names)
}
