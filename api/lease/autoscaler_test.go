package lease

import (
	"errors"
	"maps"
	"strings"
	"testing"
)

const (
	ca  = NodeAnnotationScaleDownDisabled
	kp  = NodeAnnotationDoNotDisrupt
	rec = NodeAnnotationAutoscalerMarks
)

// patched is annotations after a JSON merge patch of them.
func patched(annotations map[string]string, patch map[string]*string) map[string]string {
	out := maps.Clone(annotations)
	if out == nil {
		out = map[string]string{}
	}
	for k, v := range patch {
		if v == nil {
			delete(out, k)
		} else {
			out[k] = *v
		}
	}
	return out
}

func TestAutoscalerMarksHoldAndRelease(t *testing.T) {
	const slot = "pool-reboot-0"
	for _, tc := range []struct {
		name   string
		before map[string]string
		// held is the Node while held; nil: as before (no change).
		held map[string]string
		// released is the Node after release, starting from held with the
		// edit applied.
		edit     map[string]*string
		released map[string]string
	}{
		{
			name:     "no marks before: both set while held, both removed after",
			before:   map[string]string{"other": "x"},
			held:     map[string]string{"other": "x", ca: "true", kp: "true", rec: `{"slot":"pool-reboot-0","was":{"cluster-autoscaler.kubernetes.io/scale-down-disabled":null,"karpenter.sh/do-not-disrupt":null}}`},
			released: map[string]string{"other": "x"},
		},
		{
			name:     "no annotations at all",
			before:   nil,
			held:     map[string]string{ca: "true", kp: "true", rec: `{"slot":"pool-reboot-0","was":{"cluster-autoscaler.kubernetes.io/scale-down-disabled":null,"karpenter.sh/do-not-disrupt":null}}`},
			released: map[string]string{},
		},
		{
			name:     "an administrator's do-not-disrupt=true is neither set nor removed",
			before:   map[string]string{kp: "true"},
			held:     map[string]string{ca: "true", kp: "true", rec: `{"slot":"pool-reboot-0","was":{"cluster-autoscaler.kubernetes.io/scale-down-disabled":null}}`},
			released: map[string]string{kp: "true"},
		},
		{
			name:     "an administrator's do-not-disrupt=false is overruled while held and restored after",
			before:   map[string]string{kp: "false"},
			held:     map[string]string{ca: "true", kp: "true", rec: `{"slot":"pool-reboot-0","was":{"cluster-autoscaler.kubernetes.io/scale-down-disabled":null,"karpenter.sh/do-not-disrupt":"false"}}`},
			released: map[string]string{kp: "false"},
		},
		{
			name:     "an administrator's scale-down-disabled=false and empty do-not-disrupt are restored",
			before:   map[string]string{ca: "false", kp: ""},
			held:     map[string]string{ca: "true", kp: "true", rec: `{"slot":"pool-reboot-0","was":{"cluster-autoscaler.kubernetes.io/scale-down-disabled":"false","karpenter.sh/do-not-disrupt":""}}`},
			released: map[string]string{ca: "false", kp: ""},
		},
		{
			name:   "both already true: nothing written, nothing to restore",
			before: map[string]string{ca: "true", kp: "true"},
			held:   nil, released: map[string]string{ca: "true", kp: "true"},
		},
		{
			name:     "a mark an administrator changed during the hold keeps the administrator's value",
			before:   map[string]string{},
			held:     map[string]string{ca: "true", kp: "true", rec: `{"slot":"pool-reboot-0","was":{"cluster-autoscaler.kubernetes.io/scale-down-disabled":null,"karpenter.sh/do-not-disrupt":null}}`},
			edit:     map[string]*string{kp: ptrTo("false")},
			released: map[string]string{kp: "false"},
		},
		{
			name:     "a mark an administrator removed during the hold stays removed",
			before:   map[string]string{ca: "false"},
			held:     map[string]string{ca: "true", kp: "true", rec: `{"slot":"pool-reboot-0","was":{"cluster-autoscaler.kubernetes.io/scale-down-disabled":"false","karpenter.sh/do-not-disrupt":null}}`},
			edit:     map[string]*string{ca: nil},
			released: map[string]string{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			patch, err := HoldFromAutoscalers(tc.before, slot)
			if err != nil {
				t.Fatal(err)
			}
			held := patched(tc.before, patch)
			want := tc.held
			if want == nil {
				if len(patch) != 0 {
					t.Fatalf("hold wrote %v, want nothing", patch)
				}
				want = patched(tc.before, nil)
			}
			if !maps.Equal(held, want) {
				t.Fatalf("held:\n got  %v\n want %v", held, want)
			}
			// Holding again, as every pass does, changes nothing.
			if again, err := HoldFromAutoscalers(held, slot); err != nil || len(again) != 0 {
				t.Fatalf("holding again: %v, %v; want no change", again, err)
			}
			// Even after an administrator changed a mark: not overruled.
			held = patched(held, tc.edit)
			if again, err := HoldFromAutoscalers(held, slot); err != nil || len(again) != 0 {
				t.Fatalf("holding again after the edit: %v, %v; want no change", again, err)
			}
			rp, err := ReleaseFromAutoscalers(held)
			if err != nil {
				t.Fatal(err)
			}
			if got := patched(held, rp); !maps.Equal(got, tc.released) {
				t.Fatalf("released:\n got  %v\n want %v", got, tc.released)
			}
			if again, err := ReleaseFromAutoscalers(tc.released); err != nil || len(again) != 0 {
				t.Fatalf("releasing again: %v, %v; want no change", again, err)
			}
		})
	}
}

func TestAutoscalerRecordOfAnotherSlotIsTakenOver(t *testing.T) {
	before := map[string]string{ca: "true", kp: "true", rec: `{"slot":"old-reboot-2","was":{"karpenter.sh/do-not-disrupt":"false"}}`}
	patch, err := HoldFromAutoscalers(before, "new-reboot-0")
	if err != nil {
		t.Fatal(err)
	}
	held := patched(before, patch)
	want := map[string]string{ca: "true", kp: "true", rec: `{"slot":"new-reboot-0","was":{"karpenter.sh/do-not-disrupt":"false"}}`}
	if !maps.Equal(held, want) {
		t.Fatalf("got %v, want %v", held, want)
	}
	r, err := ParseAutoscalerRecord(held[rec])
	if err != nil || r.Pool() != "new" {
		t.Fatalf("record %v (%v): pool %q, want new", r, err, r.Pool())
	}
}

func TestUnusableAutoscalerRecordChangesNothing(t *testing.T) {
	long := strings.Repeat("x", MaxAutoscalerMarkValue+1)
	for _, tc := range []struct {
		name string
		ann  map[string]string
	}{
		{"not JSON", map[string]string{rec: "yes"}},
		{"unknown field", map[string]string{rec: `{"slot":"p-reboot-0","was":{},"extra":1}`}},
		{"two values", map[string]string{rec: `{"slot":"p-reboot-0","was":{}} {}`}},
		{"a stage slot", map[string]string{rec: `{"slot":"p-stage-0","was":{}}`}},
		{"not a slot", map[string]string{rec: `{"slot":"nothing","was":{}}`}},
		{"an annotation that is not a mark", map[string]string{rec: `{"slot":"p-reboot-0","was":{"node.kubernetes.io/exclude-from-external-load-balancers":null}}`}},
		{"a recorded value too long", map[string]string{rec: `{"slot":"p-reboot-0","was":{"karpenter.sh/do-not-disrupt":"` + long + `"}}`}},
		{"a record too long", map[string]string{rec: `{"slot":"p-reboot-0","was":{}}` + strings.Repeat(" ", 1024)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if p, err := HoldFromAutoscalers(tc.ann, "p-reboot-0"); !errors.Is(err, ErrAutoscalerRecord) || p != nil {
				t.Errorf("hold: %v, %v; want ErrAutoscalerRecord and no change", p, err)
			}
			if p, err := ReleaseFromAutoscalers(tc.ann); !errors.Is(err, ErrAutoscalerRecord) || p != nil {
				t.Errorf("release: %v, %v; want ErrAutoscalerRecord and no change", p, err)
			}
		})
	}
	t.Run("an administrator's value too long to record", func(t *testing.T) {
		if p, err := HoldFromAutoscalers(map[string]string{kp: long}, "p-reboot-0"); !errors.Is(err, ErrAutoscalerRecord) || p != nil {
			t.Errorf("hold: %v, %v; want ErrAutoscalerRecord and no change", p, err)
		}
	})
	t.Run("a slot that is not a reboot slot", func(t *testing.T) {
		if p, err := HoldFromAutoscalers(nil, "p-stage-0"); !errors.Is(err, ErrAutoscalerRecord) || p != nil {
			t.Errorf("hold: %v, %v; want ErrAutoscalerRecord and no change", p, err)
		}
	})
}

func FuzzAutoscalerRecord(f *testing.F) {
	f.Add(`{"slot":"p-reboot-0","was":{"karpenter.sh/do-not-disrupt":"false"}}`, "true")
	f.Add(`{"slot":"p-reboot-1","was":{}}`, "")
	f.Fuzz(func(t *testing.T, s, mark string) {
		r, err := ParseAutoscalerRecord(s)
		if err != nil {
			return
		}
		back, err := ParseAutoscalerRecord(r.String())
		if err != nil || back.String() != r.String() {
			t.Fatalf("%q read back as %v (%v), want %v", s, back, err, r)
		}
		ann := map[string]string{rec: s, kp: mark}
		if _, err := ReleaseFromAutoscalers(ann); err != nil {
			t.Fatalf("release of a readable record: %v", err)
		}
	})
}
