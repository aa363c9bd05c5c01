package health

import (
	"fmt"
	"sort"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/text"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Pod is what the workloads check reads of one pod bound to the node that
// the pool's podSelector matches.
type Pod struct {
	Namespace, Name string
	// Ready is the PodReady condition's status being True.
	Ready bool
	// ReadySince is that condition's lastTransitionTime (zero: unknown).
	ReadySince time.Time
}

// Workloads evaluates the workloads check: the node is Ready and every pod
// has been Ready for minReadySeconds at now. No matching pod passes (every
// pod of none is Ready); the message says so.
func Workloads(spec *fleetv1.WorkloadHealthCheck, nodeReady bool, pods []Pod, now time.Time) Result {
	r := Result{Check: CheckWorkloads}
	if spec == nil {
		r.Pass = true
		return r
	}
	if !nodeReady {
		r.Reason, r.Message = fleetv1.ReasonWorkloadsNotReady, "the node is not Ready"
		return r
	}
	minReady := time.Duration(max(spec.MinReadySeconds, 0)) * time.Second
	sorted := append([]Pod(nil), pods...)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Namespace != sorted[j].Namespace {
			return sorted[i].Namespace < sorted[j].Namespace
		}
		return sorted[i].Name < sorted[j].Name
	})
	var bad []string
	for _, p := range sorted {
		name := text.Truncate(p.Namespace, 63) + "/" + text.Truncate(p.Name, 253)
		switch {
		case !p.Ready:
			bad = append(bad, name+" (not Ready)")
		case minReady == 0:
		case p.ReadySince.IsZero():
			bad = append(bad, name+" (Ready since an unknown time)")
		case now.Sub(p.ReadySince) < minReady:
			// A kubelet clock ahead of ours shows as a pod not Ready long
			// enough yet: the wait is longer, never shorter.
			bad = append(bad, fmt.Sprintf("%s (Ready for %s of %s)", name, max(now.Sub(p.ReadySince), 0).Truncate(time.Second), minReady))
		}
	}
	if len(bad) > 0 {
		r.Reason = fleetv1.ReasonWorkloadsNotReady
		r.Message = text.Truncate(fmt.Sprintf("%d of %d pods not Ready for %ds: %s", len(bad), len(pods), spec.MinReadySeconds, listed(bad, len(bad))), MaxMessage)
		return r
	}
	r.Pass = true
	if len(pods) == 0 {
		r.Message = "no pod on the node matches podSelector"
	}
	return r
}
