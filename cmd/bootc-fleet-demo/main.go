// Command demo is `make demo`: on a machine with no cluster it starts a
// local control plane (kube-apiserver + etcd), the real
// bootc-fleet-coordinator and simulated nodes each running the real
// bootc-fleet-agent binary, rolls an image out across them, changes the
// image mid-rollout, then publishes a bad image the canary catches and is
// rolled back from, then a good one, and shows it all live (story.go). At
// the end it checks the invariants I1-I6 of docs/design.md over everything
// that happened, and what the bad image was allowed to do.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/bootc-fleet/bootc-fleet/internal/controlplane"
	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/kubectl"
	"github.com/bootc-fleet/bootc-fleet/internal/sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1 // invariants broken, or no convergence in time
	exitUsage       = 2
	exitInterrupted = 130
)

type config struct {
	nodes          int
	maxUnavailable int
	maxStaging     int
	timeout        time.Duration
	healthTimeout  time.Duration
	soak           time.Duration
	dir            string
	plain          bool
	hold           bool
	bootTime       time.Duration
	stageTime      time.Duration
	stale          time.Duration
	every          time.Duration // plain snapshots
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	c := config{}
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.nodes, "nodes", 8, "simulated nodes, each running the real agent binary")
	fs.IntVar(&c.maxUnavailable, "max-unavailable", 2, "the pool's rollout.maxUnavailable")
	fs.IntVar(&c.maxStaging, "max-staging", 3, "the pool's rollout.maxStaging")
	fs.DurationVar(&c.timeout, "timeout", 3*time.Minute, "fail when an act (the first rollout, the bad image, the good image) is not done this long after it began")
	fs.DurationVar(&c.healthTimeout, "health-timeout", 30*time.Second, "the pool's health.timeout: how long the canary on the bad image fails its host check before it is rolled back (30s to 24h)")
	fs.DurationVar(&c.soak, "canary-soak", 3*time.Second, "the pool's rollout.canary.soak")
	fs.StringVar(&c.dir, "dir", filepath.Join(controlplane.RepoRoot(), "bin", "demo"), "where the kubeconfig, binaries, node state and logs go")
	fs.BoolVar(&c.plain, "plain", false, "print periodic snapshots instead of redrawing a table (default when stdout is not a terminal)")
	fs.BoolVar(&c.hold, "hold", false, "after the summary, keep the cluster running until Ctrl-C (for kubectl)")
	fs.DurationVar(&c.bootTime, "boot-time", 500*time.Millisecond, "how long a simulated reboot keeps a node down")
	fs.DurationVar(&c.stageTime, "stage-time", 1500*time.Millisecond, "how long staging (bootc switch --download-only) takes")
	fs.DurationVar(&c.stale, "stale", time.Second, "how long bootc status still shows the previous boot after a reboot")
	fs.DurationVar(&c.every, "snapshot-every", 5*time.Second, "interval of plain snapshots")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.nodes < 2 || c.nodes > 50 {
		return c, fmt.Errorf("-nodes %d: want 2..50", c.nodes)
	}
	if c.maxUnavailable < 1 || c.maxStaging < 1 {
		return c, errors.New("-max-unavailable and -max-staging must be at least 1")
	}
	if c.healthTimeout < 30*time.Second || c.healthTimeout > 24*time.Hour {
		return c, fmt.Errorf("-health-timeout %s: want 30s to 24h, as the pool's schema takes", c.healthTimeout)
	}
	if c.soak < 0 || c.soak > 168*time.Hour {
		return c, fmt.Errorf("-canary-soak %s: want 0s to 168h, as the pool's schema takes", c.soak)
	}
	return c, nil
}

// run is the whole demo; it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return exitUsage
	}
	// Library logs would tear the live table; the programs' own logs go
	// to files under -dir.
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	scr := newScreen(stdout, !cfg.plain && isTerminal(stdout))
	d := &demo{cfg: cfg, scr: scr, start: time.Now()}
	code := d.run(ctx)
	if ctx.Err() != nil && code != exitOK {
		scr.logf("interrupted; everything started was stopped")
		return exitInterrupted
	}
	return code
}

type demo struct {
	cfg   config
	scr   *screen
	start time.Time
}

func (d *demo) run(ctx context.Context) int {
	cfg := d.cfg
	if ok, why := controlplane.Available(); !ok {
		d.scr.logf("cannot start the local control plane: %s", why)
		return exitFailed
	}
	dir, err := filepath.Abs(cfg.dir)
	if err != nil {
		d.scr.logf("%v", err)
		return exitFailed
	}
	runDir := filepath.Join(dir, "run")
	if err := emptyDir(runDir); err != nil {
		d.scr.logf("%v", err)
		return exitFailed
	}

	d.scr.logf("bootc-fleet demo: %d nodes, maxUnavailable %d, maxStaging %d", cfg.nodes, cfg.maxUnavailable, cfg.maxStaging)
	// The build and the control plane start side by side.
	d.step("building bootc-fleet-agent, bootc-fleet-coordinator and test-bootc into %s", filepath.Join(dir, "bin"))
	type built struct {
		bins sim.ProcBinaries
		err  error
	}
	buildDone := make(chan built, 1)
	go func() {
		b, err := sim.BuildProcBinaries(ctx, filepath.Join(dir, "bin"))
		buildDone <- built{b, err}
	}()
	d.step("starting the local control plane: kube-apiserver and etcd (KUBEBUILDER_ASSETS=%s)", os.Getenv("KUBEBUILDER_ASSETS"))
	env, envErr := controlplane.Start()
	if envErr == nil {
		defer env.Stop()
	}
	b := <-buildDone
	if err := errors.Join(envErr, b.err); err != nil {
		d.scr.logf("%v", err)
		return exitFailed
	}
	bins := b.bins
	d.step("binaries built")
	kubeconfig, err := writeAdminKubeconfig(env, dir)
	if err != nil {
		d.scr.logf("writing the admin kubeconfig: %v", err)
		return exitFailed
	}
	d.step("API server up. While the demo runs, in another terminal:")
	d.scr.logf("    export KUBECONFIG=%s; %s get bnp,bn,nodes", kubeconfig, kubectlPath())
	if ctx.Err() != nil {
		return exitInterrupted
	}

	d.step("starting %d nodes (agent process, private dbus-daemon with fake logind, notify socket, test bootc each) and the coordinator process", cfg.nodes)
	f, err := sim.StartProcFleet(ctx, sim.ProcOptions{
		Env: env, Bin: bins, Dir: runDir, Nodes: cfg.nodes, Pool: "demo",
		BootTime: cfg.bootTime, StaleAfterReboot: cfg.stale, StageTime: cfg.stageTime, Mutate: d.poolGate,
	})
	if err != nil {
		d.scr.logf("%v", err)
		return exitFailed
	}
	defer f.Close()
	d.scr.logf("    logs: %s/coordinator.log, %s/<node>/agent.log", runDir, runDir)
	return d.rollout(ctx, f)
}

// emptyDir removes dir and creates it again, empty.
func emptyDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("clearing %s: %w", dir, err)
	}
	return os.MkdirAll(dir, 0o755)
}

// kubectlPath is the kubectl beside the API server's binaries, if there is
// one, else kubectl from PATH.
func kubectlPath() string {
	if a := os.Getenv("KUBEBUILDER_ASSETS"); a != "" {
		if _, err := os.Stat(filepath.Join(a, "kubectl")); err == nil {
			return filepath.Join(a, "kubectl")
		}
	}
	return "kubectl"
}

// step logs a line with the elapsed time.
func (d *demo) step(format string, args ...any) {
	d.scr.logf("[%6.1fs] %s", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

// writeAdminKubeconfig writes a cluster-admin kubeconfig at dir/kubeconfig.
func writeAdminKubeconfig(env *controlplane.Env, dir string) (string, error) {
	p, err := env.AdminKubeconfig(dir)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(dir, "kubeconfig")
	if err := os.Rename(p, dst); err != nil {
		return "", err
	}
	return dst, nil
}

// rollout plays the three acts (story.go), then checks the invariants
// and prints the summary.
func (d *demo) rollout(ctx context.Context, f *sim.ProcFleet) int {
	st := &story{}
	var err error
	for _, act := range []func(context.Context, *sim.ProcFleet, *story) error{d.actRollout, d.actBadImage, d.actGoodImage} {
		if err = act(ctx, f, st); err != nil {
			break
		}
	}
	if ctx.Err() != nil {
		return exitInterrupted
	}
	if err != nil {
		d.step("%v", err)
	}
	ok := d.summary(ctx, f, st)
	if d.cfg.hold && ctx.Err() == nil {
		d.scr.logf("holding the cluster for kubectl; Ctrl-C to stop")
		<-ctx.Done()
	}
	if !ok || err != nil {
		return exitFailed
	}
	return exitOK
}

// show redraws the table, or on a plain screen prints a snapshot every
// cfg.every.
func (d *demo) show(s snap, lastPlain *time.Time) {
	if d.scr.tty {
		d.scr.table(render(s))
	} else if time.Since(*lastPlain) >= d.cfg.every {
		*lastPlain = time.Now()
		d.scr.snapshot(render(s))
	}
}

// showMidRollout runs the plugin's status and explain once a node waits for
// a reboot slot while every one is held, and says whether it did.
func (d *demo) showMidRollout(ctx context.Context, f *sim.ProcFleet, s snap) bool {
	node, ok := waitingForReboot(s)
	if !ok {
		return false
	}
	d.step("mid-rollout, as an operator would ask (in-process, against this API server):")
	d.plugin(ctx, f, "status", f.Pool)
	d.plugin(ctx, f, "explain", node)
	return true
}

// summary checks the invariants and what the bad image did, and prints
// what happened; it reports whether every check held and every act finished.
func (d *demo) summary(ctx context.Context, f *sim.ProcFleet, st *story) bool {
	violations := f.Check(ctx, st.target)
	invErr := f.CheckInvocations()
	evs := f.Log.Events()
	s := summarize(evs)
	images := f.Images()
	var b strings.Builder
	fmt.Fprintf(&b, "\nSummary\n")
	bad := writeActs(&b, images, st, evs, f.Nodes)
	fmt.Fprintf(&b, "  %-10s %8s %14s %13s  %s\n", "NODE", "REBOOTS", "REBOOT GRANTS", "STAGE GRANTS", "BOOTED")
	final := f.Final(ctx, st.target)
	for _, n := range f.Nodes {
		fmt.Fprintf(&b, "  %-10s %8d %14d %13d  %s\n", n.Name, s.reboots[n.Name], s.rebootGrants[n.Name], s.stageGrants[n.Name],
			labelOf(images, final.Nodes[n.Name].Booted))
	}
	fmt.Fprintf(&b, "  grants issued: %d stage, %d reboot\n", s.totalStage, s.totalReboot)
	fmt.Fprintf(&b, "  max concurrent disruption: %d nodes cordoned at once (maxUnavailable %d); max staging at once: %d (maxStaging %d)\n",
		s.maxCordoned, f.Budget().MaxUnavailable, s.maxStaging, f.Budget().MaxStaging)
	if bt := bootTimes(f); bt != "" {
		fmt.Fprintf(&b, "  %s\n", bt)
	}
	held := len(violations) == 0 && invErr == nil
	if held {
		fmt.Fprintf(&b, "  invariants I1-I6: held (%d events checked)\n", len(evs))
	} else {
		fmt.Fprintf(&b, "  invariants I1-I6: %d VIOLATED\n", len(violations))
		for _, v := range violations {
			fmt.Fprintf(&b, "  %s\n", strings.ReplaceAll(v.String(), "\n", "\n  "))
		}
		if invErr != nil {
			fmt.Fprintf(&b, "  event log disagrees with the test bootc: %v\n", invErr)
		}
	}
	writeBadImageCheck(&b, images, st, bad)
	fmt.Fprintf(&b, "  wall time: %s", time.Since(d.start).Round(100*time.Millisecond))
	d.scr.logf("%s", b.String())
	d.plugin(ctx, f, "status")
	return held && st.doneAt > 0 && len(bad.problems) == 0
}

// plugin runs `kubectl bootc-fleet ARGS` in-process against the demo's API
// server and prints what it printed.
func (d *demo) plugin(ctx context.Context, f *sim.ProcFleet, args ...string) {
	var out strings.Builder
	kubectl.Run(ctx, kubectl.Options{Out: &out, ErrOut: &out, Client: f.Env.Client, Version: "demo"}, args)
	d.scr.logf("$ kubectl bootc-fleet %s\n%s", strings.Join(args, " "), strings.TrimRight(out.String(), "\n"))
}

// waitingForReboot finds a node waiting in the queue for a reboot slot
// while every reboot slot is held: the moment the plugin has most to say.
func waitingForReboot(s snap) (string, bool) {
	held := 0
	for _, n := range s.nodes {
		for _, sl := range s.why[n.name].Slots {
			if sl.Kind == "reboot" {
				held++
			}
		}
	}
	if held < s.budget.MaxUnavailable {
		return "", false
	}
	for _, n := range s.nodes {
		if w := s.why[n.name]; w.Queue != nil && w.Queue.Kind == "reboot" && w.Queue.Position > 1 {
			return n.name, true
		}
	}
	return "", false
}

// bootTimes describes how long nodes were away in their reboots.
func bootTimes(f *sim.ProcFleet) string {
	var sum, worst time.Duration
	n := 0
	for _, node := range f.Nodes {
		for _, r := range node.RebootTimings() {
			if r.AgentReady.IsZero() {
				continue
			}
			d := r.AgentReady.Sub(r.Requested)
			sum += d
			worst = max(worst, d)
			n++
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("reboot requested -> agent READY=1 in the new boot: avg %s, max %s over %d reboots",
		(sum / time.Duration(n)).Round(10*time.Millisecond), worst.Round(10*time.Millisecond), n)
}
