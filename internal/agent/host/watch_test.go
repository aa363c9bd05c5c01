package host

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Long enough never to fire in a test; event tests must not depend on it.
const noPoll = 0

func startWatch(t *testing.T, paths []string, poll time.Duration) <-chan struct{} {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := Watch(ctx, paths, poll)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func expectSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("%s: channel closed", what)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no signal", what)
	}
}

// drain empties the coalesced slot, so the next expectation needs a new event.
func drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestWatchEvents(t *testing.T) {
	tests := []struct {
		name   string
		target func(root string) string // the watched path
		setup  func(t *testing.T, root string)
		act    func(t *testing.T, root string)
	}{
		{"file in watched dir created", func(r string) string { return filepath.Join(r, "bootc") },
			func(_ *testing.T, r string) { os.Mkdir(filepath.Join(r, "bootc"), 0o755) },
			func(t *testing.T, r string) { write(t, filepath.Join(r, "bootc", "staged"), "x") }},
		{"watched file modified", func(r string) string { return filepath.Join(r, "deploy") },
			func(t *testing.T, r string) { write(t, filepath.Join(r, "deploy"), "a") },
			func(t *testing.T, r string) { write(t, filepath.Join(r, "deploy"), "b") }},
		{"watched file replaced by rename", func(r string) string { return filepath.Join(r, "deploy") },
			func(t *testing.T, r string) { write(t, filepath.Join(r, "deploy"), "a") },
			func(t *testing.T, r string) {
				write(t, filepath.Join(r, ".tmp"), "b")
				if err := os.Rename(filepath.Join(r, ".tmp"), filepath.Join(r, "deploy")); err != nil {
					t.Fatal(err)
				}
			}},
		{"watched dir removed", func(r string) string { return filepath.Join(r, "bootc") },
			func(_ *testing.T, r string) { os.Mkdir(filepath.Join(r, "bootc"), 0o755) },
			func(_ *testing.T, r string) { os.Remove(filepath.Join(r, "bootc")) }},
		{"path appears later, two levels down", func(r string) string { return filepath.Join(r, "ostree", "bootc") },
			func(_ *testing.T, _ string) {},
			func(t *testing.T, r string) {
				if err := os.MkdirAll(filepath.Join(r, "ostree", "bootc"), 0o755); err != nil {
					t.Fatal(err)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.setup(t, root)
			ch := startWatch(t, []string{tc.target(root)}, noPoll)
			drain(ch)
			tc.act(t, root)
			expectSignal(t, ch, tc.name)
		})
	}
}

func TestWatchFollowsAppearingPath(t *testing.T) {
	root := t.TempDir()
	target := filepath.Join(root, "ostree", "bootc")
	ch := startWatch(t, []string{target}, noPoll)
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	expectSignal(t, ch, "path appeared")
	// Now inside the new directory: a change there is seen too. Keep
	// writing until one is reported, since the directory's own watch is
	// added after the event that announced it.
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		drain(ch)
		write(t, filepath.Join(target, "state"), time.Now().String())
		select {
		case <-ch:
			return
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no signal for a change inside the appeared directory")
		}
	}
}

func TestWatchRelevant(t *testing.T) {
	ws := &watchSet{targets: []string{"/ostree/bootc", "/sysroot/state/deploy"}}
	for name, want := range map[string]bool{
		"/ostree/bootc":              true,
		"/ostree/bootc/staged":       true,
		"/ostree/bootc/":             true,
		"/sysroot/state/deploy/abc":  true,
		"/ostree":                    false,
		"/ostree/bootc2":             false,
		"/ostree/deploy/default/x":   false,
		"/sysroot/state/deployments": false,
	} {
		if got := ws.relevant(name); got != want {
			t.Errorf("relevant(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestWatchPolls(t *testing.T) {
	ch := startWatch(t, []string{filepath.Join(t.TempDir(), "never")}, 10*time.Millisecond)
	for i := range 3 {
		expectSignal(t, ch, "poll tick "+string(rune('1'+i)))
	}
}

func TestWatchClosesOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := Watch(ctx, []string{t.TempDir()}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	for range ch {
	}
}
