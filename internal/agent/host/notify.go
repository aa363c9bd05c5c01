package host

import (
	"fmt"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notifier sends sd_notify messages to systemd ($NOTIFY_SOCKET). Without
// NOTIFY_SOCKET (not run by systemd) every message is a no-op.
type Notifier struct{}

// NewNotifier returns a Notifier for the current process.
func NewNotifier() *Notifier { return &Notifier{} }

// Ready tells systemd start-up finished (READY=1).
func (n *Notifier) Ready() error { return n.send(daemon.SdNotifyReady) }

// Status sets the one-line status `systemctl status` shows (STATUS=...).
// Newlines are replaced, so a status cannot carry other assignments.
func (n *Notifier) Status(line string) error {
	line = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == 0 {
			return ' '
		}
		return r
	}, line)
	return n.send("STATUS=" + line)
}

// Watchdog pings the service watchdog (WATCHDOG=1).
func (n *Notifier) Watchdog() error { return n.send(daemon.SdNotifyWatchdog) }

// Stopping tells systemd the service is shutting down (STOPPING=1).
func (n *Notifier) Stopping() error { return n.send(daemon.SdNotifyStopping) }

// WatchdogInterval returns the unit's WatchdogSec (from $WATCHDOG_USEC, for
// this process) and whether the watchdog is on. Ping at half of it.
func (n *Notifier) WatchdogInterval() (time.Duration, bool) {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil || d <= 0 {
		return 0, false
	}
	return d, true
}

func (n *Notifier) send(state string) error {
	if _, err := daemon.SdNotify(false, state); err != nil {
		return fmt.Errorf("sd_notify %s: %w", strings.SplitN(state, "=", 2)[0], err)
	}
	return nil
}
