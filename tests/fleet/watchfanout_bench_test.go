package fleet

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	envtest "github.com/bootc-fleet/bootc-fleet/internal/controlplane"
)

// BenchmarkLeaseWatchFanOut measures what an agent's watch of its slot
// Leases costs the API server on every Lease write of the fleet. Each agent
// watches the slot namespace with the label selector holder=<node>; the
// watch cache indexes watchers by object name (and by a resource's trigger
// field, which Leases lack), not by label, so every Lease event goes into
// every such watcher's buffer and is filtered there. A watch scoped by
// metadata.name is dispatched only the events of that object. The benchmark
// writes the same Lease updates with no watchers, BENCH_WATCHERS (1000)
// label-selected ones and as many scoped to the name of another Lease (as
// a watch of a node's own object would be), then with none again, and
// prints the API server's CPU seconds (its process_cpu_seconds_total) per
// write and the watches it closed as unresponsive.
func BenchmarkLeaseWatchFanOut(b *testing.B) {
	if ok, why := envtest.Available(); !ok {
		b.Skip(why)
	}
	watchers := 1000
	if v, err := strconv.Atoi(os.Getenv("BENCH_WATCHERS")); err == nil && v > 0 {
		watchers = v
	}
	const slots, writes = 20, 2000
	env, err := envtest.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer env.Stop()
	kube := kubernetes.NewForConfigOrDie(env.Config)
	ctx := context.Background()
	leases := kube.CoordinationV1().Leases(lease.Namespace)
	for i := range slots {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("fanout-%d", i), Labels: map[string]string{lease.LabelHolder: ""}}}
		if _, err := leases.Create(ctx, l, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	for _, mode := range []string{"none", "label", "name", "none-again"} {
		b.Run("watchers="+mode, func(b *testing.B) {
			wctx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			n := watchers
			if mode == "none" || mode == "none-again" {
				n = 0
			}
			for i := range n {
				opts := metav1.ListOptions{LabelSelector: lease.LabelHolder + "=" + fmt.Sprintf("node-%d", i)}
				if mode == "name" {
					opts = metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", fmt.Sprintf("own-%d", i)).String()}
				}
				w, err := leases.Watch(wctx, opts)
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					for range w.ResultChan() {
					}
				})
			}
			// Each Watch returned once the API server answered it, after
			// its watch cache registered the watcher: all are counted.
			cpu0, term0 := apiserverCPU(b, kube), terminated(b, kube)
			start := time.Now()
			var ww sync.WaitGroup
			for s := range slots {
				ww.Go(func() {
					for k := range writes / slots {
						name := fmt.Sprintf("fanout-%d", s)
						l, err := leases.Get(ctx, name, metav1.GetOptions{})
						if err != nil {
							b.Error(err)
							return
						}
						l.Labels[lease.LabelHolder] = fmt.Sprintf("node-%d", (s*97+k)%max(watchers, 1))
						if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			ww.Wait()
			elapsed := time.Since(start)
			cpu1, term1 := apiserverCPU(b, kube), terminated(b, kube)
			stop()
			wg.Wait()
			perWrite := (cpu1 - cpu0) / writes
			fmt.Fprintf(os.Stderr, "lease watch fan-out: %d %s watchers, %d writes (and as many GETs) in %s: API server CPU %.2f s, %.0f µs per write, %.0f watches closed as unresponsive\n",
				n, mode, writes, elapsed.Round(time.Millisecond), cpu1-cpu0, perWrite*1e6, term1-term0)
			b.ReportMetric(perWrite*1e6, "apiserver_cpu_us/write")
			b.ReportMetric(term1-term0, "terminated_watches")
		})
	}
}

func apiserverCPU(b *testing.B, kube kubernetes.Interface) float64 {
	cpu, err := apiServerCPU(context.Background(), kube)
	if err != nil {
		b.Fatal(err)
	}
	return cpu
}

func terminated(b *testing.B, kube kubernetes.Interface) float64 {
	m, err := terminatedWatchers(context.Background(), kube)
	if err != nil {
		b.Fatal(err)
	}
	return m["leases"]
}
