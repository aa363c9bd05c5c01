package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/health"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/plan"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/prober"
)

// Defaults of the health gate's I/O (Options).
const (
	// DefaultHealthQueryInterval is how long a pool's metrics query result
	// is used before the query is run again.
	DefaultHealthQueryInterval = 15 * time.Second
	// DefaultHealthQueryTimeout bounds one metrics query, Secrets included.
	DefaultHealthQueryTimeout = 10 * time.Second
	// gateRecheck is how soon a pool is reconciled again while one of its
	// nodes has not passed its gate: pods and host reports that change do
	// not wake the reconciler by themselves.
	gateRecheck = 5 * time.Second
	// maxGatePods bounds the pods one node's workloads check reads.
	maxGatePods = 1000
	// Keys of the metrics check's Secrets.
	keyCA    = "ca.crt"
	keyToken = "token"
)

// queryFunc runs a metrics query (prober.Query).
type queryFunc func(context.Context, prober.Target) (model.Vector, error)

// healthGate gathers what the planner's health gate reads (docs/design.md,
// amendment 24): a verdict per node in the gate, and the pool's metrics
// query result, which also gates new reboot grants.
//
// Pods are read per node, uncached, by a LIST with the field selector
// spec.nodeName and the pool's podSelector: the manager caches no pods, and
// an informer on every pod of the cluster would hold them all in memory for
// reads needed for at most maxUnavailable nodes of a pool at a time. The
// API server answers that LIST from its watch cache through its index on
// spec.nodeName (as it answers the kubelet's, and the drain's own per-node
// LIST), so it costs a lookup, not a scan of etcd.
type healthGate struct {
	reader    client.Reader // the API reader: pods and Secrets
	namespace string        // where the metrics check's Secrets are
	interval  time.Duration
	timeout   time.Duration
	query     queryFunc
	log       logr.Logger

	mu    sync.Mutex
	cache map[string]metricsAnswer // by pool
}

// metricsAnswer is one run of a pool's query.
type metricsAnswer struct {
	key string // what was asked (metricsKey)
	at  time.Time
	v   model.Vector
	err error
}

func newHealthGate(reader client.Reader, opts Options, log logr.Logger) *healthGate {
	return &healthGate{reader: reader, namespace: secretNamespace, interval: opts.HealthQueryInterval, timeout: opts.HealthQueryTimeout,
		query: prober.Query, log: log, cache: map[string]metricsAnswer{}}
}

func (g *healthGate) forget(pool string) {
	g.mu.Lock()
	delete(g.cache, pool)
	g.mu.Unlock()
}

// fill sets in.Health, in.MetricsBlocked and in.MetricsError for pool. It
// returns how soon the pool wants another pass (0: no sooner than usual).
func (g *healthGate) fill(ctx context.Context, pool *fleetv1.BootcNodePool, bns map[string]*fleetv1.BootcNode, in *plan.Input, now time.Time) time.Duration {
	spec := pool.Spec.Health
	if spec == nil {
		g.forget(pool.Name)
		return 0
	}
	var v model.Vector
	var qerr error
	var recheck time.Duration
	var at time.Time
	if spec.Metrics != nil {
		v, at, qerr = g.metrics(ctx, pool.Name, spec.Metrics, now)
		if qerr != nil {
			in.MetricsError = text.Truncate(qerr.Error(), health.MaxMessage)
		} else {
			in.MetricsBlocked = inPool(health.Firing(spec.Metrics.NodeLabel, v), in.Nodes)
		}
		if qerr != nil || len(in.MetricsBlocked) > 0 {
			// Grants wait on the next answer: ask for it when it is due.
			recheck = g.interval
		}
	} else {
		g.forget(pool.Name)
	}
	nodes := map[string]*plan.Node{}
	for i := range in.Nodes {
		nodes[in.Nodes[i].Name] = &in.Nodes[i]
	}
	for _, s := range in.Slots {
		n, ok := nodes[s.Holder]
		if !ok || !inGate(s) {
			continue
		}
		o := health.Observed{Node: n.Name, KubeletBootID: n.BootID, NodeReady: n.Ready, Metrics: v, MetricsErr: qerr, MetricsAt: at, Now: now}
		if bn := bns[n.Name]; bn != nil {
			o.Host, o.SoftRebootCount = bn.Status.Host, bn.Status.SoftRebootCount
		}
		var verdict health.Verdict
		if spec.Workloads != nil {
			verdict = g.withPods(ctx, spec, o)
		} else {
			verdict = health.Evaluate(spec, o)
		}
		if in.Health == nil {
			in.Health = map[string]health.Verdict{}
		}
		in.Health[n.Name] = verdict
		if !verdict.Passed() && (recheck == 0 || gateRecheck < recheck) {
			recheck = gateRecheck
		}
	}
	return recheck
}

// inGate: a reboot grant after its drain (Rebooting, Verifying) that is not
// a rollback grant (the gate does not judge the image a node ran before).
func inGate(s plan.Slot) bool {
	return s.Kind == lease.KindReboot && !s.Grant.Rollback && (s.Phase == plan.PhaseRebooting || s.Phase == plan.PhaseVerifying)
}

// withPods evaluates the gate with the node's pods read; a read that fails
// is the workloads check not passing, named as such.
func (g *healthGate) withPods(ctx context.Context, spec *fleetv1.HealthSpec, o health.Observed) health.Verdict {
	pods, err := g.pods(ctx, o.Node, &spec.Workloads.PodSelector)
	o.Pods = pods
	v := health.Evaluate(spec, o)
	if err == nil {
		return v
	}
	for i := range v.Results {
		if v.Results[i].Check == health.CheckWorkloads {
			v.Results[i] = health.Result{Check: health.CheckWorkloads, Reason: fleetv1.ReasonWorkloadsNotReady,
				Message: text.Truncate("the node's pods could not be read: "+err.Error(), health.MaxMessage)}
		}
	}
	return v
}

// pods lists the pods bound to node that sel matches, in any namespace,
// skipping pods that ended (Succeeded, Failed: e.g. evicted ones a
// controller replaces; a crash-looping pod is Running and not Ready).
func (g *healthGate) pods(ctx context.Context, node string, sel *metav1.LabelSelector) ([]health.Pod, error) {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return nil, fmt.Errorf("spec.health.workloads.podSelector: %w", err)
	}
	if s.Empty() || s.String() == labels.Nothing().String() {
		return nil, errors.New("spec.health.workloads.podSelector selects no pods by label")
	}
	var list corev1.PodList
	if err := g.reader.List(ctx, &list, client.MatchingLabelsSelector{Selector: s}, client.MatchingFields{"spec.nodeName": node}, client.Limit(maxGatePods)); err != nil {
		return nil, err
	}
	if list.Continue != "" {
		return nil, fmt.Errorf("more than %d pods match podSelector", maxGatePods)
	}
	var out []health.Pod
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.NodeName != node || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		hp := health.Pod{Namespace: p.Namespace, Name: p.Name}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				hp.Ready, hp.ReadySince = c.Status == corev1.ConditionTrue, c.LastTransitionTime.Time
			}
		}
		out = append(out, hp)
	}
	return out, nil
}

// metrics is the pool's query result and when it was taken, run again once
// the last one is older than the interval or the check changed.
func (g *healthGate) metrics(ctx context.Context, pool string, m *fleetv1.MetricsHealthCheck, now time.Time) (model.Vector, time.Time, error) {
	key := m.URL + "\x00" + m.Query + "\x00" + m.CASecret + "\x00" + m.BearerTokenSecret
	g.mu.Lock()
	a, ok := g.cache[pool]
	g.mu.Unlock()
	if ok && a.key == key && now.Sub(a.at) < g.interval && !now.Before(a.at) {
		return a.v, a.at, a.err
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	v, err := g.run(ctx, m)
	if err != nil {
		g.log.Info("metrics health query failed", "pool", pool, "error", err.Error())
	}
	g.mu.Lock()
	g.cache[pool] = metricsAnswer{key: key, at: now, v: v, err: err}
	g.mu.Unlock()
	return v, now, err
}

// run reads the check's Secrets and runs its query.
func (g *healthGate) run(ctx context.Context, m *fleetv1.MetricsHealthCheck) (model.Vector, error) {
	t := prober.Target{URL: m.URL, Query: m.Query, Timeout: g.timeout}
	if m.CASecret != "" {
		b, err := g.secretKey(ctx, "spec.health.metrics.caSecret", m.CASecret, keyCA)
		if err != nil {
			return nil, err
		}
		t.CA = b
	}
	if m.BearerTokenSecret != "" {
		b, err := g.secretKey(ctx, "spec.health.metrics.bearerTokenSecret", m.BearerTokenSecret, keyToken)
		if err != nil {
			return nil, err
		}
		t.Token = string(b)
	}
	return g.query(ctx, t)
}

// secretKey reads key of Secret name in the coordinator's namespace, by
// name, uncached (as spec.imagePullSecret is: get only, docs/security.md).
func (g *healthGate) secretKey(ctx context.Context, field, name, key string) ([]byte, error) {
	var s corev1.Secret
	err := g.reader.Get(ctx, client.ObjectKey{Namespace: g.namespace, Name: name}, &s)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%s: Secret %s/%s not found (it must be in the coordinator's namespace)", field, g.namespace, name)
	case err != nil:
		return nil, fmt.Errorf("%s: reading Secret %s/%s: %w", field, g.namespace, name, err)
	}
	b := s.Data[key]
	if len(b) == 0 {
		return nil, fmt.Errorf("%s: Secret %s/%s has no key %s", field, g.namespace, name, key)
	}
	return b, nil
}

// inPool keeps the entries of firing that name nodes the pool sees.
func inPool(firing map[string]string, nodes []plan.Node) map[string]string {
	var out map[string]string
	for _, n := range nodes {
		if msg, ok := firing[n.Name]; ok {
			if out == nil {
				out = map[string]string{}
			}
			out[n.Name] = msg
		}
	}
	return out
}
