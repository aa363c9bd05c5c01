package v1alpha1_test

import (
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

func TestSlotsOf(t *testing.T) {
	bn := func(ann map[string]string) *fleetv1.BootcNode {
		return &fleetv1.BootcNode{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: ann}}
	}
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		want    []string
		present bool
		err     string
	}{
		{name: "absent: an older coordinator", ann: nil, want: nil},
		{name: "empty: no slot", ann: map[string]string{fleetv1.AnnotationSlots: ""}, want: []string{}, present: true},
		{name: "two, sorted", ann: map[string]string{fleetv1.AnnotationSlots: "web-stage-0,web-reboot-3"}, want: []string{"web-reboot-3", "web-stage-0"}, present: true},
		{name: "not a name", ann: map[string]string{fleetv1.AnnotationSlots: "web-stage-0,../x"}, present: true, err: `"../x" is not a Lease name`},
		{name: "empty entry", ann: map[string]string{fleetv1.AnnotationSlots: "web-stage-0,"}, present: true, err: `"" is not a Lease name`},
		{name: "twice", ann: map[string]string{fleetv1.AnnotationSlots: "a,a"}, present: true, err: `names "a" twice`},
		{name: "too many", ann: map[string]string{fleetv1.AnnotationSlots: "a,b,c,d,e"}, present: true, err: "names 5 Leases; at most 4"},
		{name: "too long", ann: map[string]string{fleetv1.AnnotationSlots: strings.Repeat("a", 254)}, present: true, err: "is not a Lease name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, present, err := fleetv1.SlotsOf(bn(tc.ann))
			if present != tc.present {
				t.Fatalf("present = %v, want %v", present, tc.present)
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || got != nil {
					t.Fatalf("SlotsOf = %v, %v; want no names and an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
				t.Fatalf("SlotsOf = %#v, %v; want %#v", got, err, tc.want)
			}
		})
	}
}

func TestSetSlotsRoundTrips(t *testing.T) {
	b := &fleetv1.BootcNode{}
	b.SetSlots([]string{"p-stage-1", "p-reboot-0"})
	if v := b.Annotations[fleetv1.AnnotationSlots]; v != "p-reboot-0,p-stage-1" {
		t.Fatalf("annotation = %q", v)
	}
	got, present, err := fleetv1.SlotsOf(b)
	if err != nil || !present || !slices.Equal(got, []string{"p-reboot-0", "p-stage-1"}) {
		t.Fatalf("SlotsOf = %v, %v, %v", got, present, err)
	}
	b.SetSlots(nil)
	if v, ok := b.Annotations[fleetv1.AnnotationSlots]; !ok || v != "" {
		t.Fatalf("no slots: annotation = %q, present %v; want present and empty", v, ok)
	}
}
