package integration

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/kubectl"
)

// pluginWait is `kubectl bootc-fleet wait ARGS` run in-process with a
// watching client of the test's API server, in the background, as a
// pipeline runs it after changing spec.image.
type pluginWait struct {
	args []string
	done chan int
	mu   sync.Mutex
	out  bytes.Buffer
}

func (w *pluginWait) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.Write(p)
}

func (w *pluginWait) output() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.String()
}

func startWait(ctx context.Context, t *testing.T, args ...string) *pluginWait {
	t.Helper()
	cl, err := client.NewWithWatch(env.Config, client.Options{Scheme: kubectl.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w := &pluginWait{args: args, done: make(chan int, 1)}
	go func() {
		w.done <- kubectl.Run(ctx, kubectl.Options{Out: w, ErrOut: w, Client: cl, Version: "test"}, append([]string{"wait"}, args...))
	}()
	return w
}

// result is wait's exit code and output, once it ended (within timeout).
func (w *pluginWait) result(t *testing.T, timeout time.Duration) (int, string) {
	t.Helper()
	select {
	case code := <-w.done:
		return code, w.output()
	case <-time.After(timeout):
		t.Fatalf("wait %v did not end within %s:\n%s", w.args, timeout, w.output())
		return 0, ""
	}
}

// running: wait has not ended yet.
func (w *pluginWait) running() bool {
	select {
	case code := <-w.done:
		w.done <- code
		return false
	default:
		return true
	}
}
