package kubectl

import (
	"bytes"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// TestUpToDateOnlyOnTheCurrentTarget: wait's rule, case by case. A pool is
// up to date only when its status describes the current generation, its
// target is a resolution of the current spec.image, and UpToDate is True
// for that generation.
func TestUpToDateOnlyOnTheCurrentTarget(t *testing.T) {
	target := repo + "@" + newDg
	upToDateCond := func(gen int64) metav1.Condition {
		c := cond(fleetv1.PoolUpToDate, metav1.ConditionTrue, fleetv1.ReasonAllUpdated, "all 3 node(s) run "+target)
		c.ObservedGeneration = gen
		return c
	}
	good := func() *fleetv1.BootcNodePool {
		p := &fleetv1.BootcNodePool{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 4}, Spec: fleetv1.BootcNodePoolSpec{Image: repo + ":v2"}}
		p.Status = fleetv1.BootcNodePoolStatus{ObservedGeneration: 4, TargetImage: target, Nodes: 3, Updated: 3, Conditions: []metav1.Condition{upToDateCond(4)}}
		return p
	}
	for _, c := range []struct {
		name   string
		change func(p *fleetv1.BootcNodePool)
		want   bool
		why    string
	}{
		{"every node on the target of the current spec", func(*fleetv1.BootcNodePool) {}, true, "all 3 node(s) run"},
		{"spec.image pinned to the target's digest", func(p *fleetv1.BootcNodePool) { p.Spec.Image = target }, true, ""},
		{"a new spec the coordinator has not looked at", func(p *fleetv1.BootcNodePool) { p.Generation = 5 }, false, "has not looked at generation 5"},
		{"no target yet", func(p *fleetv1.BootcNodePool) { p.Status.TargetImage = "" }, false, "has not resolved"},
		{"spec.image in another repository", func(p *fleetv1.BootcNodePool) { p.Spec.Image = "registry.example/other:v2" }, false, "is not a resolution of spec.image"},
		{"spec.image pinned to another digest", func(p *fleetv1.BootcNodePool) { p.Spec.Image = repo + "@" + oldDg }, false, "is not a resolution of spec.image"},
		{"spec.image does not resolve: the target is the last one", func(p *fleetv1.BootcNodePool) {
			p.Status.Conditions = append(p.Status.Conditions, cond(fleetv1.PoolDegraded, metav1.ConditionTrue, fleetv1.ReasonResolveFailed, "cannot resolve"))
		}, false, "does not resolve"},
		{"UpToDate of an older generation", func(p *fleetv1.BootcNodePool) { p.Status.Conditions = []metav1.Condition{upToDateCond(3)} }, false, "of generation 3, not 4"},
		{"UpToDate False", func(p *fleetv1.BootcNodePool) {
			p.Status.Conditions = []metav1.Condition{cond(fleetv1.PoolUpToDate, metav1.ConditionFalse, fleetv1.ReasonRollingOut, "2 of 3")}
			p.Status.Conditions[0].ObservedGeneration = 4
		}, false, "RollingOut: 2 of 3"},
		{"no UpToDate condition", func(p *fleetv1.BootcNodePool) { p.Status.Conditions = nil }, false, "no UpToDate condition"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := good()
			c.change(p)
			got, why := upToDate(p)
			if got != c.want || !strings.Contains(why, c.why) {
				t.Errorf("upToDate = %t, %q; want %t, containing %q", got, why, c.want, c.why)
			}
		})
	}
}

// TestShowOnATerminalRedrawsInPlace: on a terminal each report replaces the
// last (cursor home, screen cleared) under a line naming the command and
// the time; in a pipe reports follow one another.
func TestShowOnATerminalRedrawsInPlace(t *testing.T) {
	var out bytes.Buffer
	c := &cli{o: Options{Out: &out}}
	rep := &StatusReport{Time: metav1.Time{Time: now}}
	c.show(true, true, "web", FormatTable, rep, []byte("TABLE\n"))
	if want := "\x1b[H\x1b[2Jkubectl bootc-fleet status web --watch   2026-12-01T12:00:00Z   (Ctrl-C to stop)\n\nTABLE\n"; out.String() != want {
		t.Errorf("terminal frame %q, want %q", out.String(), want)
	}
	out.Reset()
	c.show(false, true, "", FormatTable, rep, []byte("ONE\n"))
	c.show(false, false, "", FormatTable, rep, []byte("TWO\n"))
	c.show(false, false, "", FormatYAML, rep, []byte("a: 1\n"))
	if want := "ONE\n\nTWO\n---\na: 1\n"; out.String() != want {
		t.Errorf("pipe output %q, want %q", out.String(), want)
	}
}
