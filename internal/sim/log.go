// Package sim is the simulation kit the demo (cmd/bootc-fleet-demo) and the
// whole-system tests (tests/fleet) share: the process fleet (the real agent
// and coordinator binaries over simulated hosts: test-bootc, a private
// dbus-daemon with fake logind and systemd, a notify socket), simulated
// kubelets, and the event log every grant, cordon, stage, reboot and boot is
// recorded in for the invariant checker (internal/sim/invariant). It links
// no test code.
package sim

import (
	"sync"
	"time"

	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// Log is the event log of one run. It is safe for concurrent use; Seq is
// the order of Add calls.
type Log struct {
	mu     sync.Mutex
	events []invariant.Event
}

// Add appends an event, stamping Seq and (if unset) At.
func (l *Log) Add(e invariant.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.Seq = int64(len(l.events) + 1)
	if e.At.IsZero() {
		e.At = time.Now()
	}
	l.events = append(l.events, e)
}

// Events returns a copy of everything logged so far.
func (l *Log) Events() []invariant.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]invariant.Event(nil), l.events...)
}

// Count returns how many events of a kind were logged for a node ("" = any).
func (l *Log) Count(kind invariant.Kind, node string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.events {
		if e.Kind == kind && (node == "" || e.Node == node) {
			n++
		}
	}
	return n
}
