package main

import "testing"

// The coordinator's GOGC is 50 unless GOGC is set: then the runtime's
// reading of it stands.
func TestGCPercentYieldsToGOGC(t *testing.T) {
	for _, c := range []struct {
		name   string
		env    map[string]string
		want   int
		wantOK bool
	}{
		{"unset", map[string]string{}, defaultGCPercent, true},
		{"empty", map[string]string{"GOGC": ""}, defaultGCPercent, true},
		{"set", map[string]string{"GOGC": "100"}, 0, false},
		{"off", map[string]string{"GOGC": "off"}, 0, false},
		{"other variables", map[string]string{"GOMEMLIMIT": "100MiB"}, defaultGCPercent, true},
	} {
		pct, ok := gcPercent(func(k string) (string, bool) { v, set := c.env[k]; return v, set })
		if pct != c.want || ok != c.wantOK {
			t.Errorf("%s: gcPercent = %d, %v; want %d, %v", c.name, pct, ok, c.want, c.wantOK)
		}
	}
	if defaultGCPercent != 50 {
		t.Errorf("defaultGCPercent = %d, want 50 (docs/coordinator.md)", defaultGCPercent)
	}
}
