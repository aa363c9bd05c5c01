package fleet

import (
	"time"

	"k8s.io/utils/clock"
)

// skewedClock is a machine's wall clock that is off by a fixed offset, as a
// host whose RTC or NTP is wrong: every time the agent writes (its status'
// lastReportTime, its reboot record) is off by that much, while durations
// it measures within one process stay true (Go's monotonic clock).
type skewedClock struct {
	clock.RealClock
	offset time.Duration
}

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.offset) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
