// Command kubectl-bootc_fleet is the kubectl plugin `kubectl bootc-fleet`:
// why each node waits, pools' progress and budgets, pause and resume a pool,
// hold and release a node (docs/kubectl.md). Put it on PATH and run
// `kubectl bootc-fleet status`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/kubectl"
)

// version is set at build time with -ldflags "-X main.version=...", as the
// agent's and the coordinator's are.
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := kubectl.Run(ctx, kubectl.Options{Out: os.Stdout, ErrOut: os.Stderr, Version: version}, os.Args[1:])
	stop()
	os.Exit(code)
}
