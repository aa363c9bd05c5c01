package plan

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// roundTrip stores obj as the API server does (JSON), and reads it back.
func roundTrip[T any](t *testing.T, obj *T) {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var back T
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	*obj = back
}

// Multibyte text cut to a field's bound stays valid UTF-8, so what the API
// server stores equals what the planner computes: a settled pool plans no
// write, however many passes run (hold reasons, agent messages, drain
// messages, the pool's conditions).
func TestMultibyteTextSettles(t *testing.T) {
	w := settled(3, 1, 1)
	w.nodes["node-00"].Held, w.nodes["node-00"].HoldReason = true, strings.Repeat("ß", 60) // 120 bytes, cut at 100
	w.step()
	for _, name := range []string{"node-01", "node-02"} {
		w.agentReports(name, imgV0, imageref.Pinned{}, fleetv1.PhaseDegraded)
		st := &w.bns[name].Status
		st.Reason, st.Message = fleetv1.ReasonStageFailed, strings.Repeat("日本語", 70) // 630 bytes, cut at 512
		st.Grants = nil
	}
	for range 5 {
		w.step()
		for _, bn := range w.bns {
			roundTrip(t, bn)
		}
		roundTrip(t, w.pool)
		w.now = w.now.Add(time.Second)
	}
	for _, bn := range w.bns {
		for k, v := range bn.Annotations {
			if !utf8.ValidString(v) {
				t.Errorf("BootcNode %s annotation %s is not valid UTF-8: %q", bn.Name, k, v)
			}
		}
	}
	for pass := range 20 {
		out := w.plan()
		if len(out.UpdateBootcNodes) != 0 || len(out.Changes) != 0 {
			t.Fatalf("pass %d of a settled pool: BootcNode updates %+v, slot changes %+v", pass, out.UpdateBootcNodes, out.Changes)
		}
		if !equality.Semantic.DeepEqual(out.Status, w.pool.Status) {
			t.Fatalf("pass %d of a settled pool: pool status differs from what was stored:\n got %+v\nheld %+v", pass, out.Status, w.pool.Status)
		}
		w.now = w.now.Add(time.Second)
	}
}

// status.resolvedTime is computed as the API server stores it (whole
// seconds), so a settled pool's status equals what was read back.
func TestResolvedTimeIsStoredAsComputed(t *testing.T) {
	w := settled(2, 1, 1)
	in := w.input()
	in.ResolvedAt = t0.Add(1234567 * time.Microsecond)
	out := Plan(in)
	w.pool.Status = out.Status
	roundTrip(t, w.pool)
	in.Pool = w.pool.DeepCopy()
	if again := Plan(in); !equality.Semantic.DeepEqual(again.Status, w.pool.Status) {
		t.Fatalf("resolvedTime computed %v, stored %v", again.Status.ResolvedTime, w.pool.Status.ResolvedTime)
	}
}
