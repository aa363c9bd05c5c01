package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// TestAutoscalerMarksWhileRolling: cluster-autoscaler's and Karpenter's
// marks are on each node exactly while it is cordoned for its reboot, and
// every administrator's own value is there again after (amendment 28).
func TestAutoscalerMarksWhileRolling(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	f := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if r := AutoscalerMarks(ctx, f, 1); r.Failed() {
		t.Fatal(r)
	} else {
		t.Logf("%s; reboots %v", r, r.Reboots)
	}
}
