package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/controller"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
)

const (
	imgOld    = "registry.example/fleet/os@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	imgTarget = "registry.example/fleet/os@sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	code := m.Run()
	CleanupBuilds()
	os.Exit(code)
}

// The agent as systemd runs it: readiness, status text, watchdog, and a
// reboot that nobody granted. No coordinator: the test writes the
// BootcNode spec a coordinator would, and grants nothing.
func TestAgentUnderSystemd(t *testing.T) {
	SkipIfUnavailable(t)
	// The bound starts once the nodes exist: the first test on a fresh
	// machine also builds the root filesystem (debootstrap, minutes).
	f := NewFleet(t, Options{Nodes: 1, Prefix: "e2e-infra", Booted: imgOld, Pool: "infra"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n := f.Nodes[0]
	bn := &fleetv1.BootcNode{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name},
		Spec:       fleetv1.BootcNodeSpec{Pool: "infra", DesiredImage: imgTarget},
	}
	if err := f.Env.Client.Create(ctx, bn); err != nil {
		t.Fatal(err)
	}
	// The target is already downloaded, locked, as a stage grant would have
	// left it; no reboot grant exists.
	if err := n.Bootc.Update(func(m *testbootc.Machine) error { return m.Switch(imgTarget) }); err != nil {
		t.Fatal(err)
	}
	f.Boot()

	// 1. Readiness: active (running) only after READY=1.
	boot1 := awaitAgentActive(ctx, t, n, 1)
	tr := boot1.Transitions
	t.Logf("boot 1: %s, agent transitions: %s", boot1.BootID, transitions(tr))
	first := slices.IndexFunc(tr, func(x Transition) bool { return x.ActiveState == "active" })
	if tr[0].ActiveState != "inactive" {
		t.Errorf("the unit was %s/%s before the harness opened the gate; transitions were not observed from the start", tr[0].ActiveState, tr[0].Sub)
	}
	if !slices.ContainsFunc(tr[:first], func(x Transition) bool { return x.ActiveState == "activating" && x.Sub == "start" }) {
		t.Errorf("the unit became active without passing activating/start (waiting for READY=1): %s", transitions(tr))
	}
	if tr[first].Sub != "running" || tr[first].StatusText == "" {
		t.Errorf("first active state %s/%s with StatusText %q; want running with the agent's status text", tr[first].ActiveState, tr[first].Sub, tr[first].StatusText)
	}
	for i, bl := range []BootLog{boot1} {
		checkReadyStatus(t, i+1, bl)
	}
	b := n.Current()
	props, err := b.Show(ctx, AgentUnit, "Type", "ActiveState", "SubState", "StatusText", "NRestarts", "MainPID", "WatchdogUSec")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("systemctl show: %v", props)
	if props["Type"] != "notify" {
		t.Errorf("Type=%s, want notify", props["Type"])
	}
	if want := fmt.Sprint(WatchdogSec * 1_000_000); props["WatchdogUSec"] != want && props["WatchdogUSec"] != fmt.Sprintf("%ds", WatchdogSec) {
		t.Errorf("WatchdogUSec=%s; the e2e drop-in did not apply", props["WatchdogUSec"])
	}

	// 2. The agent reports, in this boot, that the target is staged.
	st := awaitNodeStatus(ctx, t, f, n, "Staged in boot 1", func(s fleetv1.BootcNodeStatus) bool {
		return s.BootID == boot1.BootID && s.Phase == fleetv1.PhaseStaged
	})
	if err := n.Await(ctx, "StatusText naming the phase", func() (bool, error) {
		p, err := b.Show(ctx, AgentUnit, "StatusText")
		return err == nil && strings.Contains(strings.ToLower(p["StatusText"]), "staged"), nil
	}); err != nil {
		p, _ := b.Show(ctx, AgentUnit, "StatusText")
		t.Errorf("%v (StatusText=%q, phase %s)", err, p["StatusText"], st.Phase)
	}

	// 3. Watchdog: a stopped agent stops pinging; systemd kills and restarts it.
	if _, err := b.Exec(ctx, "systemctl", "kill", "--kill-who=main", "--signal=SIGSTOP", AgentUnit); err != nil {
		t.Fatal(err)
	}
	if err := n.Await(ctx, "a restart after the watchdog fired", func() (bool, error) {
		p, err := b.Show(ctx, AgentUnit, "NRestarts", "ActiveState", "SubState")
		return err == nil && p["NRestarts"] != props["NRestarts"] && p["ActiveState"] == "active" && p["SubState"] == "running", nil
	}); err != nil {
		t.Fatal(err)
	}
	journal, _ := b.Exec(ctx, "journalctl", "-b", "-u", AgentUnit, "--no-pager")
	if !strings.Contains(journal, "Watchdog timeout") || !strings.Contains(journal, "result 'watchdog'") {
		t.Errorf("the journal does not show a watchdog kill:\n%s", journal)
	}
	after, _ := b.Show(ctx, AgentUnit, "NRestarts", "MainPID")
	if after["MainPID"] == props["MainPID"] {
		t.Errorf("MainPID %s unchanged after the watchdog restart", after["MainPID"])
	}
	t.Logf("watchdog: NRestarts %s -> %s, MainPID %s -> %s", props["NRestarts"], after["NRestarts"], props["MainPID"], after["MainPID"])

	// 4. A reboot nobody granted (a person runs `systemctl reboot`).
	invBefore, _ := n.Bootc.Invocations()
	if err := n.Reboot(ctx); err != nil {
		t.Fatal(err)
	}
	boot2 := awaitAgentActive(ctx, t, n, 2)
	t.Logf("boot 2: %s, agent transitions: %s", boot2.BootID, transitions(boot2.Transitions))
	if boot2.BootID == boot1.BootID {
		t.Fatalf("the reboot kept boot ID %s", boot1.BootID)
	}
	checkReadyStatus(t, 2, boot2)
	// bootc discards a download-only staged deployment at a reboot: the
	// agent reports it has nothing staged and waits for a stage grant.
	st = awaitNodeStatus(ctx, t, f, n, "Waiting for a stage grant in boot 2", func(s fleetv1.BootcNodeStatus) bool {
		return s.BootID == boot2.BootID && s.Phase == fleetv1.PhaseWaiting
	})
	m, err := n.Bootc.Machine()
	if err != nil {
		t.Fatal(err)
	}
	ms := m.State()
	if ms.Booted == nil || ms.Booted.Image != imgOld {
		t.Errorf("after an ungranted reboot the node booted %+v, want %s", ms.Booted, imgOld)
	}
	if ms.Staged != nil {
		t.Errorf("after an ungranted reboot staged = %+v, want it discarded", ms.Staged)
	}
	if st.Phase != fleetv1.PhaseWaiting || st.Reason != fleetv1.ReasonWaitingForStageGrant || st.Booted == nil || !strings.HasSuffix(imgOld, st.Booted.Digest) || st.Staged != nil {
		t.Errorf("after the reboot the agent reports %s/%s (%s) booted %+v staged %+v; want Waiting for a stage grant on the old image, nothing staged",
			st.Phase, st.Reason, st.Message, st.Booted, st.Staged)
	}
	invAfter, _ := n.Bootc.Invocations()
	for _, inv := range invAfter[len(invBefore):] {
		if len(inv.Args) > 0 && (inv.Args[0] == "switch" || inv.Args[0] == "upgrade") && !slices.Contains(inv.Args, "--help") {
			t.Errorf("the agent ran bootc %s without a grant", strings.Join(inv.Args, " "))
		}
	}
	// 5. A stage grant in the new boot (as the coordinator gives one): the
	// lost stage is staged again, locked.
	k := &testcoord.Coordinator{C: f.Env.Client, Pool: "infra"}
	if _, err := k.Grant(ctx, lease.KindStage, 0, n.Name, imgTarget, boot2.BootID, ""); err != nil {
		t.Fatal(err)
	}
	awaitNodeStatus(ctx, t, f, n, "Staged again in boot 2", func(s fleetv1.BootcNodeStatus) bool {
		return s.BootID == boot2.BootID && s.Phase == fleetv1.PhaseStaged
	})
	if m, err = n.Bootc.Machine(); err != nil {
		t.Fatal(err)
	}
	if s := m.State().Staged; s == nil || s.Image != imgTarget || !s.DownloadOnly {
		t.Errorf("after the new stage grant staged = %+v, want %s download-only", s, imgTarget)
	}
	ms = m.State()
	boots := n.Boots()
	if !boots[0].HarnessRebooted || boots[0].Exit != exitReboot {
		t.Errorf("boot 1 ended with %d (harness reboot %v), want %d from the harness's reboot", boots[0].Exit, boots[0].HarnessRebooted, exitReboot)
	}
	if ms.Reboots != 1 {
		t.Errorf("test bootc played %d reboots, want 1", ms.Reboots)
	}
	for _, bl := range boots {
		t.Logf("%s boot %d: container up in %s, agent active %s later", n.Name, bl.N, bl.Up.Sub(bl.Started).Round(time.Millisecond), bl.AgentFirstActive.Sub(bl.Up).Round(time.Millisecond))
	}
}

// checkReadyStatus: the status text the agent had when systemd saw READY=1
// must describe the node as it is. Its BootcNode asked for imgTarget before
// the node booted, so "no desired image" means the agent decided (and
// reported) before it had read its BootcNode.
func checkReadyStatus(t *testing.T, n int, bl BootLog) {
	t.Helper()
	for _, x := range bl.Transitions {
		if x.ActiveState == "active" {
			if strings.Contains(x.StatusText, "no desired image") {
				t.Errorf("boot %d: the agent became ready with status %q although its BootcNode has desiredImage %s", n, x.StatusText, imgTarget)
			}
			return
		}
	}
}

func transitions(tr []Transition) string {
	var parts []string
	for _, x := range tr {
		s := x.ActiveState + "/" + x.Sub
		if x.StatusText != "" {
			s += fmt.Sprintf(" (%q)", x.StatusText)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " -> ")
}

// awaitAgentActive waits until boot number n of the node is up and the
// agent unit reached active in it.
func awaitAgentActive(ctx context.Context, t *testing.T, nd *Node, n int) BootLog {
	t.Helper()
	var got BootLog
	err := nd.Await(ctx, fmt.Sprintf("%s active in boot %d", AgentUnit, n), func() (bool, error) {
		bs := nd.Boots()
		if len(bs) < n || bs[n-1].AgentFirstActive.IsZero() {
			return false, nil
		}
		got = bs[n-1]
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// awaitNodeStatus waits for the node's BootcNode status to satisfy cond.
func awaitNodeStatus(ctx context.Context, t *testing.T, f *Fleet, n *Node, what string, cond func(fleetv1.BootcNodeStatus) bool) fleetv1.BootcNodeStatus {
	t.Helper()
	var bn fleetv1.BootcNode
	err := n.Await(ctx, what, func() (bool, error) {
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &bn); err != nil {
			return false, nil
		}
		return cond(bn.Status), nil
	})
	if err != nil {
		t.Fatalf("%v; last status: %+v", err, bn.Status)
	}
	return bn.Status
}

// A full rollout over three real-systemd nodes: the coordinator runs on the
// host, every reboot is the agent's own logind call inside its container.
func TestRolloutUnderSystemd(t *testing.T) {
	SkipIfUnavailable(t)
	const pool = "e2e-roll"
	f := NewFleet(t, Options{Nodes: 3, Prefix: "e2e-roll", Booted: imgOld, Pool: pool})
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	f.Boot()
	for _, n := range f.Nodes {
		awaitAgentActive(ctx, t, n, 1)
	}

	runRollout(ctx, t, f, "e2e", pool, 3, "")

	for _, n := range f.Nodes {
		awaitNodeStatus(ctx, t, f, n, "booted on the target in a new boot", func(s fleetv1.BootcNodeStatus) bool {
			b := n.Current()
			return b != nil && s.BootID == b.BootID && s.Booted != nil && strings.HasSuffix(imgTarget, s.Booted.Digest) && s.Phase == fleetv1.PhaseIdle
		})
	}
	if err := f.Nodes[0].Await(ctx, "the pool up to date, nodes uncordoned", func() (bool, error) {
		var got fleetv1.BootcNodePool
		if err := f.Env.Client.Get(ctx, client.ObjectKey{Name: pool}, &got); err != nil {
			return false, nil
		}
		if got.Status.Updated != 3 {
			return false, nil
		}
		return allSchedulable(ctx, f), nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("rollout of 3 nodes done %s after the test started", time.Since(start).Round(time.Millisecond))

	for _, n := range f.Nodes {
		boots := n.Boots()
		m, err := n.Bootc.Machine()
		if err != nil {
			t.Fatal(err)
		}
		st := m.State()
		if len(boots) != 2 || st.Reboots != 1 {
			t.Errorf("%s: %d boots, %d reboots played; want exactly one reboot", n.Name, len(boots), st.Reboots)
		}
		if boots[0].Exit != exitReboot || boots[0].HarnessRebooted {
			t.Errorf("%s: first boot ended with %d (harness reboot %v); want the agent's own reboot (%d)", n.Name, boots[0].Exit, boots[0].HarnessRebooted, exitReboot)
		}
		if st.Booted == nil || st.Booted.Image != imgTarget {
			t.Errorf("%s: booted %+v, want %s", n.Name, st.Booted, imgTarget)
		}
		for _, bl := range boots {
			t.Logf("%s boot %d (%s): container up in %s, agent active %s after that", n.Name, bl.N, bl.BootID,
				bl.Up.Sub(bl.Started).Round(time.Millisecond), bl.AgentFirstActive.Sub(bl.Up).Round(time.Millisecond))
		}
		if len(boots) >= 2 {
			t.Logf("%s: down for %s (reboot asked inside -> nspawn exit 133 -> next boot running)", n.Name, boots[1].Up.Sub(boots[0].Down).Round(time.Millisecond))
		}
	}
	if most, at := maxDisrupted(f.Events.snapshot()); most > 1 {
		t.Errorf("%d nodes were cordoned or down at once (maxUnavailable 1), at %s", most, at)
	} else {
		t.Logf("at most %d node cordoned or down at any time", most)
	}
}

// maxDisrupted replays the harness's events: a node is disrupted while it is
// cordoned or its container is down.
func maxDisrupted(evs []event) (int, string) {
	slices.SortStableFunc(evs, func(a, b event) int { return a.At.Compare(b.At) })
	cordoned, down := map[string]bool{}, map[string]bool{}
	most, at := 0, ""
	for _, e := range evs {
		switch e.What {
		case evCordon:
			cordoned[e.Node] = true
		case evUncordon:
			cordoned[e.Node] = false
		case evDown:
			down[e.Node] = true
		case evUp:
			down[e.Node] = false
		}
		var now []string
		for _, n := range uniq(cordoned, down) {
			if cordoned[n] || down[n] {
				now = append(now, n)
			}
		}
		if len(now) > most {
			most, at = len(now), fmt.Sprintf("%s %s %s: %v", e.At.Format(time.StampMilli), e.Node, e.What, now)
		}
	}
	return most, at
}

func uniq(ms ...map[string]bool) []string {
	var out []string
	for _, m := range ms {
		for k := range m {
			if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	slices.Sort(out)
	return out
}

// runRollout runs the coordinator (in-process, until the test ends) and
// creates a pool of the nodes labelled pool rolling out imgTarget with
// maxUnavailable 1, changed by mutate.
func runRollout(ctx context.Context, t *testing.T, f *Fleet, coordinator, pool string, maxStaging int32, policy fleetv1.RebootPolicy,
	mutate ...func(*fleetv1.BootcNodePool)) {
	t.Helper()
	c, err := controller.New(f.Env.Config, controller.Options{Name: coordinator, RequeueInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cctx, stopCoordinator := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	t.Cleanup(func() {
		stopCoordinator()
		if err := <-done; err != nil && cctx.Err() == nil {
			t.Errorf("coordinator: %v", err)
		}
	})
	p := &fleetv1.BootcNodePool{
		ObjectMeta: metav1.ObjectMeta{Name: pool},
		Spec: fleetv1.BootcNodePoolSpec{
			NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{NodeLabel: pool}},
			Image:        imgTarget,
			Rollout: fleetv1.RolloutSpec{
				MaxUnavailable: ptr.To(intstr.FromInt32(1)),
				MaxStaging:     ptr.To(intstr.FromInt32(maxStaging)),
			},
			RebootPolicy: policy,
		},
	}
	for _, m := range mutate {
		m(p)
	}
	if err := f.Env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
}

// allSchedulable: no node of the fleet is cordoned (every cordon lifted).
func allSchedulable(ctx context.Context, f *Fleet) bool {
	for _, n := range f.Nodes {
		node, err := f.Kube.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil || node.Spec.Unschedulable {
			return false
		}
	}
	return true
}
