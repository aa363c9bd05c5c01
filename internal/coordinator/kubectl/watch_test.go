package kubectl

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// syncBuffer is a buffer two goroutines may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// background runs the plugin in a goroutine; the result is what run
// returns, once it ended.
func background(t *testing.T, ctx context.Context, kc string, out *syncBuffer, args ...string) <-chan int {
	t.Helper()
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, Options{Out: out, ErrOut: out, Now: func() time.Time { return now }, Version: "v0.0.0-test"},
			append([]string{"--kubeconfig=" + kc}, args...))
	}()
	return done
}

// waitFor waits until out holds want (wide bounds: a loaded machine).
func waitFor(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the output:\n%s", want, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// watchAndWait: `status app --watch` (not on a terminal) and `wait app`
// print where pool app is; when the coordinator writes it up to date, the
// watch prints it again and both end, exit 0.
func watchAndWait(t *testing.T, kc string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var watchOut, waitOut syncBuffer
	watched := background(t, ctx, kc, &watchOut, "status", "app", "--watch")
	waited := background(t, ctx, kc, &waitOut, "wait", "app")
	waitFor(t, &watchOut, "NODE ")
	waitFor(t, &waitOut, "pool app: ")

	p := &fleetv1.BootcNodePool{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "app"}, p); err != nil {
		t.Fatal(err)
	}
	p.Status.Updated = 5
	p.Status.Conditions = nil
	for _, c := range []struct{ typ, reason string }{{fleetv1.PoolUpToDate, fleetv1.ReasonAllUpdated}, {fleetv1.PoolProgressing, fleetv1.ReasonAllUpdated}} {
		cc := cond(c.typ, "True", c.reason, "all 5 node(s) run "+repo+"@"+newDg)
		if c.typ == fleetv1.PoolProgressing {
			cc.Status = "False"
		}
		cc.ObservedGeneration = p.Generation
		p.Status.Conditions = append(p.Status.Conditions, cc)
	}
	if err := env.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]<-chan int{"status --watch": watched, "wait": waited} {
		select {
		case code := <-ch:
			if code != 0 {
				t.Errorf("%s exited %d", name, code)
			}
		case <-ctx.Done():
			t.Fatalf("%s did not end:\nstatus --watch:\n%s\nwait:\n%s", name, watchOut.String(), waitOut.String())
		}
	}
	golden(t, "status-app-watch", "$ kubectl bootc-fleet status app --watch\n"+watchOut.String())
	golden(t, "wait-app", "$ kubectl bootc-fleet wait app\n"+waitOut.String())
}
