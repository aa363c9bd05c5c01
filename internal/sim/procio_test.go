package sim

import (
	"strings"
	"testing"
	"time"
)

func TestParseLogfmt(t *testing.T) {
	tests := []struct {
		name string
		line string
		want map[string]string
	}{
		{
			name: "grant confirmed line from the agent",
			line: `time=2026-11-29T21:16:13.123Z level=INFO msg="grant confirmed" step=stage lease=pool-stage-0 resourceVersion=812 grant=pool-stage-0/uid#3 image=127.0.0.1:4000/os@sha256:ab bootID=1-2`,
			want: map[string]string{"time": "2026-11-29T21:16:13.123Z", "level": "INFO", "msg": "grant confirmed", "step": "stage",
				"lease": "pool-stage-0", "resourceVersion": "812", "grant": "pool-stage-0/uid#3", "image": "127.0.0.1:4000/os@sha256:ab", "bootID": "1-2"},
		},
		{
			name: "quoted value with escaped quote and spaces",
			line: `msg="stage failed" err="bootc switch: \"boom\" now" retryIn=1s`,
			want: map[string]string{"msg": "stage failed", "err": `bootc switch: "boom" now`, "retryIn": "1s"},
		},
		{
			name: "malformed pairs are skipped",
			line: `junk msg="ok" =x bad="unterminated`,
			want: map[string]string{"msg": "ok"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := parseLogfmt(tt.line)
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

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

func TestLineWriterSplitsAcrossWrites(t *testing.T) {
	var lines []string
	var out strings.Builder
	w := &lineWriter{out: &out, line: func(l string) { lines = append(lines, l) }}
	for _, p := range []string{"a=1 b", "=2\nc=3\n", "d=4"} {
		if _, err := w.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	w.flush()
	if got := strings.Join(lines, "|"); got != "a=1 b=2|c=3|d=4" {
		t.Errorf("lines %q", got)
	}
	if out.String() != "a=1 b=2\nc=3\nd=4" {
		t.Errorf("copied %q", out.String())
	}
}
