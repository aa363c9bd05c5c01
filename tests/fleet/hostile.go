package fleet

// Hostile nodes: a node whose "agent" writes what a compromised or broken
// host could write into its own BootcNode status, with the node's own
// credentials (system:node:<name>), so the API server's schema, RBAC,
// NodeRestriction and admission policies decide what lands, exactly as for
// a real node. It never runs bootc and never reboots.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// HostileKind is what a hostile node writes.
type HostileKind string

const (
	// HostileForgedGrant reports Staging and lists, as its own, a grant
	// another node of its pool holds (that Lease's name, uid and
	// transitions) or, when none is held, an invented one.
	HostileForgedGrant HostileKind = "forged grant"
	// HostileOtherBoot reports a status read in a boot that is not the one
	// its kubelet reports (a random boot ID), waiting for a stage slot.
	HostileOtherBoot HostileKind = "another boot's ID"
	// HostileStagingForever reports Staging, in its current boot, without
	// ever holding a grant, heartbeating as a live agent does.
	HostileStagingForever HostileKind = "Staging forever without a grant"
	// HostileFutureReport heartbeats with lastReportTime a century ahead
	// (a new value each time), waiting.
	HostileFutureReport HostileKind = "lastReportTime in the far future"
	// HostilePastReport heartbeats with lastReportTime in 1971 (a new value
	// each time), waiting.
	HostilePastReport HostileKind = "lastReportTime in the far past"
	// HostileOversized writes a message, reason, agent version and grant
	// list beyond the schema's bounds, and a phase the enum does not have;
	// every such write must be refused. Between them it writes nothing.
	HostileOversized HostileKind = "oversized and malformed status"
)

// HostileKinds lists every kind, in the order chaos draws from.
var HostileKinds = []HostileKind{HostileForgedGrant, HostileOtherBoot, HostileStagingForever,
	HostileFutureReport, HostilePastReport, HostileOversized}

// TakesStageCapacity reports whether the kind keeps a share of maxStaging
// from the other nodes for as long as it reports. Staging without a slot is counted
// against maxStaging (amendment 7); a fresh Waiting report gets a stage
// grant in its turn, which a node that never lists it holds until it
// expires (one lease duration), and is then offered the freed slot again
// ahead of nodes whose last stage failed.
func (k HostileKind) TakesStageCapacity() bool {
	return k != HostileOtherBoot && k != HostileOversized
}

// HostileRecord is what a hostile node's writes met.
type HostileRecord struct {
	mu       sync.Mutex
	Accepted int
	Refused  map[string]int // the API server's refusals, by reason
	Last     string         // the last refusal's message
	Copied   int            // reports that listed another node's real grant
}

func (r *HostileRecord) note(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.Accepted++
		return
	}
	if r.Refused == nil {
		r.Refused = map[string]int{}
	}
	why := string(apierrors.ReasonForError(err))
	if why == "" {
		why = "no answer" // e.g. a cut connection in an API outage
	}
	r.Refused[why]++
	r.Last = err.Error()
}

// Counts returns the accepted writes and the refusals.
func (r *HostileRecord) Counts() (accepted int, refused map[string]int, last string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.Refused {
		out[k] = v
	}
	return r.Accepted, out, r.Last
}

// runHostile runs n's hostile writer until ctx ends.
func (n *SimNode) runHostile(ctx context.Context, kind HostileKind, rec *HostileRecord) {
	rc, err := fleetREST(n.rest)
	if err != nil {
		n.logger.Error("hostile node did not start", "err", err)
		return
	}
	cs, err := kubernetes.NewForConfig(n.rest)
	if err != nil {
		n.logger.Error("hostile node did not start", "err", err)
		return
	}
	leases := cs.CoordinationV1().Leases(lease.Namespace)
	booted := n.Machine.State().Booted
	for i := 0; ctx.Err() == nil; i++ {
		status := map[string]any{
			"bootID": n.Machine.BootID(), "phase": fleetv1.PhaseWaiting, "reason": "WaitingForGrant",
			"message": "waiting for a stage slot", "agentVersion": "hostile", "grants": []fleetv1.GrantInUse{},
			"lastReportTime": metav1.NewMicroTime(time.Now()),
		}
		if booted != nil {
			status["booted"] = fleetv1.Deployment{Image: booted.Image, Digest: booted.Digest}
		}
		switch kind {
		case HostileForgedGrant:
			status["phase"], status["reason"], status["message"] = fleetv1.PhaseStaging, "Staging", "Staging under another node's grant"
			forged := othersGrants(ctx, leases, n.Pool, n.Name)
			if len(forged) > 0 {
				rec.mu.Lock()
				rec.Copied++
				rec.mu.Unlock()
			} else {
				forged = []fleetv1.GrantInUse{{Lease: lease.SlotName(n.Pool, lease.KindStage, 0), UID: uuid.NewUUID(), LeaseTransitions: 1}}
			}
			status["grants"] = forged
		case HostileOtherBoot:
			status["bootID"] = string(uuid.NewUUID())
		case HostileStagingForever:
			status["phase"], status["reason"], status["message"] = fleetv1.PhaseStaging, "Staging", "Staging (no grant)"
		case HostileFutureReport:
			status["lastReportTime"] = metav1.NewMicroTime(time.Now().AddDate(100, 0, 0))
		case HostilePastReport:
			status["lastReportTime"] = metav1.NewMicroTime(time.Date(1971, 1, 1, 0, 0, i, 0, time.UTC))
		case HostileOversized:
			switch i % 4 {
			case 0:
				status["message"] = strings.Repeat("m", fleetv1.MaxStatusMessage+1)
			case 1:
				status["reason"] = "R" + strings.Repeat("x", 64)
			case 2:
				status["phase"] = "Rebooting; rm -rf /"
			case 3:
				g := make([]fleetv1.GrantInUse, 17)
				for j := range g {
					g[j] = fleetv1.GrantInUse{Lease: fmt.Sprintf("%s-stage-%d", n.Pool, j), UID: uuid.NewUUID(), LeaseTransitions: 1}
				}
				status["grants"] = g
			}
		}
		raw, err := json.Marshal(map[string]any{"status": status})
		if err == nil {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err = rc.Patch(types.MergePatchType).Resource("bootcnodes").Name(n.Name).SubResource("status").Body(raw).Do(pctx).Error()
			cancel()
			if ctx.Err() == nil && !apierrors.IsNotFound(err) {
				rec.note(err) // NotFound: the coordinator has not made it yet
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// othersGrants lists the grants held by nodes of pool other than not, read
// with the hostile node's own credentials (a node may read every slot
// Lease): what a forger copies.
func othersGrants(ctx context.Context, leases coordinationv1client.LeaseInterface, pool, not string) []fleetv1.GrantInUse {
	ls, err := leases.List(ctx, metav1.ListOptions{LabelSelector: lease.LabelPool + "=" + pool})
	if err != nil {
		return nil
	}
	var out []fleetv1.GrantInUse
	for _, l := range ls.Items {
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || *l.Spec.HolderIdentity == not {
			continue
		}
		tr := int32(0)
		if l.Spec.LeaseTransitions != nil {
			tr = *l.Spec.LeaseTransitions
		}
		out = append(out, fleetv1.GrantInUse{Lease: l.Name, UID: l.UID, LeaseTransitions: tr})
	}
	return out
}

// judgeHostile checks what the API server let a hostile node write and
// notes what the coordinator says about it: the pool's conditions, the
// node's rollout state and the Events that name it.
func judgeHostile(ctx context.Context, f *Fleet, p *Pool, node string, kind HostileKind, rec *HostileRecord, notes *[]string) []string {
	var problems []string
	accepted, refused, last := rec.Counts()
	switch {
	case kind == HostileOversized && accepted > 0:
		problems = append(problems, fmt.Sprintf("hostile %s: %d out-of-bounds status writes were accepted", node, accepted))
	case kind == HostileOversized && len(refused) == 0:
		problems = append(problems, fmt.Sprintf("hostile %s: no out-of-bounds write was even tried", node))
	case kind != HostileOversized && accepted == 0:
		problems = append(problems, fmt.Sprintf("hostile %s (%s): none of its writes landed (refused %v: %s)", node, kind, refused, last))
	}
	// Where the coordinator names the node today: a status from another
	// boot, or none accepted, leaves it "Unknown" on its BootcNode (no
	// report from the node's current boot). The other kinds are named
	// nowhere as misbehaving; the notes say what is shown instead.
	if kind == HostileOtherBoot || kind == HostileOversized {
		bn := &fleetv1.BootcNode{}
		if err := f.Env.Client.Get(ctx, types.NamespacedName{Name: node}, bn); err != nil {
			problems = append(problems, fmt.Sprintf("hostile %s: reading its BootcNode: %v", node, err))
		} else if got := bn.Annotations[fleetv1.AnnotationRolloutState]; got != fleetv1.RolloutUnknown {
			problems = append(problems, fmt.Sprintf("hostile %s (%s): rollout state %q (%s), want %s (no report from its current boot)",
				node, kind, got, bn.Annotations[fleetv1.AnnotationRolloutReason], fleetv1.RolloutUnknown))
		}
	}
	rec.mu.Lock()
	copied := rec.Copied
	rec.mu.Unlock()
	if kind == HostileForgedGrant && copied == 0 {
		problems = append(problems, fmt.Sprintf("hostile %s: never saw another node's grant to copy", node))
	}
	said := f.whatIsSaidOf(ctx, p, node)
	*notes = append(*notes, fmt.Sprintf("hostile %s (%s): %d writes accepted (%d listing another node's real grant), refused %v; said of it: %s",
		node, kind, accepted, copied, refused, strings.Join(said, "; ")))
	return problems
}

// whatIsSaidOf lists where the coordinator names node: the pool's status
// conditions, the BootcNode's rollout annotations, and Events.
func (f *Fleet) whatIsSaidOf(ctx context.Context, p *Pool, node string) []string {
	var out []string
	st := p.Status()
	for _, c := range st.Conditions {
		if strings.Contains(c.Message, node) {
			out = append(out, fmt.Sprintf("pool condition %s=%s %s", c.Type, c.Status, c.Reason))
		}
	}
	bn := &fleetv1.BootcNode{}
	if err := f.Env.Client.Get(ctx, types.NamespacedName{Name: node}, bn); err == nil {
		out = append(out, fmt.Sprintf("rollout state %q (%s)", bn.Annotations[fleetv1.AnnotationRolloutState], bn.Annotations[fleetv1.AnnotationRolloutReason]))
	}
	if evs, err := f.Kube.CoreV1().Events("").List(ctx, metav1.ListOptions{}); err == nil {
		reasons := map[string]int{}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == node || strings.Contains(e.Message, node) {
				reasons[e.Reason]++
			}
		}
		if len(reasons) > 0 {
			out = append(out, fmt.Sprintf("Events %v", reasons))
		}
	}
	return out
}
