package host

import (
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/tests/notifysock"
)

func TestNotifier(t *testing.T) {
	_, msgs := notifysock.Listen(t)
	n := NewNotifier()
	steps := []struct {
		send func() error
		want string
	}{
		{n.Ready, "READY=1"},
		{func() error { return n.Status("Staging quay.io/x@sha256:ab") }, "STATUS=Staging quay.io/x@sha256:ab"},
		{func() error { return n.Status("two\nREADY=1") }, "STATUS=two READY=1"},
		{n.Watchdog, "WATCHDOG=1"},
		{n.Stopping, "STOPPING=1"},
	}
	for _, s := range steps {
		if err := s.send(); err != nil {
			t.Fatal(err)
		}
		got, err := notifysock.WaitPrefixTimeout(msgs, "", 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got != s.want {
			t.Errorf("datagram %q, want %q", got, s.want)
		}
	}
}

func TestNotifierWithoutSocket(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if err := NewNotifier().Ready(); err != nil {
		t.Fatalf("Ready without NOTIFY_SOCKET: %v", err)
	}
}

func TestWatchdogInterval(t *testing.T) {
	tests := []struct {
		name, usec, pid string
		want            time.Duration
		on              bool
	}{
		{"30s watchdog", "30000000", "", 30 * time.Second, true},
		{"no watchdog", "", "", 0, false},
		{"for another process", "30000000", "1", 0, false},
		{"garbage", "soon", "", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("WATCHDOG_USEC", tc.usec)
			t.Setenv("WATCHDOG_PID", tc.pid)
			d, on := NewNotifier().WatchdogInterval()
			if d != tc.want || on != tc.on {
				t.Fatalf("WatchdogInterval = %v, %v; want %v, %v", d, on, tc.want, tc.on)
			}
		})
	}
}
