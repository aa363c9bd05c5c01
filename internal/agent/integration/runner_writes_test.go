package integration_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
)

// statusLog records every status write of one BootcNode as the API server
// shows it, from a watch (each write is one MODIFIED event with a new
// lastReportTime). A write whose content, but for the time, equals the one
// before is a heartbeat.
type statusLog struct {
	mu     sync.Mutex
	writes []fleetv1.BootcNodeStatus
}

func watchStatus(t *testing.T, node string) *statusLog {
	t.Helper()
	wc, err := client.NewWithWatch(sharedEnv().Config, client.Options{Scheme: sharedEnv().Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &fleetv1.BootcNodeList{}, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", node)})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	l := &statusLog{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var last *fleetv1.BootcNodeStatus
		for ev := range w.ResultChan() {
			bn, ok := ev.Object.(*fleetv1.BootcNode)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			st := bn.Status
			if st.LastReportTime == nil || (last != nil && last.LastReportTime != nil && last.LastReportTime.Equal(st.LastReportTime)) {
				continue // not a status write (the spec, or nothing reported yet)
			}
			last = st.DeepCopy()
			l.mu.Lock()
			l.writes = append(l.writes, *last)
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
	return l
}

// since returns the writes after the first n, each but heartbeats, as
// "phase/reason [grants]".
func (l *statusLog) since(n int) (changes []string, heartbeats int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := n; i < len(l.writes); i++ {
		cur := l.writes[i]
		if i > 0 {
			prev := l.writes[i-1]
			prev.LastReportTime, cur.LastReportTime = nil, nil
			if equality.Semantic.DeepEqual(prev, cur) {
				heartbeats++
				continue
			}
		}
		changes = append(changes, fmt.Sprintf("%s/%s %d grant(s)", cur.Phase, cur.Reason, len(cur.Grants)))
	}
	return changes, heartbeats
}

func (l *statusLog) len() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.writes) }

// One node update costs the agent one status write per step the coordinator
// or a person acts on: the stage it starts (which lists the new grant),
// staged, and the node up to date in its new boot. The coordinator taking
// back the stage grant, a reboot grant in phase Draining, the reboot itself
// (its grant needs no heartbeat) and the agent's own bookkeeping after it
// write nothing of their own (docs/design.md, amendments 17, 18 and 37).
func TestRunWritesOneReportPerStep(t *testing.T) {
	h := start(t, "mem-w", time.Minute)
	log := watchStatus(t, h.node)
	ctx := context.Background()
	boot1 := h.m.BootID()
	h.wait("Waiting without a grant", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))
	h.until("the watch saw the Waiting report", func() bool { return log.len() > 0 })
	from := log.len()

	stage, err := h.k.Grant(ctx, lease.KindStage, 0, h.node, imgV2, boot1, "")
	if err != nil {
		t.Fatal(err)
	}
	h.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant))
	if err := h.k.Revoke(ctx, lease.KindStage, 0); err != nil { // the coordinator's release once staged
		t.Fatal(err)
	}
	reboot, err := h.k.Grant(ctx, lease.KindReboot, 0, h.node, imgV2, boot1, lease.PhaseDraining)
	if err != nil {
		t.Fatal(err)
	}
	h.until("the reboot grant seen in phase Draining", func() bool {
		return h.log.has(`msg="grant seen"`, "kind=reboot", "phase=Draining")
	})
	if err := h.k.SetPhase(ctx, 0, lease.PhaseReboot); err != nil {
		t.Fatal(err)
	}
	h.until("one reboot request", func() bool { r, _ := h.host.count(); return r == 1 })
	h.m.Reboot(testbootc.RebootOptions{})
	h.wait("Idle on the new image", testcoord.PhaseIs(fleetv1.PhaseIdle, fleetv1.ReasonUpToDate))
	// Anything written after this would show within a round or two.
	time.Sleep(time.Second)

	changes, heartbeats := log.since(from)
	step := func(p fleetv1.NodePhase, reason string, grants int) string {
		return fmt.Sprintf("%s/%s %d grant(s)", p, reason, grants)
	}
	want := []string{
		step(fleetv1.PhaseStaging, fleetv1.ReasonStaging, 1),
		// Staged: the stage grant is finished and no longer listed (amendment 31).
		step(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant, 0),
		step(fleetv1.PhaseIdle, fleetv1.ReasonUpToDate, 0),
	}
	if fmt.Sprint(changes) != fmt.Sprint(want) {
		t.Errorf("status writes of one node update (stage grant %s, reboot grant %s):\n got %q\nwant %q", stage, reboot, changes, want)
	}
	t.Logf("%d status writes and %d heartbeats for one node update", len(changes), heartbeats)
}

// An Idle node that starts waiting for a stage grant reports so only
// WaitingHold later: a grant given meanwhile (here: within a minute) makes
// the first report after the image change Staging, one write instead of two.
func TestRunHoldsTheWaitingReport(t *testing.T) {
	h := startWith(t, "mem-hold", time.Minute, imgV1, func(c *agent.Config) { c.WaitingHold = time.Minute })
	log := watchStatus(t, h.node)
	ctx := context.Background()
	h.wait("Idle", testcoord.PhaseIs(fleetv1.PhaseIdle, fleetv1.ReasonUpToDate))
	h.until("the watch saw the Idle report", func() bool { return log.len() > 0 })
	from := log.len()
	if err := h.k.EnsureBootcNode(ctx, h.node, imgV2, ""); err != nil {
		t.Fatal(err)
	}
	h.until("the agent decided to wait", func() bool { return h.log.has("Waiting for a stage slot") })
	if _, err := h.k.Grant(ctx, lease.KindStage, 0, h.node, imgV2, h.m.BootID(), ""); err != nil {
		t.Fatal(err)
	}
	// The first status write after the image change, from the watch: the
	// test stage finishes at once, so the BootcNode may be Staged already.
	h.until("a status write after the image change", func() bool { return log.len() > from })
	changes, _ := log.since(from)
	if len(changes) == 0 || !strings.HasPrefix(changes[0], string(fleetv1.PhaseStaging)+"/") {
		t.Fatalf("status writes after the image change: %q, want Staging first (no Waiting)", changes)
	}
}

// Without a grant the held report is written once the hold has passed.
func TestRunReportsWaitingAfterTheHold(t *testing.T) {
	h := startWith(t, "mem-hold2", time.Minute, imgV1, func(c *agent.Config) { c.WaitingHold = 200 * time.Millisecond })
	h.wait("Idle", testcoord.PhaseIs(fleetv1.PhaseIdle, fleetv1.ReasonUpToDate))
	if err := h.k.EnsureBootcNode(context.Background(), h.node, imgV2, ""); err != nil {
		t.Fatal(err)
	}
	h.wait("Waiting", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))
}
