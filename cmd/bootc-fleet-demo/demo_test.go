package main

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/fakedbus"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/invariant"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
)

// TestDemoRuns runs what `make demo` runs, smaller and without a terminal,
// and checks that it converged on v2.1, caught the bad v3 on the canary,
// rolled it back and quarantined v3 with no other node rebooted, converged
// on v4, and found the invariants held: the bad image through the real
// agent and coordinator binaries.
func TestDemoRuns(t *testing.T) {
	envtest.SkipIfUnavailable(t)
	if _, err := os.Stat(fakedbus.DaemonPath); err != nil && os.Getenv("BOOTC_FLEET_REQUIRE_DBUS") != "1" {
		t.Skipf("skipping: %v", fakedbus.ErrNoDaemon)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out := &syncBuffer{}
	code := run(ctx, []string{"-nodes=4", "-plain", "-dir=" + t.TempDir(), "-stage-time=300ms", "-timeout=3m"}, out, out)
	text := out.String()
	if code != exitOK {
		t.Fatalf("demo exited %d:\n%s", code, text)
	}
	for _, want := range []string{"converged: every node booted v2.1", "converged: every node booted v4", "invariants I1-I6: held",
		"export KUBECONFIG=", "why (kubectl bootc-fleet status demo):", "$ kubectl bootc-fleet status\nNAME ",
		"failed its health gate on v3 (HostUnitFailed", "the pool says Degraded=True, reason ImageFailedHealthCheck",
		"$ kubectl bootc-fleet explain node-", "3 other nodes untouched (none rebooted", "bad image: held ("} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	if i := strings.Index(text, "Summary"); i >= 0 {
		t.Logf("%s", text[i:])
	}
}

func TestDemoRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"too few nodes", []string{"-nodes=1"}},
		{"zero maxUnavailable", []string{"-max-unavailable=0"}},
		{"stray argument", []string{"extra"}},
		{"health timeout under the schema's 30s", []string{"-health-timeout=10s"}},
		{"negative soak", []string{"-canary-soak=-1s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := &syncBuffer{}
			if code := run(context.Background(), tt.args, out, out); code != exitUsage {
				t.Errorf("exit %d, want %d; output %q", code, exitUsage, out.String())
			}
		})
	}
}

func TestSummarizeCountsGrantsAndConcurrency(t *testing.T) {
	lv := func(name string, slot lease.Kind, holder, image, boot string) invariant.Event {
		return invariant.Event{Kind: invariant.LeaseVersion, Lease: name, Slot: slot, Holder: holder, Image: image, BootID: boot}
	}
	evs := []invariant.Event{
		lv("p-stage-0", lease.KindStage, "a", "i2", "b1"),
		lv("p-stage-0", lease.KindStage, "a", "i2", "b1"), // a renew
		{Kind: invariant.StageStart, Node: "a"},
		lv("p-stage-1", lease.KindStage, "b", "i2", "b2"),
		{Kind: invariant.StageStart, Node: "b"},
		{Kind: invariant.StageEnd, Node: "a"},
		lv("p-stage-0", lease.KindStage, "", "", ""),
		lv("p-reboot-0", lease.KindReboot, "a", "i2", "b1"),
		{Kind: invariant.Cordon, Node: "a"},
		lv("p-reboot-1", lease.KindReboot, "b", "i2", "b2"),
		{Kind: invariant.Cordon, Node: "b"},
		{Kind: invariant.Reboot, Node: "a"},
		{Kind: invariant.Uncordon, Node: "a"},
		lv("p-reboot-0", lease.KindReboot, "a", "i3", "b9"), // same holder, new image and boot: a new grant
		{Kind: invariant.Cordon, Node: "a"},
		{Kind: invariant.Reboot, Node: "a"},
	}
	s := summarize(evs)
	if s.totalStage != 2 || s.totalReboot != 3 {
		t.Errorf("grants: %d stage, %d reboot; want 2 and 3", s.totalStage, s.totalReboot)
	}
	if s.rebootGrants["a"] != 2 || s.reboots["a"] != 2 || s.reboots["b"] != 0 {
		t.Errorf("node a: %d reboot grants, %d reboots; node b %d reboots", s.rebootGrants["a"], s.reboots["a"], s.reboots["b"])
	}
	if s.maxCordoned != 2 || s.maxStaging != 2 {
		t.Errorf("max cordoned %d, max staging %d; want 2 and 2", s.maxCordoned, s.maxStaging)
	}
}

func TestCheckBadImageWantsTwoRebootsOfTheCanaryAlone(t *testing.T) {
	const bad, prev = "r/os@sha256:bad", "r/os@sha256:prev"
	lv := func(rv int64, holder, image, boot string) invariant.Event {
		return invariant.Event{Kind: invariant.LeaseVersion, Lease: "p-reboot-0", RV: rv, Slot: lease.KindReboot, Holder: holder, Image: image, BootID: boot}
	}
	reboot := func(node, image string, rv int64) invariant.Event {
		return invariant.Event{Kind: invariant.Reboot, Node: node, Image: image, GrantLease: "p-reboot-0", GrantRV: rv}
	}
	boot := func(node, image string) invariant.Event {
		return invariant.Event{Kind: invariant.Boot, Node: node, Image: image}
	}
	good := []invariant.Event{
		lv(10, "a", bad, "b1"), reboot("a", bad, 10), boot("a", bad),
		{Kind: invariant.StageStart, Node: "b", Image: bad},
		lv(11, "a", prev, "b2"), reboot("a", prev, 11), boot("a", prev),
	}
	tests := []struct {
		name     string
		evs      []invariant.Event
		problems int
	}{
		{"update, then rollback, under two grants", good, 0},
		{"a rollback under the update's grant", append(good[:5:5], reboot("a", prev, 10), boot("a", prev)), 1},
		{"no rollback", good[:4], 1},
		{"another node rebooted into it", append(append([]invariant.Event(nil), good...), lv(12, "b", bad, "b3"), reboot("b", bad, 12), boot("b", bad)), 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range tt.evs {
				tt.evs[i].Seq = int64(i + 1)
			}
			c := checkBadImage(tt.evs, 0, int64(len(tt.evs)), "a", bad, prev, []string{"a", "b", "c"})
			if len(c.problems) != tt.problems {
				t.Errorf("problems %q, want %d", c.problems, tt.problems)
			}
			if tt.problems == 0 && (c.grants != 2 || !slices.Equal(c.untouched, []string{"b", "c"}) || !slices.Equal(c.staged, []string{"b"})) {
				t.Errorf("grants %d, untouched %v, staged %v", c.grants, c.untouched, c.staged)
			}
		})
	}
}

func TestLabelOfNamesPushedTags(t *testing.T) {
	images := map[string]string{"v2": "r:5000/os@sha256:7c3afdff0123"}
	tests := []struct{ name, in, want string }{
		{"pushed image", "r:5000/os@sha256:7c3afdff0123", "v2 7c3afdff"},
		{"unknown image", "r:5000/os@sha256:abcdef0123456", "? abcdef01"},
		{"nothing", "", "-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := labelOf(images, tt.in); got != tt.want {
				t.Errorf("labelOf(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
