// Package fleet runs whole-system scenarios: a real kube-apiserver, the real
// coordinator, simulated kubelets and one real agent per node, with every
// grant, cordon, stage, reboot and boot recorded for the invariant checker.
package fleet

import (
	"sync"
	"time"

	"github.com/bootc-fleet/bootc-fleet/tests/fleet/invariant"
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
