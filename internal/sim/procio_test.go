package sim

import (
	"testing"
	"time"
)

func TestBootAtClassifiesStaleReads(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	windows := []procBoot{
		{boot: "a/0"},
		{start: t0, boot: "b/0", prev: "a/0", staleUntil: t0.Add(2 * time.Second)},
		{start: t0.Add(time.Minute), boot: "c/0", prev: "b/0"},
	}
	tests := []struct {
		name string
		at   time.Time
		want string
	}{
		{"read in the first boot", t0.Add(-time.Second), "a/0"},
		{"read early in the second boot, inside its stale window", t0.Add(time.Second), "a/0"},
		{"read at the window's end is fresh", t0.Add(2 * time.Second), "b/0"},
		{"read after the window", t0.Add(30 * time.Second), "b/0"},
		{"read in a boot without a stale window", t0.Add(2 * time.Minute), "c/0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := bootAt(windows, tt.at); got != tt.want {
				t.Errorf("bootAt = %q, want %q", got, tt.want)
			}
		})
	}
}
