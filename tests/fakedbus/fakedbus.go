// Package fakedbus runs a private dbus-daemon and fake logind and systemd
// services on it (internal/sim/fakedbus), so the agent's D-Bus code talks to
// a real bus in tests (point DBUS_SYSTEM_BUS_ADDRESS at the address).
package fakedbus

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/internal/sim/fakedbus"
)

// Login1 is a fake logind.
type Login1 = fakedbus.Login1

// Systemd1 is a fake systemd manager.
type Systemd1 = fakedbus.Systemd1

// RebootCall records one reboot request to Login1.
type RebootCall = fakedbus.RebootCall

// FlagSoftReboot is logind's SD_LOGIND_SOFT_REBOOT.
const FlagSoftReboot = fakedbus.FlagSoftReboot

// ErrNoDaemon says dbus-daemon is not installed.
var ErrNoDaemon = fakedbus.ErrNoDaemon

// DaemonPath is the dbus-daemon binary used.
var DaemonPath = fakedbus.DaemonPath

// StartBusProcess starts a private dbus-daemon with its config under dir.
func StartBusProcess(ctx context.Context, dir string) (addr string, stop func(), err error) {
	return fakedbus.StartBusProcess(ctx, dir)
}

// StartBus starts a private bus for the test and stops it at cleanup. It
// skips the test when dbus-daemon is missing, unless
// BOOTC_FLEET_REQUIRE_DBUS=1.
func StartBus(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, stop, err := fakedbus.StartBusProcess(ctx, tb.TempDir())
	if errors.Is(err, fakedbus.ErrNoDaemon) && os.Getenv("BOOTC_FLEET_REQUIRE_DBUS") != "1" {
		tb.Skipf("skipping: %v", err)
	}
	if err != nil {
		tb.Fatalf("starting dbus-daemon: %v", err)
	}
	tb.Cleanup(stop)
	return addr
}
