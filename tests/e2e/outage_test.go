package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// outageStartTimeout is the agent's TimeoutStartSec in TestBootWithoutAPIServer
// (a drop-in of that test only): short, so the test can outlast it.
const outageStartTimeout = 10 * time.Second

// Boot is never held hostage by the API server. systemd orders
// multi-user.target after the start job of the agent (a Type=notify unit it
// Wants), so an agent that waited for the API server before READY=1 would
// hold boot until TimeoutStartSec, then fail and restart in a loop. Here the
// node boots while its API server refuses connections, then accepts them and
// never answers; the boot completes, the agent stays up without a restart
// well past TimeoutStartSec, says what it waits for, and reports in the same
// process once the API server answers.
func TestBootWithoutAPIServer(t *testing.T) {
	SkipIfUnavailable(t)
	f := NewFleet(t, Options{Nodes: 1, Prefix: "e2e-outage", Booted: imgOld, Pool: "outage"})
	testStart := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	n := f.Nodes[0]
	if err := f.Env.Client.Create(ctx, &fleetv1.BootcNode{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name},
		Spec:       fleetv1.BootcNodeSpec{Pool: "outage", DesiredImage: imgOld},
	}); err != nil {
		t.Fatal(err)
	}
	upstream, err := url.Parse(f.Env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	px := newAPIProxy(t, upstream.Host)
	if err := pointKubeconfigAt(filepath.Join(n.Machine.Dir, "kubeconfig"), "https://"+px.Addr); err != nil {
		t.Fatal(err)
	}
	dropIn := filepath.Join(f.Root, "etc/systemd/system", AgentUnit+".d", "60-e2e-outage.conf")
	if err := os.WriteFile(dropIn, []byte("# TestBootWithoutAPIServer only: a start timeout the test can outlast.\n[Service]\nTimeoutStartSec="+
		strconv.Itoa(int(outageStartTimeout/time.Second))+"s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.Boot()

	// 1. Boot completes while the API server refuses connections.
	bl := awaitAgentActive(ctx, t, n, 1)
	b := n.Current()
	if b == nil {
		t.Fatal("node down right after its agent became active")
	}
	if px.Mode() != proxyRefuse {
		t.Fatalf("proxy in mode %s when the agent became ready, want %s", px.Mode(), proxyRefuse)
	}
	i := slices.IndexFunc(bl.Transitions, func(x Transition) bool { return x.ActiveState == "activating" })
	if i < 0 {
		t.Fatalf("no activating transition before active: %s", transitions(bl.Transitions))
	}
	activating := bl.Transitions[i].At
	readyPID := bl.Transitions[slices.IndexFunc(bl.Transitions, func(x Transition) bool { return x.ActiveState == "active" })].MainPID
	t.Logf("agent: %s; READY=1 %s after its start job began, API server refusing connections",
		transitions(bl.Transitions), bl.AgentFirstActive.Sub(activating).Round(time.Millisecond))

	props, err := b.Show(ctx, AgentUnit, "TimeoutStartUSec", "ActiveEnterTimestampMonotonic")
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(int(outageStartTimeout/time.Second)) + "s"; props["TimeoutStartUSec"] != want {
		t.Fatalf("TimeoutStartUSec=%s, want %s: the test's drop-in did not apply", props["TimeoutStartUSec"], want)
	}
	mu, err := b.Show(ctx, "multi-user.target", "After")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Fields(mu["After"]), AgentUnit) {
		t.Fatalf("multi-user.target is not ordered after %s (After=%s): boot would not wait for READY=1, so this test proves nothing", AgentUnit, mu["After"])
	}
	var multiUser map[string]string
	if err := n.Await(ctx, "multi-user.target active", func() (bool, error) {
		multiUser, err = b.Show(ctx, "multi-user.target", "ActiveState", "ActiveEnterTimestampMonotonic")
		return err == nil && multiUser["ActiveState"] == "active", nil
	}); err != nil {
		t.Fatalf("%v (multi-user.target %v)", err, multiUser)
	}
	if px.Mode() != proxyRefuse {
		t.Fatalf("proxy in mode %s when multi-user.target became active, want %s", px.Mode(), proxyRefuse)
	}
	agentUp, _ := strconv.ParseInt(props["ActiveEnterTimestampMonotonic"], 10, 64)
	muUp, _ := strconv.ParseInt(multiUser["ActiveEnterTimestampMonotonic"], 10, 64)
	t.Logf("multi-user.target active %s after the agent became active (monotonic %d vs %d)",
		(time.Duration(muUp-agentUp) * time.Microsecond).Round(time.Millisecond), muUp, agentUp)
	var sysState string
	if err := n.Await(ctx, "the boot finished (is-system-running past starting)", func() (bool, error) {
		out, _ := b.Exec(ctx, "systemctl", "is-system-running") // exits non-zero unless "running"
		sysState = strings.TrimSpace(out)
		return sysState != "" && sysState != "initializing" && sysState != "starting", nil
	}); err != nil {
		t.Fatalf("%v (last: %q)", err, sysState)
	}
	failed, err := b.Exec(ctx, "systemctl", "list-units", "--state=failed", "--plain", "--no-legend", "--no-pager")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("is-system-running: %s; failed units: %q", sysState, strings.TrimSpace(failed))
	if sysState != "running" && sysState != "degraded" {
		t.Errorf("is-system-running = %s, want running (or degraded for reasons other than the agent)", sysState)
	}
	if strings.Contains(failed, AgentUnit) {
		t.Errorf("%s is among the failed units:\n%s", AgentUnit, failed)
	}

	// 2. and 3. Up, no restart, and saying what it waits for, well past the
	// start timeout: first while connections are refused, then while they
	// are accepted and never answered (the agent's list requests hang for
	// the TLS handshake timeout, 10s, twice the watchdog).
	waiting := "Waiting for the API server " + "https://" + px.Addr
	var status string
	if err := n.Await(ctx, "StatusText: waiting for the API server", func() (bool, error) {
		p, err := b.Show(ctx, AgentUnit, "StatusText")
		status = p["StatusText"]
		return err == nil && strings.HasPrefix(status, waiting), nil
	}); err != nil {
		t.Fatalf("%v (StatusText=%q)", err, status)
	}
	t.Logf("%s after the start job began, StatusText=%q", time.Since(activating).Round(time.Millisecond), status)
	steady := func(until time.Time) {
		t.Helper()
		for {
			p, err := b.Show(ctx, AgentUnit, "ActiveState", "SubState", "NRestarts", "MainPID", "StatusText")
			if err != nil {
				t.Fatal(err)
			}
			if p["ActiveState"] != "active" || p["SubState"] != "running" || p["NRestarts"] != "0" || p["MainPID"] != readyPID ||
				!strings.HasPrefix(p["StatusText"], waiting) {
				t.Fatalf("%s after the start job began: %v; want active/running, NRestarts=0, MainPID=%s, waiting for the API server",
					time.Since(activating).Round(time.Millisecond), p, readyPID)
			}
			status = p["StatusText"]
			if !time.Now().Before(until) {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(time.Second):
			}
		}
	}
	steady(activating.Add(outageStartTimeout - 2*time.Second))
	if err := px.Blackhole(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s after the start job began: proxy accepts and never answers", time.Since(activating).Round(time.Millisecond))
	steady(activating.Add(2*outageStartTimeout + 2*time.Second))
	t.Logf("%s after the start job began (TimeoutStartSec=%s): still active, NRestarts=0, MainPID %s, StatusText=%q",
		time.Since(activating).Round(time.Millisecond), outageStartTimeout, readyPID, status)

	// 4. The API server answers: the same process lists and reports.
	forwardAt := time.Now()
	if err := px.Forward(); err != nil {
		t.Fatal(err)
	}
	st := awaitNodeStatus(ctx, t, f, n, "a status report from this boot", func(s fleetv1.BootcNodeStatus) bool {
		return s.BootID == b.BootID
	})
	t.Logf("BootcNode status from boot %s %s after the proxy began forwarding (%d connections forwarded): phase %s, %q",
		st.BootID, time.Since(forwardAt).Round(time.Millisecond), px.Forwarded(), st.Phase, st.Message)
	if err := n.Await(ctx, "StatusText no longer waiting for the API server", func() (bool, error) {
		p, err := b.Show(ctx, AgentUnit, "StatusText")
		status = p["StatusText"]
		return err == nil && status != "" && !strings.Contains(status, "Waiting for the API server"), nil
	}); err != nil {
		t.Errorf("%v (StatusText=%q)", err, status)
	}
	end, err := b.Show(ctx, AgentUnit, "ActiveState", "SubState", "NRestarts", "MainPID", "Result")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the report: %v, StatusText=%q", end, status)
	if end["ActiveState"] != "active" || end["SubState"] != "running" || end["NRestarts"] != "0" || end["MainPID"] != readyPID {
		t.Errorf("after the API server came back: %v; want active/running, NRestarts=0, MainPID=%s", end, readyPID)
	}
	if tr := n.Boots()[0].Transitions; len(tr) != len(bl.Transitions) {
		t.Errorf("the unit changed state after it became active: %s", transitions(tr))
	}
	if px.Forwarded() == 0 {
		t.Errorf("the proxy forwarded no connection: the agent did not use it")
	}
	journal, _ := b.Exec(ctx, "journalctl", "-b", "--no-pager", "-u", AgentUnit)
	for _, bad := range []string{"start operation timed out", "Watchdog timeout", "Scheduled restart job", "Failed with result"} {
		if strings.Contains(journal, bad) {
			t.Errorf("the agent's journal contains %q:\n%s", bad, journal)
		}
	}
	t.Logf("test took %s", time.Since(testStart).Round(time.Millisecond))
}

// pointKubeconfigAt rewrites every cluster of the kubeconfig at path to
// server (the client certificate and CA stay: the proxy passes TLS through,
// and the API server's certificate names 127.0.0.1 whatever the port).
func pointKubeconfigAt(path, server string) error {
	kc, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return err
	}
	if len(kc.Clusters) == 0 {
		return fmt.Errorf("%s has no cluster", path)
	}
	for _, c := range kc.Clusters {
		c.Server = server
	}
	return clientcmd.WriteToFile(*kc, path)
}

// Modes of apiProxy, in the only order it goes through.
const (
	proxyRefuse    = "refuse"    // the port is bound, not listening: connect gets ECONNREFUSED
	proxyBlackhole = "blackhole" // listening, never accepting: connect succeeds, nothing answers
	proxyForward   = "forward"   // accepting, every connection piped to the API server
)

// apiProxy stands between a node and the API server on 127.0.0.1 (the nodes
// share the host's network). It starts refusing connections, can then
// accept them without ever answering, and can then forward them to the real
// API server, byte for byte (TLS passes through). Connections held while it
// blackholed are forwarded too once it forwards.
type apiProxy struct {
	Addr     string
	upstream string

	mu        sync.Mutex
	mode      string
	fd        int
	ln        net.Listener
	conns     map[net.Conn]bool
	forwarded int
	wg        sync.WaitGroup
}

func newAPIProxy(t *testing.T, upstream string) *apiProxy {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		t.Fatal(err)
	}
	p := &apiProxy{Addr: fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port), upstream: upstream,
		mode: proxyRefuse, fd: fd, conns: map[net.Conn]bool{}}
	t.Cleanup(p.close)
	// The refusal is the kernel's: check it is what a client sees.
	if c, err := net.DialTimeout("tcp", p.Addr, 5*time.Second); err == nil {
		c.Close()
		t.Fatalf("proxy %s accepted a connection while refusing", p.Addr)
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("proxy %s while refusing: %v, want connection refused", p.Addr, err)
	}
	return p
}

// Mode is the current mode.
func (p *apiProxy) Mode() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Forwarded counts the connections piped to the API server.
func (p *apiProxy) Forwarded() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.forwarded
}

// Blackhole starts listening without accepting: the kernel completes the
// TCP handshake and queues the connection; nothing ever answers it.
func (p *apiProxy) Blackhole() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode != proxyRefuse {
		return fmt.Errorf("proxy: blackhole from mode %s", p.mode)
	}
	if err := syscall.Listen(p.fd, 128); err != nil {
		return err
	}
	file := os.NewFile(uintptr(p.fd), "api-proxy")
	ln, err := net.FileListener(file) // a duplicate of the descriptor
	file.Close()
	p.fd = -1
	if err != nil {
		return err
	}
	p.ln, p.mode = ln, proxyBlackhole
	return nil
}

// Forward accepts every connection, queued ones included, and pipes it to
// the API server.
func (p *apiProxy) Forward() error {
	if p.Mode() == proxyRefuse {
		if err := p.Blackhole(); err != nil {
			return err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode != proxyBlackhole {
		return fmt.Errorf("proxy: forward from mode %s", p.mode)
	}
	p.mode = proxyForward
	ln := p.ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go p.pipe(c)
		}
	}()
	return nil
}

func (p *apiProxy) pipe(c net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.upstream, 10*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.ln == nil { // closed meanwhile
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.conns[c], p.conns[up] = true, true
	p.forwarded++
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(up, c)
	go cp(c, up)
	<-done
	<-done
	c.Close()
	up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

func (p *apiProxy) close() {
	p.mu.Lock()
	if p.fd >= 0 {
		syscall.Close(p.fd)
		p.fd = -1
	}
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
