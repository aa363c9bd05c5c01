package fakedbus

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// StartBus is tests/fakedbus.StartBus for this package's own tests, which
// cannot import it (it imports this package).
func StartBus(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, stop, err := StartBusProcess(ctx, tb.TempDir())
	if errors.Is(err, ErrNoDaemon) && os.Getenv("BOOTC_FLEET_REQUIRE_DBUS") != "1" {
		tb.Skipf("skipping: %v", err)
	}
	if err != nil {
		tb.Fatalf("starting dbus-daemon: %v", err)
	}
	tb.Cleanup(stop)
	return addr
}
