package fleet

import (
	"slices"
	"testing"
)

func TestParseSeeds(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want []int64
	}{
		{"3", []int64{1, 2, 3}},
		{"17", nil}, // checked by length below
		{"5,9", []int64{5, 9}},
		{"40-42", []int64{40, 41, 42}},
		{"7, 40-41 ,3", []int64{7, 40, 41, 3}},
	} {
		got, err := parseSeeds(tc.spec)
		if err != nil {
			t.Errorf("%q: %v", tc.spec, err)
			continue
		}
		if tc.want == nil {
			if len(got) != 17 || got[0] != 1 || got[16] != 17 {
				t.Errorf("%q: got %v, want 1..17", tc.spec, got)
			}
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: got %v, want %v", tc.spec, got, tc.want)
		}
	}
	for _, bad := range []string{"0", "-3", "70-", "a", "9-3", "1,,2", "1;2"} {
		if got, err := parseSeeds(bad); err == nil {
			t.Errorf("%q: accepted as %v, want an error", bad, got)
		}
	}
}
