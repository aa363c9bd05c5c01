package integration

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
)

// watchdogLog timestamps every WATCHDOG=1 the agent sends.
type watchdogLog struct {
	mu    sync.Mutex
	pings []time.Time
}

func (w *watchdogLog) follow(msgs <-chan string) {
	for m := range msgs {
		if strings.Contains(m, "WATCHDOG=1") {
			w.mu.Lock()
			w.pings = append(w.pings, time.Now())
			w.mu.Unlock()
		}
	}
}

// longestGap is the longest time without a ping between from and to.
func (w *watchdogLog) longestGap(from, to time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	last, longest := from, time.Duration(0)
	for _, p := range append(append([]time.Time(nil), w.pings...), to) {
		if p.Before(from) || p.After(to) {
			continue
		}
		longest = max(longest, p.Sub(last))
		last = p
	}
	return longest
}

// A pull that takes 90 s holds bootc's sysroot lock, so a bootc status
// would wait all that time. The agent must keep sending WATCHDOG=1 well
// inside WATCHDOG_USEC=30s (systemd would kill it, and the pull with it),
// finish the stage, and act on a revoke in the middle of the next pull.
func TestAgentLongPullFeedsTheWatchdog(t *testing.T) {
	if testing.Short() {
		t.Skip("two minutes of pulls")
	}
	const watchdog = 30 * time.Second
	n := newNode(t, "it-pull", "WATCHDOG_USEC=30000000")
	if err := n.dir.Configure(func(k *testbootc.Knobs) { k.SwitchDelay = testbootc.Duration(90 * time.Second) }); err != nil {
		t.Fatal(err)
	}
	wd := &watchdogLog{}
	go wd.follow(n.notify)
	n.start()

	n.grant(lease.KindStage, imgV2, "")
	n.wait("Staging", testcoord.PhaseIs(fleetv1.PhaseStaging, ""))
	pullStart := time.Now()
	ctx := context.Background()
	st, err := n.k.WaitStatus(ctx, n.name, func(s fleetv1.BootcNodeStatus) bool {
		return s.Phase == fleetv1.PhaseStaged || s.Phase == fleetv1.PhaseDegraded
	})
	if err != nil || st.Phase != fleetv1.PhaseStaged {
		t.Fatalf("after the 90 s pull: %+v, %v", st, err)
	}
	pullEnd := time.Now()
	if d := pullEnd.Sub(pullStart); d < 85*time.Second {
		t.Fatalf("the stage finished after %s: the pull did not run its 90 s", d)
	}
	if gap := wd.longestGap(pullStart, pullEnd); gap >= watchdog {
		t.Fatalf("no WATCHDOG=1 for %s during the pull (WatchdogSec=%s): systemd would have killed the agent", gap, watchdog)
	}
	select {
	case <-n.exited:
		t.Fatal("the agent exited during the pull")
	default:
	}

	// The next image: its pull is revoked 20 s in and must stop at once.
	if err := n.k.EnsureBootcNode(ctx, n.name, imgV3, ""); err != nil {
		t.Fatal(err)
	}
	if err := n.k.Revoke(ctx, lease.KindStage, 0); err != nil {
		t.Fatal(err)
	}
	n.grant(lease.KindStage, imgV3, "")
	n.wait("Staging the next image", func(s fleetv1.BootcNodeStatus) bool { return s.Phase == fleetv1.PhaseStaging })
	time.Sleep(20 * time.Second)
	if err := n.k.Revoke(ctx, lease.KindStage, 0); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	n.wait("Waiting after the revoke", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))
	if d := time.Since(revoked); d > 30*time.Second {
		t.Errorf("the revoke took %s to stop the pull", d)
	}
	m, err := n.dir.Machine()
	if err != nil {
		t.Fatal(err)
	}
	// The cancelled pull staged nothing; the staged v2 it would have
	// replaced is still there, locked.
	if s := m.State().Staged; s == nil || s.Image != imgV2 || !s.DownloadOnly {
		t.Fatalf("after the cancelled pull staged is %+v, want %s locked", s, imgV2)
	}
	if gap := wd.longestGap(pullStart, time.Now()); gap >= watchdog {
		t.Fatalf("no WATCHDOG=1 for %s", gap)
	}
	t.Logf("pull %s; longest watchdog gap %s; revoke to Waiting %s", pullEnd.Sub(pullStart).Round(time.Second),
		wd.longestGap(pullStart, time.Now()).Round(time.Millisecond), time.Since(revoked).Round(time.Millisecond))
}
