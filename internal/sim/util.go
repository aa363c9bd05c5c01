package sim

import (
	"context"
	"io"
	"log"
	"time"
)

// NopLogger discards what it is given.
func NopLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// PoolLabel selects a simulated pool's Nodes. It is in the
// node-restriction.kubernetes.io namespace, which kubelets may not set on
// themselves, as docs/security.md recommends.
const PoolLabel = "node-restriction.kubernetes.io/bootc-fleet-pool"

// WaitFor polls cond until it is true or the timeout passes.
func WaitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}
