package integration

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/record"
	"github.com/bootc-fleet/bootc-fleet/tests/envtest"
	"github.com/bootc-fleet/bootc-fleet/tests/fakedbus"
	"github.com/bootc-fleet/bootc-fleet/tests/notifysock"
	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
	"github.com/bootc-fleet/bootc-fleet/tests/testcoord"
)

var (
	env      *envtest.Env
	agentBin string
	bootcBin string
	buildDir string
	imgV1    = "quay.io/example/os@sha256:" + strings.Repeat("1", 64)
	imgV2    = "quay.io/example/os@sha256:" + strings.Repeat("2", 64)
	imgV3    = "quay.io/example/os@sha256:" + strings.Repeat("3", 64)
	digestOf = func(img string) string { return img[strings.LastIndexByte(img, '@')+1:] }
)

// TestMain builds the real agent and test-bootc binaries and starts one API
// server for every test.
func TestMain(m *testing.M) {
	os.Exit(func() int {
		if ok, why := envtest.Available(); !ok {
			if os.Getenv("BOOTC_FLEET_REQUIRE_ENVTEST") == "1" {
				fmt.Fprintln(os.Stderr, "API server required:", why)
				return 1
			}
			fmt.Fprintln(os.Stderr, "skipping agent integration tests:", why)
			return 0
		}
		dir, err := os.MkdirTemp("", "agent-it")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		buildDir, agentBin, bootcBin = dir, filepath.Join(dir, "bootc-fleet-agent"), filepath.Join(dir, "test-bootc")
		for bin, pkg := range map[string]string{
			agentBin: "github.com/bootc-fleet/bootc-fleet/cmd/bootc-fleet-agent",
			bootcBin: "github.com/bootc-fleet/bootc-fleet/internal/sim/testbootc/cmd/test-bootc",
		} {
			if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", pkg, err, out)
				return 1
			}
		}
		e, err := envtest.StartShared()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer e.Stop()
		env = e
		root := envtest.RepoRoot()
		if err := envtest.Apply(context.Background(), e.Client,
			filepath.Join(root, "packaging/rbac/agent.yaml"), filepath.Join(root, "packaging/policy/agent-policy.yaml")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}())
}

// node is one simulated host: test-bootc state, a private system bus with
// fake logind and systemd1, a notify socket, and the agent process.
type node struct {
	t      testing.TB
	name   string
	dir    testbootc.Dir
	state  string
	kc     string
	bus    string
	login  *fakedbus.Login1
	sd     *fakedbus.Systemd1
	notify <-chan string
	sock   string
	k      *testcoord.Coordinator
	extra  []string
	poll   string // --poll-interval; default 2s

	mu     sync.Mutex
	cmd    *exec.Cmd
	out    *bytes.Buffer
	exited chan struct{}
}

func newNode(t testing.TB, name string, extraEnv ...string) *node {
	t.Helper()
	base := t.TempDir()
	d, err := testbootc.Init(filepath.Join(base, "bootc"), testbootc.State{Booted: &testbootc.Deployment{Image: imgV1, Digest: digestOf(imgV1)}})
	if err != nil {
		t.Fatal(err)
	}
	// The agent runs as the node, through the packaged RBAC and policies.
	kc, err := env.KubeconfigFor(base, "system:node:"+name, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, name: name, dir: d, state: filepath.Join(base, "state"), kc: kc,
		k: &testcoord.Coordinator{C: env.Client, Pool: "it-" + name}, extra: extraEnv}
	n.bus = fakedbus.StartBus(t)
	n.login = &fakedbus.Login1{}
	n.sd = &fakedbus.Systemd1{}
	if err := n.login.Serve(n.bus); err != nil {
		t.Fatal(err)
	}
	if err := n.sd.Serve(n.bus); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.login.Close(); n.sd.Close() })
	n.sock, n.notify = notifysock.Listen(t)
	if err := n.k.EnsureBootcNode(context.Background(), name, imgV2, ""); err != nil {
		t.Fatal(err)
	}
	return n
}

// start runs the real agent binary.
func (n *node) start() {
	n.t.Helper()
	machine, err := n.dir.Machine()
	if err != nil {
		n.t.Fatal(err)
	}
	cmd := exec.Command(agentBin,
		"--kubeconfig", n.kc,
		"--node-name", n.name,
		"--bootc", bootcBin,
		"--boot-id-file", machine.State().BootIDFile,
		"--state-dir", n.state,
		"--watch-path", filepath.Join(string(n.dir), "state.json"),
		"--poll-interval", cmp.Or(n.poll, "2s"),
	)
	if len(n.extra) == 0 {
		cmd.Args = append(cmd.Args, "--settle-timeout", "1m")
	}
	cmd.Env = append(os.Environ(),
		"DBUS_SYSTEM_BUS_ADDRESS="+n.bus,
		"NOTIFY_SOCKET="+n.sock,
		"WATCHDOG_USEC=2000000",
		testbootc.EnvState+"="+string(n.dir),
	)
	cmd.Env = append(cmd.Env, n.extra...)
	out := &bytes.Buffer{}
	lw := &lockedWriter{mu: &n.mu, w: out}
	cmd.Stdout, cmd.Stderr = lw, lw
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	n.mu.Lock()
	n.cmd, n.out, n.exited = cmd, out, exited
	n.mu.Unlock()
	n.t.Cleanup(func() {
		// SIGTERM lets the agent stop its bootc children before the
		// temporary directories go away.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if n.t.Failed() {
			n.mu.Lock()
			n.t.Logf("agent output:\n%s", out.String())
			n.mu.Unlock()
		}
	})
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// signal sends sig and waits for the agent to exit.
func (n *node) stop(sig syscall.Signal) int {
	n.t.Helper()
	_ = n.cmd.Process.Signal(sig)
	select {
	case <-n.exited:
	case <-time.After(60 * time.Second):
		n.t.Fatalf("agent did not exit on %s", sig)
	}
	return n.cmd.ProcessState.ExitCode()
}

func (n *node) bootID() string {
	m, err := n.dir.Machine()
	if err != nil {
		n.t.Fatal(err)
	}
	return m.BootID()
}

func (n *node) wait(what string, ok func(fleetv1.BootcNodeStatus) bool) fleetv1.BootcNodeStatus {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := n.k.WaitStatus(ctx, n.name, ok)
	if err != nil {
		n.t.Fatalf("%s: %v", what, err)
	}
	return st
}

// logged reports whether one line the agent logged contains every part.
func (n *node) logged(parts ...string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.out != nil && testcoord.HasLine(n.out.String(), parts...)
}

func (n *node) until(what string, ok func() bool) {
	n.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			n.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// switches counts the stages the agent ran on the test bootc (bootc 1.16:
// `switch <image>` followed by `upgrade --download-only`), and fails on any
// other switch command line.
func (n *node) switches() int {
	inv, err := n.dir.Invocations()
	if err != nil {
		n.t.Fatal(err)
	}
	c := 0
	for k, i := range inv {
		if len(i.Args) == 0 || i.Args[0] != "switch" || len(i.Args) == 2 && i.Args[1] == "--help" {
			continue
		}
		c++
		if len(i.Args) != 2 || strings.HasPrefix(i.Args[1], "-") {
			n.t.Fatalf("switch invoked as %q", i.Args)
		}
		if k+1 < len(inv) && !reflect.DeepEqual(inv[k+1].Args, []string{"upgrade", "--download-only"}) && inv[k+1].Args[0] != "status" {
			n.t.Fatalf("switch %q followed by %q, not the lock step", i.Args, inv[k+1].Args)
		}
	}
	return c
}

func (n *node) grant(kind lease.Kind, image string, phase lease.Phase) {
	n.t.Helper()
	if _, err := n.k.Grant(context.Background(), kind, 0, n.name, image, n.bootID(), phase); err != nil {
		n.t.Fatal(err)
	}
}

func TestAgentStagesAndRebootsOnlyUnderGrants(t *testing.T) {
	n := newNode(t, "it-a")
	n.start()
	notifysock.Expect(t, n.notify, "READY=1")
	n.wait("Waiting", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))
	notifysock.Expect(t, n.notify, "STATUS=Waiting: Waiting for a stage slot for quay.io/example/os@sha256:222222222222")
	notifysock.Expect(t, n.notify, "WATCHDOG=1")
	if c := n.switches(); c != 0 {
		t.Fatalf("%d switch invocations without a grant", c)
	}

	n.grant(lease.KindStage, imgV2, "")
	st := n.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant))
	if st.Staged == nil || st.Staged.Digest != digestOf(imgV2) || !st.Staged.DownloadOnly {
		t.Fatalf("reported staged = %+v", st.Staged)
	}
	notifysock.Expect(t, n.notify, "STATUS=Staged: Staged quay.io/example/os@sha256:222222222222…; waiting for a reboot slot")
	if err := n.k.Revoke(context.Background(), lease.KindStage, 0); err != nil {
		t.Fatal(err)
	}

	n.grant(lease.KindReboot, imgV2, lease.PhaseDraining)
	// Nothing to do, nothing to report under it (amendment 18): the agent
	// only logs that it saw it.
	n.until("the reboot grant seen in phase Draining", func() bool {
		return n.logged(`msg="grant seen"`, "kind=reboot", "phase=Draining")
	})
	if r := n.login.Reboots(); r != 0 {
		t.Fatalf("rebooted in phase Draining")
	}
	if err := n.k.SetPhase(context.Background(), 0, lease.PhaseReboot); err != nil {
		t.Fatal(err)
	}
	n.until("a logind Reboot call", func() bool { return n.login.Reboots() == 1 })
	m, _ := n.dir.Machine()
	if s := m.State().Staged; s == nil || s.DownloadOnly {
		t.Fatalf("staged deployment not unlocked before the reboot: %+v", s)
	}

	// The reboot happens; early-boot status still shows the old boot.
	newBoot, err := n.dir.Reboot(testbootc.RebootOptions{StaleUntilSettle: true})
	if err != nil {
		t.Fatal(err)
	}
	n.wait("settling in the new boot", func(s fleetv1.BootcNodeStatus) bool {
		return s.BootID == newBoot && s.Reason == fleetv1.ReasonStatusSettling
	})
	if c := n.switches(); c != 1 {
		t.Fatalf("%d switch invocations, want 1 (no re-stage on a stale status)", c)
	}
	if err := n.dir.Update(func(m *testbootc.Machine) error { m.Settle(); return nil }); err != nil {
		t.Fatal(err)
	}
	st = n.wait("Idle on the new image", testcoord.PhaseIs(fleetv1.PhaseIdle, fleetv1.ReasonUpToDate))
	if st.Booted == nil || st.Booted.Digest != digestOf(imgV2) || st.Rollback == nil || st.Rollback.Digest != digestOf(imgV1) {
		t.Fatalf("after the reboot: booted %+v rollback %+v", st.Booted, st.Rollback)
	}
	if r := n.login.Reboots(); r != 1 || n.switches() != 1 {
		t.Fatalf("reboots %d, switches %d; want 1 and 1", r, n.switches())
	}
	if code := n.stop(syscall.SIGTERM); code != 0 {
		t.Fatalf("exit code %d on SIGTERM", code)
	}
	notifysock.Expect(t, n.notify, "STOPPING=1")
}

func TestAgentRebootsOncePerGrantAcrossRestart(t *testing.T) {
	n := newNode(t, "it-b")
	// Unlocking fails for a while: the record is written, no reboot yet.
	if err := n.dir.Configure(func(k *testbootc.Knobs) {
		k.ApplyFailure = &testbootc.Failure{ExitCode: 1, Stderr: "error: simulated apply failure\n"}
	}); err != nil {
		t.Fatal(err)
	}
	n.start()
	n.grant(lease.KindStage, imgV2, "")
	n.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, ""))
	n.grant(lease.KindReboot, imgV2, lease.PhaseReboot)
	store := record.Store{Dir: n.state}
	n.until("the reboot record", func() bool { r, err := store.Read(); return r != nil && err == nil })
	if code := n.stop(syscall.SIGKILL); code == 0 {
		t.Fatalf("kill -9 exited 0")
	}
	if r := n.login.Reboots(); r != 0 {
		t.Fatalf("rebooted although unlocking failed")
	}
	if err := n.dir.Configure(func(k *testbootc.Knobs) { k.ApplyFailure = nil }); err != nil {
		t.Fatal(err)
	}
	n.start()
	n.until("the reboot after the restart", func() bool { return n.login.Reboots() == 1 })
	n.wait("Rebooting", testcoord.PhaseIs(fleetv1.PhaseRebooting, ""))
	// A second restart in the same boot: the record allows the same reboot
	// again (still one boot), so kill it only after checking the count.
	if r := n.login.Reboots(); r != 1 {
		t.Fatalf("%d reboots in one boot, want 1", r)
	}
	newBoot, err := n.dir.Reboot(testbootc.RebootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.wait("Idle in the new boot", func(s fleetv1.BootcNodeStatus) bool {
		return s.BootID == newBoot && s.Phase == fleetv1.PhaseIdle
	})
	if r := n.login.Reboots(); r != 1 {
		t.Fatalf("%d reboots for one grant, want 1", r)
	}
	spent, err := store.Spent()
	if err != nil || len(spent) != 1 || spent[0].Lease != lease.SlotName(n.k.Pool, lease.KindReboot, 0) {
		t.Fatalf("spent = %v, %v", spent, err)
	}
}

func TestAgentCancelsHangingStageOnRevoke(t *testing.T) {
	n := newNode(t, "it-c")
	if err := n.dir.Configure(func(k *testbootc.Knobs) { k.SwitchHang = true }); err != nil {
		t.Fatal(err)
	}
	n.start()
	n.grant(lease.KindStage, imgV2, "")
	n.wait("Staging", testcoord.PhaseIs(fleetv1.PhaseStaging, ""))
	var pids []int
	n.until("the hanging switch", func() bool {
		b, err := os.ReadFile(n.dir.Path(testbootc.HangPIDsFile))
		if err != nil {
			return false
		}
		pids = nil
		for _, f := range strings.Fields(string(b)) {
			var p int
			fmt.Sscan(f, &p)
			pids = append(pids, p)
		}
		return len(pids) == 2
	})
	if err := n.k.Revoke(context.Background(), lease.KindStage, 0); err != nil {
		t.Fatal(err)
	}
	n.wait("Waiting after the revoke", testcoord.PhaseIs(fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant))
	for _, p := range pids {
		n.until(fmt.Sprintf("pid %d gone", p), func() bool {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
			return err != nil || strings.Contains(string(b), ") Z ")
		})
	}
	if m, _ := n.dir.Machine(); m.State().Staged != nil {
		t.Fatalf("a cancelled stage left a staged deployment")
	}
}

func TestAgentReportsBootedUnexpectedImage(t *testing.T) {
	n := newNode(t, "it-d", "BOOTC_FLEET_SETTLE_TIMEOUT=1s")
	n.start()
	n.grant(lease.KindStage, imgV2, "")
	n.wait("Staged", testcoord.PhaseIs(fleetv1.PhaseStaged, ""))
	n.grant(lease.KindReboot, imgV2, lease.PhaseReboot)
	n.until("a logind Reboot call", func() bool { return n.login.Reboots() == 1 })
	// The staged deployment is replaced by a locked one before the reboot
	// happens, so the machine comes back on the old image.
	if err := n.dir.Update(func(m *testbootc.Machine) error { return m.Switch(imgV3) }); err != nil {
		t.Fatal(err)
	}
	newBoot, err := n.dir.Reboot(testbootc.RebootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := n.wait("BootedUnexpectedImage", func(s fleetv1.BootcNodeStatus) bool {
		return s.BootID == newBoot && s.Reason == fleetv1.ReasonBootedUnexpectedImage
	})
	if st.Phase != fleetv1.PhaseDegraded {
		t.Fatalf("phase %s, want Degraded", st.Phase)
	}
	if r, c := n.login.Reboots(), n.switches(); r != 1 || c != 1 {
		t.Fatalf("reboots %d, switches %d after an unexpected boot; want 1 and 1", r, c)
	}
}
