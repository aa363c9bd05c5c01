package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Exit codes of systemd-nspawn --boot: the container's systemd asked for.
const (
	exitPoweroff = 0
	exitReboot   = 133
)

// Machine is one node: a systemd-nspawn container over the shared root with
// a volatile overlay, plus host directories bound in that outlive its boots.
type Machine struct {
	Name string
	Root string // shared root filesystem (read through an overlay)
	// Binds are host:container paths bound read-write; BindsRO read-only.
	Binds, BindsRO []string
	// Dir holds the console log of each boot.
	Dir string
}

// Boot is one running boot of a Machine.
type Boot struct {
	Machine *Machine
	N       int // 1 for the first boot
	Leader  int // host pid of the container's systemd (PID 1 inside)
	BootID  string
	Started time.Time // nspawn started
	Up      time.Time // leader found and boot ID read

	cmd  *exec.Cmd
	done chan struct{}
	code int
	err  error
}

// Start boots the machine and returns once its systemd runs and its boot ID
// is known; extraRO are read-only host:container binds of this boot only.
// The boot ends when the container powers off or reboots; Wait says which.
func (m *Machine) Start(ctx context.Context, n int, extraRO ...string) (*Boot, error) {
	args := []string{
		"-D", m.Root, "--boot", "--register=no", "--keep-unit", "--console=pipe",
		"--machine=" + m.Name, "--volatile=overlay",
	}
	for _, b := range m.Binds {
		args = append(args, "--bind="+b)
	}
	for _, b := range append(slices.Clone(m.BindsRO), extraRO...) {
		args = append(args, "--bind-ro="+b)
	}
	log, err := os.Create(filepath.Join(m.Dir, fmt.Sprintf("console-%d.log", n)))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("systemd-nspawn", args...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: a test's interrupt does not reach it before
	// the harness powers it off.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	b := &Boot{Machine: m, N: n, cmd: cmd, done: make(chan struct{}), Started: time.Now()}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("systemd-nspawn: %w", err)
	}
	go func() {
		err := cmd.Wait()
		log.Close()
		b.code = cmd.ProcessState.ExitCode()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			b.err = err
		}
		close(b.done)
	}()
	for {
		if b.Leader == 0 {
			b.Leader = leaderOf(cmd.Process.Pid)
		}
		if b.Leader != 0 {
			if id, err := os.ReadFile(fmt.Sprintf("/proc/%d/root/proc/sys/kernel/random/boot_id", b.Leader)); err == nil {
				if s := strings.TrimSpace(string(id)); len(s) == 36 {
					b.BootID = s
					b.Up = time.Now()
					return b, nil
				}
			}
		}
		select {
		case <-b.done:
			out, _ := os.ReadFile(log.Name())
			return nil, fmt.Errorf("%s: systemd-nspawn exited with %d before the container ran:\n%s", m.Name, b.code, tail(out, 2000))
		case <-ctx.Done():
			b.Kill()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// leaderOf finds the container's PID 1 on the host: systemd-nspawn forks one
// child into the new PID namespace, which execs systemd. It is the process
// whose parent is nspawn, whose comm is "systemd", and whose innermost PID
// (last NSpid field of /proc/PID/status) is 1.
func leaderOf(nspawn int) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		var name, ppid, nspid string
		for _, line := range strings.Split(string(st), "\n") {
			k, v, _ := strings.Cut(line, ":")
			v = strings.TrimSpace(v)
			switch k {
			case "Name":
				name = v
			case "PPid":
				ppid = v
			case "NSpid":
				f := strings.Fields(v)
				if len(f) > 0 {
					nspid = f[len(f)-1]
				}
			}
		}
		if name == "systemd" && ppid == strconv.Itoa(nspawn) && nspid == "1" {
			return pid
		}
	}
	return 0
}

// Done is closed when the container has exited.
func (b *Boot) Done() <-chan struct{} { return b.done }

// Wait waits for the container to exit and returns nspawn's exit code
// (exitReboot, exitPoweroff, or a failure).
func (b *Boot) Wait(ctx context.Context) (int, error) {
	select {
	case <-b.done:
		return b.code, b.err
	case <-ctx.Done():
		return -1, ctx.Err()
	}
}

// Kill ends the container at once (test teardown).
func (b *Boot) Kill() {
	if b.cmd.Process != nil {
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-b.done
}

// Exec runs a command inside the container (all its namespaces, its root)
// and returns its standard output.
func (b *Boot) Exec(ctx context.Context, args ...string) (string, error) {
	full := append([]string{"-t", strconv.Itoa(b.Leader), "-a", "--"}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s: %s: %w: %s", b.Machine.Name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Show returns `systemctl show -p P1,P2... UNIT` inside the container.
func (b *Boot) Show(ctx context.Context, unit string, props ...string) (map[string]string, error) {
	out, err := b.Exec(ctx, "systemctl", "show", "-p", strings.Join(props, ","), unit)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m, nil
}

// Path is a path inside the container, seen from the host.
func (b *Boot) Path(p string) string {
	return filepath.Join(fmt.Sprintf("/proc/%d/root", b.Leader), p)
}

// BusAddress is the container's system bus, reachable from the host.
func (b *Boot) BusAddress() string {
	return "unix:path=" + b.Path("/run/dbus/system_bus_socket")
}

// events is an ordered, timestamped log shared by the harness goroutines.
type events struct {
	mu  sync.Mutex
	log []event
}

type event struct {
	At   time.Time
	Node string
	What string // see the ev* constants
	Info string
}

const (
	evUp       = "up"       // container running, kubelet Ready
	evDown     = "down"     // container exited (reboot or poweroff)
	evCordon   = "cordon"   // Node spec.unschedulable became true
	evUncordon = "uncordon" // and false again
)

func (e *events) add(node, what, info string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log = append(e.log, event{At: time.Now(), Node: node, What: what, Info: info})
}

func (e *events) snapshot() []event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]event(nil), e.log...)
}
