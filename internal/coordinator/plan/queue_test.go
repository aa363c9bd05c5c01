package plan

import (
	"slices"
	"strings"
	"testing"
)

func nameSet(names string) func(string) bool {
	m := map[string]bool{}
	for _, n := range strings.Fields(names) {
		m[n] = true
	}
	return func(n string) bool { return m[n] }
}

func TestStageOrder(t *testing.T) {
	tests := []struct {
		name, in, failed, want string
	}{
		{"by name", "c a b", "", "a b c"},
		{"failed last, in name order", "a b c d", "c a", "b d a c"},
		{"all failed", "b a", "a b", "a b"},
		{"empty", "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := strings.Fields(tt.in)
			keep := append([]string(nil), in...)
			got := StageOrder(in, nameSet(tt.failed))
			if want := strings.Fields(tt.want); !slices.Equal(got, want) {
				t.Errorf("StageOrder(%q, failed %q) = %q, want %q", tt.in, tt.failed, got, want)
			}
			if !slices.Equal(in, keep) {
				t.Errorf("StageOrder changed its input to %q", in)
			}
		})
	}
}

func TestRebootOrder(t *testing.T) {
	tests := []struct {
		name, in, unavailable, want string
	}{
		{"by name", "node-c node-a node-b", "", "node-a node-b node-c"},
		{"unavailable first, in name order", "a b c d", "d b", "b d a c"},
		{"all unavailable", "b a", "a b", "a b"},
		{"empty", "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := strings.Fields(tt.in)
			keep := append([]string(nil), in...)
			got := RebootOrder(in, nameSet(tt.unavailable))
			if want := strings.Fields(tt.want); !slices.Equal(got, want) {
				t.Errorf("RebootOrder(%q, unavailable %q) = %q, want %q", tt.in, tt.unavailable, got, want)
			}
			if !slices.Equal(in, keep) {
				t.Errorf("RebootOrder changed its input to %q", in)
			}
		})
	}
}
