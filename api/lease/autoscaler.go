package lease

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Autoscaler marks (amendment 28): while a node holds a reboot slot the
// coordinator asks cluster-autoscaler and Karpenter to leave the Node alone,
// and records on the Node which of the marks it set and what they were.
const (
	// NodeAnnotationScaleDownDisabled: cluster-autoscaler does not scale
	// down a Node carrying it with the value "true".
	NodeAnnotationScaleDownDisabled = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
	// NodeAnnotationDoNotDisrupt: Karpenter neither consolidates nor
	// expires (voluntarily disrupts) a Node carrying it with "true".
	NodeAnnotationDoNotDisrupt = "karpenter.sh/do-not-disrupt"
	// NodeAnnotationAutoscalerMarks is the coordinator's record of the marks
	// it set, written in the same Node update as the marks themselves:
	// {"slot":"<reboot slot Lease>","was":{"<mark>":<value before, or null
	// when absent>}}. Only the marks it changed are listed.
	NodeAnnotationAutoscalerMarks = "fleet.bootc.dev/autoscaler-marks"

	// AutoscalerMarkValue is the value the coordinator sets.
	AutoscalerMarkValue = "true"
	// MaxAutoscalerMarkValue bounds a mark's value the coordinator records
	// (and so restores): the two autoscalers read only "true".
	MaxAutoscalerMarkValue = 256
	// maxAutoscalerRecord bounds the record: a slot name and two values.
	maxAutoscalerRecord = 1024
)

// AutoscalerMarks are the Node annotations set while a node holds a reboot
// slot, in the order they are written.
var AutoscalerMarks = []string{NodeAnnotationScaleDownDisabled, NodeAnnotationDoNotDisrupt}

// ErrAutoscalerRecord is a NodeAnnotationAutoscalerMarks value (or a mark to
// record) the coordinator cannot read or keep; it then changes no mark.
var ErrAutoscalerRecord = errors.New("unusable autoscaler-marks record")

// AutoscalerRecord is a decoded NodeAnnotationAutoscalerMarks value.
type AutoscalerRecord struct {
	// Slot is the reboot slot Lease the marks were set for (its name
	// carries the pool's).
	Slot string `json:"slot"`
	// Was holds, for every mark the coordinator set, the value the Node
	// carried before (nil: none).
	Was map[string]*string `json:"was"`
}

// Pool is the pool of the record's slot.
func (r AutoscalerRecord) Pool() string {
	pool, _, _, _ := ParseSlotName(r.Slot)
	return pool
}

// ParseAutoscalerRecord reads a NodeAnnotationAutoscalerMarks value: a
// reboot slot's name and, for known marks only, values of at most
// MaxAutoscalerMarkValue bytes; anything else is ErrAutoscalerRecord.
func ParseAutoscalerRecord(s string) (AutoscalerRecord, error) {
	var r AutoscalerRecord
	if len(s) > maxAutoscalerRecord {
		return r, fmt.Errorf("%w: %s is %d bytes, more than %d", ErrAutoscalerRecord, NodeAnnotationAutoscalerMarks, len(s), maxAutoscalerRecord)
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return AutoscalerRecord{}, fmt.Errorf("%w: %s=%q: %w", ErrAutoscalerRecord, NodeAnnotationAutoscalerMarks, s, err)
	}
	if dec.More() {
		return AutoscalerRecord{}, fmt.Errorf("%w: %s=%q: more than one JSON value", ErrAutoscalerRecord, NodeAnnotationAutoscalerMarks, s)
	}
	if _, kind, _, err := ParseSlotName(r.Slot); err != nil || kind != KindReboot {
		return AutoscalerRecord{}, fmt.Errorf("%w: %s=%q: slot %q is not a reboot slot", ErrAutoscalerRecord, NodeAnnotationAutoscalerMarks, s, r.Slot)
	}
	for k, v := range r.Was {
		if !slices.Contains(AutoscalerMarks, k) {
			return AutoscalerRecord{}, fmt.Errorf("%w: %s=%q: %q is not an autoscaler mark", ErrAutoscalerRecord, NodeAnnotationAutoscalerMarks, s, k)
		}
		if v != nil && len(*v) > MaxAutoscalerMarkValue {
			return AutoscalerRecord{}, fmt.Errorf("%w: %s: the value of %s is longer than %d bytes", ErrAutoscalerRecord, NodeAnnotationAutoscalerMarks, k, MaxAutoscalerMarkValue)
		}
	}
	return r, nil
}

// String is the record's annotation value (keys sorted: a record written
// twice is the same string).
func (r AutoscalerRecord) String() string {
	if r.Was == nil {
		r.Was = map[string]*string{}
	}
	b, _ := json.Marshal(r) // strings and a map of strings: cannot fail
	return string(b)
}

// HoldFromAutoscalers is the change (a JSON merge patch of the Node's
// annotations: a value sets, nil removes) that marks a Node whose node holds
// reboot slot slot: each mark not already "true" is set to "true" and its
// value before (nil: none) recorded. A Node that carries a record already
// keeps its marks as they are (an administrator who removed one during the
// hold is not overruled); only a record for a slot of another name is
// rewritten to name this one. An empty change means nothing to write. A
// record or a mark the coordinator cannot keep is an error, and no change.
func HoldFromAutoscalers(annotations map[string]string, slot string) (map[string]*string, error) {
	if s, ok := annotations[NodeAnnotationAutoscalerMarks]; ok {
		r, err := ParseAutoscalerRecord(s)
		if err != nil {
			return nil, err
		}
		if r.Slot == slot {
			return nil, nil
		}
		r.Slot = slot
		v := r.String()
		return map[string]*string{NodeAnnotationAutoscalerMarks: &v}, nil
	}
	r := AutoscalerRecord{Slot: slot, Was: map[string]*string{}}
	patch := map[string]*string{}
	for _, k := range AutoscalerMarks {
		old, ok := annotations[k]
		if ok && old == AutoscalerMarkValue {
			continue // the administrator's own "true": nothing to set, nothing to restore
		}
		if len(old) > MaxAutoscalerMarkValue {
			return nil, fmt.Errorf("%w: the value of %s is longer than %d bytes, so it could not be restored", ErrAutoscalerRecord, k, MaxAutoscalerMarkValue)
		}
		r.Was[k] = nil
		if ok {
			r.Was[k] = &old
		}
		patch[k] = ptrTo(AutoscalerMarkValue)
	}
	if len(patch) == 0 {
		return nil, nil
	}
	if _, kind, _, err := ParseSlotName(slot); err != nil || kind != KindReboot {
		return nil, fmt.Errorf("%w: %q is not a reboot slot", ErrAutoscalerRecord, slot)
	}
	patch[NodeAnnotationAutoscalerMarks] = ptrTo(r.String())
	return patch, nil
}

// ReleaseFromAutoscalers is the change that undoes HoldFromAutoscalers: each
// mark the record lists that still says "true" gets its value before back
// (or is removed when it had none); a mark someone changed since is left as
// it is; the record is removed. No record: no change. An unreadable record
// is an error, and no change.
func ReleaseFromAutoscalers(annotations map[string]string) (map[string]*string, error) {
	s, ok := annotations[NodeAnnotationAutoscalerMarks]
	if !ok {
		return nil, nil
	}
	r, err := ParseAutoscalerRecord(s)
	if err != nil {
		return nil, err
	}
	patch := map[string]*string{NodeAnnotationAutoscalerMarks: nil}
	for _, k := range slices.Sorted(maps.Keys(r.Was)) {
		if cur, ok := annotations[k]; ok && cur == AutoscalerMarkValue {
			patch[k] = r.Was[k]
		}
	}
	return patch, nil
}

func ptrTo(s string) *string { return &s }
