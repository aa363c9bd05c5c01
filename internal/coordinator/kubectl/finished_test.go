package kubectl

import (
	"testing"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
)

// TestFinishedStageSlotIsShownFinished: a stage slot whose holder staged
// its image locked is Finished (amendment 31): listed as such on its
// holder, not among the slots held against maxStaging, no one's work, and
// the next node's stage grant takes it.
func TestFinishedStageSlotIsShownFinished(t *testing.T) {
	w := newQueueWorld(t, lease.KindStage, []string{"a", "b"})
	w.give("a")
	st := &w.bns["a"].Status
	st.Phase, st.Staged = fleetv1.PhaseStaged, &fleetv1.Deployment{Image: repo + ":v2", Digest: newDg, DownloadOnly: true}
	v := w.view()
	for _, n := range w.nodes {
		v.nodes[n.Name].Status.NodeInfo.BootID = n.BootID
	}
	v.slots = plan.WithFinished([]plan.Slot{w.slot}, v.slotHolder, false)
	if hs := v.slotsOf("a"); len(hs) != 1 || hs[0].Phase != string(plan.PhaseFinished) {
		t.Fatalf("slots of a: %+v, want one %s", hs, plan.PhaseFinished)
	}
	if hs := v.holders(lease.KindStage); len(hs) != 0 || v.finished() != 1 {
		t.Fatalf("stage holders %+v, %d finished; want none held and 1 finished", hs, v.finished())
	}
	if s, ok := v.grantOf("a"); ok {
		t.Fatalf("a is shown working under %s, which it is done with", s.Name)
	}
	if r := v.poolReport(); r.StageSlots.Held != 0 || r.StageSlots.Finished != 1 {
		t.Fatalf("stage slots %+v, want 0 held, 1 finished", r.StageSlots)
	}
	if got := w.plan(); got != "b" {
		t.Fatalf("the finished slot went to %q, want b", got)
	}
}
