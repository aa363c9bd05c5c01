package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/slotview"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/testbootc"
)

// LightAgent stands in for bootc-fleet-agent where thousands of real agents
// in one process would make the harness, not the product, the load. It
// speaks the same protocol through the same API server: it reads its
// BootcNode's spec and the slot Leases granted to it, and writes its
// BootcNode status as its node (system:node:<name>, so RBAC, NodeRestriction
// and the admission policies apply) with the fields the real agent writes
// (observedGeneration, bootID, softRebootCount, booted/staged/rollback,
// phase, reason, message, the GrantsReadable and APIAccess conditions,
// agentVersion, lastReportTime) and lists the grants it works under in
// status.grants, heartbeating at lease duration / HeartbeatsPerLease as the
// real agent does. It uses a grant only after a report listing it was
// accepted, never writes a Lease, stages (StageTime later the machine has
// the desired image staged, locked) only under a stage grant of this boot
// and image, and unlocks and reboots only under a reboot grant in phase
// Reboot of this boot and image; the machine's reboot is the same SimNode
// reboot the real agents get.
//
// How it differs from the real agent:
//   - no bootc process or CLI: it reads and changes the in-memory machine
//     directly (no bootc status parsing, no sysroot lock, no stale window);
//   - no D-Bus/logind and no sd_notify; no soft reboot (full reboots only);
//   - the same confirm reads (a quorum GET of the grant's Lease right before
//     stage, unlock and reboot, traced with the version read), but no bootc
//     process around them: the real agent's unlock runs
//     `bootc upgrade --from-downloaded` (here the test bootc, a process of
//     its own), which the light agent does in memory;
//   - no reboot record on disk and no settle or reboot timeouts, no stage
//     retries, no degraded phases, no signature policy;
//   - no 250 ms minimum gap between rounds: it acts on each change at once.
type LightAgent struct {
	n *SimNode
	// Its own views, opened as its node: its BootcNode and its grants.
	bootcNode cache.SharedIndexInformer
	slots     *slotview.View
	fleet     rest.Interface
	leases    coordinationv1client.LeaseInterface // the node's identity: confirm reads
	pokes     chan struct{}

	lastReport   map[string]any
	lastReportAt time.Time
	credited     map[lease.ID]bool // grants listed in an accepted report
	waitingFor   string            // desired image an Idle node started waiting for, and when
	waitingSince time.Time
	staging      atomic.Bool
	rebooting    bool
	hostCtx      context.Context // the harness's, outliving the agent
}

func fleetREST(cfg *rest.Config) (rest.Interface, error) { return fleetv1.NewRESTClient(cfg) }

// The light agents' own requests, counted as they leave (the API server's
// metrics do not say who asked): reads and writes.
var lightReads, lightWrites atomic.Int64

// LightAgentRequests returns how many requests the light agents of this
// process sent so far, reads and writes, their shared informer's apart.
func LightAgentRequests() (reads, writes int64) { return lightReads.Load(), lightWrites.Load() }

// countRequests is a transport that counts into lightReads and lightWrites.
type countRequests struct{ next http.RoundTripper }

func (c countRequests) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodGet, http.MethodHead:
		lightReads.Add(1)
	default:
		lightWrites.Add(1)
	}
	return c.next.RoundTrip(req)
}

// counted is cfg with its requests counted.
func counted(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countRequests{rt} })
	return cfg
}

// lightViews opens a's watches as the real agent does
// (internal/agent/kube.go): its BootcNode by name, and the slot Leases the
// BootcNode names, each by name (slotview, amendment 39), as its node, the
// first from the watch cache (resourceVersion 0). Per node, not one shared
// watch, so the API server carries what real agents cost it.
func (a *LightAgent) lightViews(ctx context.Context, rc rest.Interface, cs kubernetes.Interface) {
	fromCache := func(lw *cache.ListWatch) *cache.ListWatch {
		watchFn := lw.WatchFuncWithContext
		lw.WatchFuncWithContext = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if o.ResourceVersion == "" {
				o.ResourceVersion = "0"
			}
			return watchFn(ctx, o)
		}
		return lw
	}
	a.slots = slotview.New(cs.CoordinationV1().RESTClient(), a.n.Name, func(lw *cache.ListWatch) cache.SharedIndexInformer {
		return cache.NewSharedIndexInformer(fromCache(lw), &coordinationv1.Lease{}, 0, cache.Indexers{})
	}, a.poke)
	a.slots.Start(ctx)
	a.bootcNode = cache.NewSharedIndexInformer(fromCache(cache.NewListWatchFromClient(rc, "bootcnodes", metav1.NamespaceAll,
		fields.OneTermEqualSelector("metadata.name", a.n.Name))), &fleetv1.BootcNode{}, 0, cache.Indexers{})
	follow := func() {
		var bn *fleetv1.BootcNode
		if o, ok, _ := a.bootcNode.GetStore().GetByKey(a.n.Name); ok {
			bn = o.(*fleetv1.BootcNode)
		}
		a.slots.Follow(bn)
		a.poke()
	}
	_, _ = a.bootcNode.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { follow() },
		UpdateFunc: func(any, any) { follow() }, DeleteFunc: func(any) { follow() }})
	go a.bootcNode.RunWithContext(ctx)
}

func (a *LightAgent) poke() {
	select {
	case a.pokes <- struct{}{}:
	default:
	}
}

// runLight runs n's light agent until ctx ends (a reboot or StopAgent).
func (n *SimNode) runLight(ctx, hostCtx context.Context) {
	cfg := counted(n.rest)
	rc, err := fleetREST(cfg)
	if err != nil {
		n.logger.Error("light agent did not start", "err", err)
		return
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		n.logger.Error("light agent did not start", "err", err)
		return
	}
	a := &LightAgent{n: n, fleet: rc, leases: cs.CoordinationV1().Leases(lease.Namespace), pokes: make(chan struct{}, 1),
		credited: map[lease.ID]bool{}, hostCtx: hostCtx}
	a.lightViews(ctx, rc, cs)
	for {
		next := a.round(ctx)
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-a.pokes:
		case <-t.C:
		}
		t.Stop()
	}
}

// round observes, reports and acts once; it returns when to look again.
func (a *LightAgent) round(ctx context.Context) time.Duration {
	n := a.n
	obj, ok, _ := a.bootcNode.GetStore().GetByKey(n.Name)
	if !ok || a.rebooting {
		return time.Minute
	}
	bn := obj.(*fleetv1.BootcNode)
	st := n.Machine.State()
	n.mu.Lock()
	n.lastContent = n.Machine.Boot() // it reads the machine itself: never stale
	n.mu.Unlock()
	desired := bn.Spec.DesiredImage
	var stage, reboot *lease.Grant
	var claims []fleetv1.GrantInUse
	every := 5 * time.Minute
	held := map[lease.ID]bool{}
	for _, l := range a.slots.Leases() {
		g, err := lease.Parse(l)
		if err == nil && g.Holder == n.Name {
			held[g.ID] = true
		}
		if err != nil || g.Holder != n.Name || g.Failure != "" || g.BootID != st.BootID || desired == "" || g.Image.String() != desired {
			continue
		}
		if g.Kind == lease.KindReboot && st.Booted != nil && st.Booted.Digest == g.Image.Digest {
			continue // spent: the coordinator is verifying it
		}
		if g.Kind == lease.KindStage && !a.staging.Load() && st.Staged != nil && st.Staged.Image == desired && st.Staged.DownloadOnly {
			continue // done with it: neither listed nor heartbeated (decide.StageFinished, amendment 31)
		}
		if g.Kind == lease.KindReboot {
			// Never listed: nothing to do under it while the node drains
			// (amendment 18), and a reboot needs no heartbeat (amendment 37).
			if g.Phase == lease.PhaseReboot {
				reboot = &g
			}
			continue
		}
		claims = append(claims, fleetv1.GrantInUse{Lease: l.Name, UID: g.UID, LeaseTransitions: g.Transitions})
		every = min(every, g.Duration/lease.HeartbeatsPerLease)
		stage = &g
	}
	onDesired := func(d *testbootc.Deployment) bool { return d != nil && desired != "" && d.Image == desired }
	phase, msg := fleetv1.PhaseWaiting, "waiting for a stage grant"
	switch {
	case desired == "" || onDesired(st.Booted):
		phase, msg = fleetv1.PhaseIdle, "booted on the desired image"
	case onDesired(st.Staged) && !st.Staged.DownloadOnly:
		phase, msg = fleetv1.PhaseRebooting, "rebooting into the staged image"
	case onDesired(st.Staged):
		phase, msg = fleetv1.PhaseStaged, "staged; waiting for a reboot grant in phase Reboot"
	case a.staging.Load() || stage != nil:
		phase, msg = fleetv1.PhaseStaging, "staging the desired image"
	}
	if phase != fleetv1.PhaseIdle {
		every = min(every, time.Minute) // agent.Config.ActiveReportInterval
	}
	// An Idle node that starts waiting says so 2 s later (the real agent's
	// WaitingHold): a grant given meanwhile makes the report Staging.
	if phase == fleetv1.PhaseWaiting && a.lastReport != nil && a.lastReport["phase"] == fleetv1.PhaseIdle {
		if a.waitingFor != desired {
			a.waitingFor, a.waitingSince = desired, time.Now()
		}
		if hold := time.Until(a.waitingSince.Add(2 * time.Second)); hold > 0 {
			return hold
		}
	} else {
		a.waitingFor = ""
	}
	if !a.report(ctx, bn, st, phase, msg, claims, held, every) {
		return time.Second // retried after a pause, as the real agent does
	}
	switch {
	case phase == fleetv1.PhaseStaging && stage != nil && a.credited[stage.ID] && !a.staging.Load():
		rv, ok := a.confirm(ctx, stage)
		if !ok {
			return time.Second
		}
		a.staging.Store(true)
		n.trace(agent.Step{Kind: "stage", Lease: stage.Lease, ResourceVersion: rv})
		n.log.Add(n.event(invariant.StageStart, desired))
		n.setStaging(true)
		go func() {
			select {
			case <-ctx.Done():
			case <-time.After(n.behave().StageTime):
				_, _ = n.Machine.SwitchTo(desired, true)
			}
			n.setStaging(false)
			n.log.Add(invariant.Event{Kind: invariant.StageEnd, Node: n.Name, Pool: n.Pool, Image: desired})
			a.staging.Store(false)
			a.poke()
		}()
	case reboot != nil && onDesired(st.Staged) && st.Staged.DownloadOnly:
		rv, ok := a.confirm(ctx, reboot)
		if !ok {
			return time.Second
		}
		n.trace(agent.Step{Kind: "apply", Lease: reboot.Lease, ResourceVersion: rv})
		n.log.Add(n.event(invariant.Apply, desired))
		if err := n.Machine.Apply(); err != nil {
			return time.Second
		}
		n.log.Add(n.event(invariant.Unlocked, desired))
		if rv, ok = a.confirm(ctx, reboot); !ok {
			return time.Second
		}
		n.trace(agent.Step{Kind: "reboot", Lease: reboot.Lease, ResourceVersion: rv})
		n.log.Add(n.event(invariant.Reboot, desired))
		a.rebooting = true
		n.Reboot(a.hostCtx, true)
		return time.Minute
	}
	return every
}

// confirm reads g's Lease from the API server (no resourceVersion: a
// quorum read, never the watch cache) and reports whether it still holds
// exactly g, and at which version, as the real agent does before each step.
func (a *LightAgent) confirm(ctx context.Context, g *lease.Grant) (string, bool) {
	l, err := a.leases.Get(ctx, g.Lease, metav1.GetOptions{})
	if err != nil {
		return "", false
	}
	cur, err := lease.Parse(l)
	if err != nil || cur.ID != g.ID || cur.Holder != g.Holder || cur.Image != g.Image || cur.BootID != g.BootID ||
		cur.Phase != g.Phase || cur.Failure != "" {
		return "", false
	}
	return l.ResourceVersion, true
}

// report writes the status when it changed or a heartbeat is due; it
// reports whether the status the API server has is current. As the real
// agent, it writes nothing when the only change is a grant no longer held
// (the coordinator took it back): held are the grants its Leases show.
func (a *LightAgent) report(ctx context.Context, bn *fleetv1.BootcNode, st testbootc.State, phase fleetv1.NodePhase, msg string, claims []fleetv1.GrantInUse, held map[lease.ID]bool, every time.Duration) bool {
	dep := func(d *testbootc.Deployment) any {
		if d == nil {
			return nil
		}
		return fleetv1.Deployment{Image: d.Image, Digest: d.Digest, DownloadOnly: d.DownloadOnly}
	}
	conds := append([]metav1.Condition(nil), bn.Status.Conditions...)
	meta.SetStatusCondition(&conds, metav1.Condition{Type: agent.ConditionGrantsReadable, Status: metav1.ConditionTrue,
		Reason: fleetv1.ReasonAsExpected, Message: "every lease labelled with this node follows the slot protocol", ObservedGeneration: bn.Generation})
	meta.SetStatusCondition(&conds, metav1.Condition{Type: fleetv1.ConditionAPIAccess, Status: metav1.ConditionTrue,
		Reason: fleetv1.ReasonAsExpected, Message: "the API server accepts every request of this agent", ObservedGeneration: bn.Generation})
	if claims == nil {
		claims = []fleetv1.GrantInUse{}
	}
	fields := map[string]any{
		"observedGeneration": bn.Generation, "bootID": st.BootID, "softRebootCount": st.SoftRebootCount,
		"booted": dep(st.Booted), "staged": dep(st.Staged), "rollback": dep(st.Rollback),
		"phase": phase, "reason": "", "message": msg, "conditions": conds, "grants": claims, "agentVersion": "fleet-light",
	}
	same := false
	if a.lastReport != nil {
		last := map[string]any{}
		for k, v := range a.lastReport {
			last[k] = v
		}
		kept := []fleetv1.GrantInUse{}
		for _, g := range a.lastReport["grants"].([]fleetv1.GrantInUse) {
			if held[lease.ID{Lease: g.Lease, UID: g.UID, Transitions: g.LeaseTransitions}] {
				kept = append(kept, g)
			}
		}
		last["grants"] = kept
		x, _ := json.Marshal(fields)
		y, _ := json.Marshal(last)
		same = string(x) == string(y)
	}
	if same && time.Since(a.lastReportAt) < every {
		return true
	}
	sent := time.Now()
	body := map[string]any{}
	for k, v := range fields {
		body[k] = v
	}
	body["lastReportTime"] = metav1.NewMicroTime(sent)
	raw, err := json.Marshal(map[string]any{"status": body})
	if err != nil {
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := a.fleet.Patch(types.MergePatchType).Resource("bootcnodes").Name(a.n.Name).SubResource("status").Body(raw).Do(pctx).Error(); err != nil {
		a.n.logger.Info("light agent: status report failed", "err", err)
		return false
	}
	a.lastReport, a.lastReportAt = fields, sent
	for _, c := range claims {
		a.credited[lease.ID{Lease: c.Lease, UID: c.UID, Transitions: c.LeaseTransitions}] = true
	}
	return true
}
