package decide

import (
	"flag"
	"fmt"
	"math/rand"
	"os"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

var (
	historySeeds = flag.Int("history.seeds", 5000, "random histories TestStepHistories draws (env BOOTC_FLEET_HISTORY_SEEDS overrides)")
	historySeed  = flag.Int64("history.seed", 0, "replay only this seed of TestStepHistories")
)

// maxHistory is the longest history drawn: 1..maxHistory inputs.
const maxHistory = 60

// TestStepHistories feeds random histories (observations, results of the
// effects Step emitted, with failures and refusals, stages that finish,
// fail or are lost, grants that come, change phase, are marked failed or
// revoked, new boots, soft reboots, restarts and jumps of the clock)
// through Step, and checks after every step that it never acts without the
// grant the protocol asks for (I1), reboots at most once per grant (I3),
// respects the stage backoff and the settle deadline, is pure, and moves
// only along Transitions.
func TestStepHistories(t *testing.T) {
	seeds := *historySeeds
	if v, err := strconv.Atoi(os.Getenv("BOOTC_FLEET_HISTORY_SEEDS")); err == nil && v > 0 {
		seeds = v
	}
	first := int64(1)
	if *historySeed != 0 {
		first, seeds = *historySeed, 1
	}
	seen := map[[2]Phase]bool{}
	for seed := first; seed < first+int64(seeds); seed++ {
		if msg := runHistory(seed, seen); msg != "" {
			t.Fatalf("seed %d: %s\nreplay: go test ./internal/agent/decide -run TestStepHistories -history.seed=%d -v", seed, msg, seed)
		}
	}
	declared := map[[2]Phase]bool{}
	for _, tr := range Transitions {
		declared[[2]Phase{tr.From, tr.To}] = true
	}
	for e := range seen {
		if !declared[e] {
			t.Errorf("Step moved %s -> %s, which Transitions lacks: {Phase%s, Phase%s, \"\"},", e[0], e[1], e[0], e[1])
		}
	}
	if seeds >= 1000 {
		for e := range declared {
			if !seen[e] {
				t.Errorf("Transitions declares %s -> %s, which %d histories never took", e[0], e[1], seeds)
			}
		}
	}
}

// history is what the checks remember over one history.
type history struct {
	w *world
	// rebooted: grants with a successful reboot request in this process.
	rebooted map[lease.ID]bool
	// requested: grants with a successful reboot request in this boot.
	requested map[lease.ID]bool
	// used: grants whose reboot happened (the host went down after it).
	used map[lease.ID]bool
	// finished: stage grants the agent was done with (StageFinished) in
	// some decision, and no accepted report has listed since (amendment
	// 31): none of them may be used for a stage.
	finished map[lease.ID]bool
	fail     string
}

func runHistory(seed int64, seen map[[2]Phase]bool) (fail string) {
	rng := rand.New(rand.NewSource(seed))
	w := newWorld(t0)
	h := &history{w: w, rebooted: map[lease.ID]bool{}, requested: map[lease.ID]bool{}, used: map[lease.ID]bool{}, finished: map[lease.ID]bool{}}
	var log []string
	w.check = func(before State, in Input, after State, effs []Effect) {
		if h.fail != "" {
			return
		}
		if before.Phase() != after.Phase() || len(effs) > 0 || in.Observe != nil {
			seen[[2]Phase{before.Phase(), after.Phase()}] = true
		}
		h.fail = h.checkStep(before, in, after, effs)
	}
	n := 1 + rng.Intn(maxHistory)
	for i := 0; i < n && h.fail == ""; i++ {
		log = append(log, h.act(rng))
	}
	if h.fail != "" {
		return fmt.Sprintf("%s\nhistory:\n  %s", h.fail, joinLines(log))
	}
	return ""
}

func joinLines(l []string) string {
	out := ""
	for i, s := range l {
		if i > 0 {
			out += "\n  "
		}
		out += s
	}
	return out
}

var historyImages = []imageref.Pinned{imgV1, imgV2, imgV3}

// act draws and performs one input: the result of the pending effect
// (as the runner feeds it at once), or something that happens between
// rounds.
func (h *history) act(rng *rand.Rand) string {
	w := h.w
	if len(w.pending) > 0 {
		k := w.pending[0].Kind
		ok := rng.Intn(5) > 0
		if k == EffectClearRecord {
			ok = rng.Intn(3) > 0 // a failed clear after a reboot request is rare otherwise
		}
		if ok && k == EffectReboot {
			h.rebooted[w.pending[0].Grant.ID] = true
			h.requested[w.pending[0].Grant.ID] = true
		}
		w.run(ok)
		return fmt.Sprintf("result of %s ok=%v", k, ok)
	}
	img := historyImages[rng.Intn(len(historyImages))]
	if rng.Intn(3) > 0 && w.desired.Set {
		img = w.desired.Image // mostly grants for the image the node moves to
	}
	switch r := rng.Intn(100); {
	case r < 17:
		if rng.Intn(10) == 0 {
			w.failNext = true
		}
		w.observe()
		return "observe"
	case r < 20:
		// A rollback grant, mostly for the rollback deployment.
		if w.rollback != nil && rng.Intn(5) > 0 {
			img = w.rollback.Image
		}
		phase := []lease.Phase{lease.PhaseDraining, lease.PhaseReboot, lease.PhaseReboot}[rng.Intn(3)]
		w.grantRollback(img, phase)
		return "grant rollback " + short(img) + " " + string(phase)
	case r < 35:
		// A round whose report gives a new grant its first heartbeat,
		// and the round that follows at once.
		w.observe()
		if len(w.pending) > 0 {
			return "observe"
		}
		w.report()
		w.observe()
		return "observe, report accepted, observe"
	case r < 45:
		how := []string{"done", "done", "failed", "rejected", "unauthorized"}[rng.Intn(5)]
		w.stageEnds(how)
		return "stage " + how
	case r < 52:
		if rng.Intn(8) == 0 && w.staged != nil && w.staged.DownloadOnly {
			// The locked stage goes in this boot (a person, a cleanup): a
			// finished stage grant becomes live again (amendment 31).
			w.staged = nil
			return "staged deployment removed"
		}
		w.report()
		return "report accepted"
	case r < 60:
		boot := w.boot
		if rng.Intn(6) == 0 {
			boot = BootIdentity{BootID: bootB}
		}
		w.grant(lease.KindStage, img, boot, "")
		return "grant stage " + short(img)
	case r < 68:
		phase := []lease.Phase{lease.PhaseDraining, lease.PhaseReboot, lease.PhaseReboot}[rng.Intn(3)]
		w.grant(lease.KindReboot, img, w.boot, phase)
		return "grant reboot " + short(img) + " " + string(phase)
	case r < 71:
		w.setPhase(lease.PhaseReboot)
		return "reboot grant to phase Reboot"
	case r < 75:
		k := []lease.Kind{lease.KindStage, lease.KindReboot}[rng.Intn(2)]
		w.revoke(k)
		return "revoke " + string(k)
	case r < 77:
		k := []lease.Kind{lease.KindStage, lease.KindReboot}[rng.Intn(2)]
		w.markFailed(k)
		return "mark failed " + string(k)
	case r < 81:
		w.desired = Desired{Set: true, Image: img}
		return "desired " + short(img)
	case r < 87:
		d := time.Duration(rng.Intn(20)) * time.Second
		if rng.Intn(4) == 0 {
			d = time.Duration(rng.Intn(600)) * time.Second
		}
		if rng.Intn(10) == 0 {
			d = time.Duration(rng.Intn(3)) * time.Hour
		}
		w.now = w.now.Add(d)
		return "advance " + d.String()
	case r < 93:
		soft := rng.Intn(3) == 0
		restart := rng.Intn(3) == 0
		h.hostReboots(soft, restart)
		return fmt.Sprintf("host reboots soft=%v restart=%v", soft, restart)
	case r < 95:
		w.s, w.pending, w.running = NewState(w.s.Params), nil, nil
		h.rebooted = map[lease.ID]bool{}
		return "agent restarts"
	case r < 97:
		w.policy = []fleetv1.RebootPolicy{fleetv1.RebootPolicyReboot, fleetv1.RebootPolicyAllowSoftReboot}[rng.Intn(2)]
		return "policy " + string(w.policy)
	default:
		w.signed = !w.signed
		return fmt.Sprintf("requireSigned %v", w.signed)
	}
}

func (h *history) hostReboots(soft, restart bool) {
	for id := range h.requested {
		h.used[id] = true
	}
	h.requested = map[lease.ID]bool{}
	if restart {
		h.rebooted = map[lease.ID]bool{}
	}
	h.w.reboot(soft, restart)
}

// checkStep checks one step against the world as it is when the step runs.
func (h *history) checkStep(before State, in Input, after State, effs []Effect) string {
	w := h.w
	again, effs2 := Step(before, in)
	if !reflect.DeepEqual(again, after) || !reflect.DeepEqual(effs, effs2) {
		return "Step is not a function of its input"
	}
	if len(effs) > 1 {
		return fmt.Sprintf("%d effects in one step, want at most one", len(effs))
	}
	for _, e := range effs {
		if msg := h.checkEffect(before, in, after, e); msg != "" {
			return e.String() + ": " + msg + " (decision " + after.Last.Action.String() + ")"
		}
	}
	if in.Reported != nil {
		for _, id := range in.Reported.Grants {
			delete(h.finished, id)
		}
	}
	if in.Observe != nil {
		for _, g := range after.Last.Obs.Grants {
			if StageFinished(after.Last.Obs, g.Grant) {
				h.finished[g.ID] = true
				if !g.LastHeartbeat.IsZero() {
					return "a finished stage grant kept its heartbeat: it could be used again unlisted"
				}
			}
		}
		for _, c := range Claims(after.Last.Obs, after.Last.Action) {
			if h, ok := after.Held(c.ID); ok && c.Released == "" && StageFinished(after.Last.Obs, h.Grant) {
				return "a finished stage grant is listed: " + c.ID.String()
			}
		}
		a, o := after.Last.Action, after.Last.Obs
		if a.Kind == ClearRecord && a.Reason == fleetv1.ReasonBootedUnexpectedImage && w.now.Before(o.SettleDeadline) {
			return "gave the BootedUnexpectedImage verdict before the settle deadline"
		}
		if w.corrupt && a.Kind != Nothing && a.Kind != RereadLater && a.Kind != CancelStage {
			return "acted on an unreadable record"
		}
	}
	return ""
}

func (h *history) checkEffect(before State, _ Input, _ State, e Effect) string {
	w := h.w
	switch e.Kind {
	case EffectConfirmStage:
		f := before.StageFail
		if f != nil && f.Image == e.Image && f.Grant == e.Grant.ID {
			if f.exhausted(e.Grant.ID) {
				return "a stage attempt under a grant the failures exhausted"
			}
			if w.now.Before(f.RetryAt) {
				return fmt.Sprintf("a stage attempt before the backoff ends (%s)", f.RetryAt.Sub(w.now))
			}
		}
		if e.Boot != w.boot {
			return "a stage decided on a status of another boot"
		}
	case EffectStage:
		if h.finished[e.Grant.ID] {
			return "a stage under a finished grant no accepted report listed since (amendment 31)"
		}
		return h.current(e, lease.ActionStage)
	case EffectUnlock:
		return h.current(e, lease.ActionReboot)
	case EffectRollback:
		if msg := h.current(e, lease.ActionRollback); msg != "" {
			return msg
		}
		if w.rollback == nil || w.rollback.Image != e.Image {
			return "bootc rollback without the granted image as the rollback deployment"
		}
		if w.queued {
			return "bootc rollback while the rollback is queued already (it would take it back)"
		}
		if !w.record.Present || !w.record.Rollback || w.record.Grant != e.Grant.ID || w.record.Boot != w.boot {
			return "bootc rollback without its record written in this boot"
		}
	case EffectReboot:
		act := lease.ActionReboot
		if e.Grant.Rollback {
			act = lease.ActionRollback
		}
		if msg := h.current(e, act); msg != "" {
			return msg
		}
		if h.rebooted[e.Grant.ID] {
			return "a second reboot under one grant in one run (I3)"
		}
		if h.used[e.Grant.ID] {
			return "a reboot under a grant an earlier reboot used (I3)"
		}
		for _, s := range w.spent {
			if s == e.Grant.ID {
				return "a reboot under a spent grant (I3)"
			}
		}
		if act == lease.ActionRollback && (!w.queued || w.rollback == nil || w.rollback.Image != e.Image) {
			return "a rollback reboot without the granted image queued as the rollback"
		}
		if act == lease.ActionReboot && (w.staged == nil || w.staged.Image != e.Image || w.staged.DownloadOnly) {
			return "a reboot without the granted image staged and unlocked"
		}
		if !w.record.Present || w.record.Grant != e.Grant.ID || w.record.Boot != w.boot || w.record.Rollback != (act == lease.ActionRollback) {
			return "a reboot without its record written in this boot"
		}
	}
	return ""
}

// current: the API server holds exactly e's grant now, and it allows act
// on e's image in the current boot with the agent's last heartbeat (I1).
func (h *history) current(e Effect, act lease.Action) string {
	w := h.w
	g, ok := w.leases[e.Grant.Lease]
	if !ok || g.ID != e.Grant.ID {
		return "no current grant " + e.Grant.ID.String()
	}
	if e.Boot != w.boot {
		return "decided in boot " + e.Boot.String() + ", now " + w.boot.String()
	}
	held, ok := w.s.Held(e.Grant.ID)
	if !ok {
		return "the grant is not held"
	}
	if err := g.Allows(lease.Check{Node: node, Action: act, Image: e.Image.String(), BootID: w.boot.BootID,
		SoftRebootCount: w.boot.SoftRebootCount, Now: w.now, LastHeartbeat: held.LastHeartbeat}); err != nil {
		return "the grant does not allow it: " + err.Error()
	}
	return ""
}
