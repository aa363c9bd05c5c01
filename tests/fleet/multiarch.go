package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
)

// Index is a multi-arch image pushed to a pool's repository.
type Index struct {
	Ref    string            // repo@sha256 of the index: the pool's target
	Images map[string]string // architecture -> repo@sha256 of its image
}

// PushIndex uploads a new multi-arch index as the pool's repo:tag, one fresh
// random image per linux architecture (arm64 as arm64/v8, as bootc base
// images publish it).
func (p *Pool) PushIndex(tag string, arches ...string) Index {
	f := p.f
	f.tb.Helper()
	out := Index{Images: map[string]string{}}
	var adds []mutate.IndexAddendum
	for _, arch := range arches {
		img, err := random.Image(512, 1)
		if err != nil {
			f.tb.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			f.tb.Fatal(err)
		}
		out.Images[arch] = p.Repo + "@" + d.String()
		pl := &v1.Platform{OS: "linux", Architecture: arch}
		if arch == "arm64" {
			pl.Variant = "v8"
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: pl}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	ref, err := name.ParseReference(p.Repo+":"+tag, name.Insecure)
	if err != nil {
		f.tb.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		f.tb.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		f.tb.Fatal(err)
	}
	out.Ref = p.Repo + "@" + d.String()
	return out
}

// TargetsOf is, by the harness's own reckoning (what it pushed and each
// node's kubelet architecture), the image every node must end on.
func (p *Pool) TargetsOf(ix Index) map[string]string {
	out := map[string]string{}
	for _, n := range p.Nodes {
		out[n.Name] = ix.Images[n.Kubelet.Arch]
	}
	return out
}

// ConvergedEach reports whether every live node is booted on its own target
// and Idle.
func (p *Pool) ConvergedEach(targets map[string]string) (bool, string) {
	var waiting []string
	for _, n := range p.Nodes {
		if n.Dead() {
			continue
		}
		if img := n.Machine.BootedImage(); n.Down() || img == "" || img != targets[n.Name] {
			waiting = append(waiting, n.Name)
		}
	}
	if len(waiting) > 0 {
		return false, strings.Join(waiting, ",")
	}
	var list fleetv1.BootcNodeList
	if err := p.f.Env.Client.List(p.f.ctx, &list); err != nil {
		return false, "listing BootcNodes: " + err.Error()
	}
	phase := map[string]fleetv1.NodePhase{}
	for _, bn := range list.Items {
		phase[bn.Name] = bn.Status.Phase
	}
	for _, n := range p.Nodes {
		if ph := phase[n.Name]; !n.Dead() && ph != fleetv1.PhaseIdle {
			waiting = append(waiting, n.Name+"("+string(ph)+")")
		}
	}
	return len(waiting) == 0, strings.Join(waiting, ",")
}

// CheckEach runs the invariant checker with each node judged by its own
// target (FinalNode.Target); poolTarget is the pool's (the index).
func (p *Pool) CheckEach(poolTarget string, targets map[string]string, budget invariant.Pool) []invariant.Violation {
	fin := p.Final(poolTarget)
	for name, fn := range fin.Nodes {
		fn.Target = targets[name]
		fin.Nodes[name] = fn
	}
	return invariant.Check(p.Events(), map[string]invariant.Pool{p.Name: budget}, fin)
}

// MultiArchIndex rolls a multi-arch index (amd64 and arm64 images) over a
// pool of amd64 and arm64 nodes, and moves the tag to a new index while one
// node is mid-stage and another mid-reboot. bootc reports the digest of the
// platform image it pulled, never the index's, so the pool converges only if
// each node is given its own platform's image: every node must end on its
// platform's image of the second index, every stage and reboot must be of
// an image of the node's own platform, the pool must report the index as
// its target, and I1-I5 must hold.
func MultiArchIndex(ctx context.Context, f *Fleet, seed int64) Result {
	start := time.Now()
	r := rand.New(rand.NewPCG(uint64(seed), 0xa4c4))
	name := fmt.Sprintf("march%04d", seed)
	opts := PoolOptions{Nodes: 6, MaxUnavailable: 1 + r.IntN(2), MaxStaging: 2, HaltAfter: 1, RebootTimeout: time.Minute}
	arches := []string{"amd64", "arm64"}
	first := r.IntN(2) // which architecture node 0 has
	opts.Arch = func(i int) string { return arches[(i+first)%2] }
	stale := time.Duration(r.IntN(800)) * time.Millisecond
	opts.Behaviour = func(int) NodeBehaviour {
		return NodeBehaviour{BootTime: 1500 * time.Millisecond, StaleAfterReboot: stale, StageTime: 2 * time.Second}
	}
	res := Result{Seed: seed, Pool: name}
	p := f.AddPool(name, opts)
	v2 := p.PushIndex("v2", arches...)
	v3 := p.PushIndex("v3", arches...)
	p.Create("v2", opts)

	if !sim.WaitFor(ctx, 60*time.Second, func() bool {
		staging, down := false, false
		for _, n := range p.Nodes {
			staging, down = staging || n.Staging(), down || n.Down()
		}
		return staging && down
	}) {
		res.Problems = append(res.Problems, "never saw one node mid-stage while another was mid-reboot")
	}
	if got := p.Status().TargetImage; got != v2.Ref {
		res.Problems = append(res.Problems, fmt.Sprintf("targetImage %s during the first rollout, want the index %s", got, v2.Ref))
	}
	if err := p.SetImage("v3"); err != nil {
		res.Problems = append(res.Problems, "changing the image: "+err.Error())
	}
	targets := p.TargetsOf(v3)
	if !sim.WaitFor(ctx, 120*time.Second, func() bool {
		if p.Status().TargetImage != v3.Ref {
			return false
		}
		ok, _ := p.ConvergedEach(targets)
		return ok
	}) {
		_, waiting := p.ConvergedEach(targets)
		res.Problems = append(res.Problems, fmt.Sprintf("did not converge on each node's image of %s within 120s; waiting for %s; pool status %+v", v3.Ref, waiting, p.Status()))
	}
	sim.WaitFor(ctx, 10*time.Second, func() bool { return p.Status().Rebooting == 0 && p.Status().Updated == int32(opts.Nodes) })

	st := p.Status()
	if st.Updated != int32(opts.Nodes) || st.Degraded != 0 {
		res.Problems = append(res.Problems, fmt.Sprintf("pool counts %d updated, %d degraded of %d", st.Updated, st.Degraded, opts.Nodes))
	}
	if c := meta.FindStatusCondition(st.Conditions, fleetv1.PoolPlatformImages); c == nil || c.Status != metav1.ConditionTrue || c.Reason != fleetv1.ReasonPlatformsMatched {
		res.Problems = append(res.Problems, fmt.Sprintf("PlatformImages condition %+v, want True %s", c, fleetv1.ReasonPlatformsMatched))
	}
	res.Problems = append(res.Problems, ownPlatformOnly(p, []Index{v2, v3})...)
	res.Violations = p.CheckEach(v3.Ref, targets, invariant.Pool{MaxUnavailable: opts.MaxUnavailable, MaxStaging: opts.MaxStaging, HaltAfter: opts.HaltAfter})
	res.Reboots = p.Reboots()
	res.Problems = append(res.Problems, rebootsMatchGrants(p, res.Reboots)...)
	res.Duration = time.Since(start)
	if !res.Failed() {
		p.Remove()
	}
	return res
}

// ownPlatformOnly checks that every stage a node started, every grant it
// was given and every image it booted was its own platform's image of one
// of the indexes (never an index digest, never another platform's image).
func ownPlatformOnly(p *Pool, indexes []Index) []string {
	arch := map[string]string{}
	for _, n := range p.Nodes {
		arch[n.Name] = n.Kubelet.Arch
	}
	allowed := func(node, img string) bool {
		for _, ix := range indexes {
			if ix.Images[arch[node]] == img {
				return true
			}
		}
		return false
	}
	bad := map[string]bool{}
	for _, e := range p.Events() {
		node := e.Node
		if e.Kind == invariant.LeaseVersion {
			node = e.Holder
		}
		switch e.Kind {
		case invariant.StageStart, invariant.Apply, invariant.Reboot, invariant.LeaseVersion:
			if node != "" && e.Image != "" && !allowed(node, e.Image) && arch[node] != "" {
				bad[fmt.Sprintf("node %s (%s): %s of %s, not an image of its platform", node, arch[node], e.Kind, e.Image)] = true
			}
		}
	}
	var out []string
	for m := range bad {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}
