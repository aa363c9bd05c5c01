// Package notifysock is a real sd_notify receiver for tests
// (internal/sim/notifysock): a unixgram socket to point NOTIFY_SOCKET at,
// delivering each datagram as a string.
package notifysock

import (
	"context"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/internal/sim/notifysock"
)

// Socket is a bound notify socket.
type Socket = notifysock.Socket

// ErrTimeout says no matching message arrived in time.
var ErrTimeout = notifysock.ErrTimeout

// Open binds a new socket in a fresh temporary directory.
func Open() (*Socket, error) { return notifysock.Open() }

// WaitPrefix returns the first message with a line starting with prefix.
func WaitPrefix(ctx context.Context, msgs <-chan string, prefix string) (string, error) {
	return notifysock.WaitPrefix(ctx, msgs, prefix)
}

// WaitPrefixTimeout is WaitPrefix with a timeout.
func WaitPrefixTimeout(msgs <-chan string, prefix string, timeout time.Duration) (string, error) {
	return notifysock.WaitPrefixTimeout(msgs, prefix, timeout)
}

// Listen binds a socket for the test, sets NOTIFY_SOCKET to it (t.Setenv)
// and closes it at cleanup.
func Listen(tb testing.TB) (path string, msgs <-chan string) {
	tb.Helper()
	s, err := Open()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	if t, ok := tb.(interface{ Setenv(string, string) }); ok {
		t.Setenv("NOTIFY_SOCKET", s.Path)
	}
	return s.Path, s.Messages()
}

// Expect waits (up to 30 s) for a datagram with a line starting with prefix
// and fails the test if none arrives.
func Expect(tb testing.TB, msgs <-chan string, prefix string) string {
	tb.Helper()
	m, err := WaitPrefixTimeout(msgs, prefix, 30*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	return m
}
