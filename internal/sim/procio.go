package sim

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Process is a child in its own process group that dies with us.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// StartProcess starts path with args and env, its output to out.
func StartProcess(path string, args, env []string, out io.Writer) (*Process, error) {
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	// Its own group: a terminal's Ctrl-C reaches only the harness, which
	// stops children in order. Pdeathsig: a harness killed outright does
	// not leave them running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", path, err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// PID is the process's id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Stop sends SIGTERM, waits up to grace, then kills the process group.
func (p *Process) Stop(grace time.Duration) {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// MinimalEnv keeps the children's environment to what they need, so the
// caller's KUBECONFIG or BOOTC_FLEET_* settings cannot change them.
func MinimalEnv() []string {
	env := []string{"PATH=" + os.Getenv("PATH")}
	if h := os.Getenv("HOME"); h != "" {
		env = append(env, "HOME="+h)
	}
	return env
}
