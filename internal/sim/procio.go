package sim

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
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

// lineWriter copies output to out and hands each complete line to line.
type lineWriter struct {
	out  io.Writer
	line func(string)
	mu   sync.Mutex
	buf  []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.out.Write(p)
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		l := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		w.line(l)
	}
	return len(p), nil
}

func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.line(string(w.buf))
		w.buf = nil
	}
}

// parseLogfmt reads a log/slog text line: key=value pairs, values either
// bare or Go-quoted. Malformed pairs are skipped.
func parseLogfmt(line string) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(line))
	sc.Buffer(make([]byte, 0, len(line)+1), len(line)+1)
	sc.Split(splitLogfmt)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok || k == "" {
			continue
		}
		if strings.HasPrefix(v, `"`) {
			u, err := strconv.Unquote(v)
			if err != nil {
				continue
			}
			v = u
		}
		out[k] = v
	}
	return out
}

// splitLogfmt splits at spaces outside double quotes.
func splitLogfmt(data []byte, atEOF bool) (int, []byte, error) {
	start := 0
	for start < len(data) && data[start] == ' ' {
		start++
	}
	quoted, escaped := false, false
	for i := start; i < len(data); i++ {
		c := data[i]
		switch {
		case escaped:
			escaped = false
		case c == '\\' && quoted:
			escaped = true
		case c == '"':
			quoted = !quoted
		case c == ' ' && !quoted:
			return i + 1, data[start:i], nil
		}
	}
	if atEOF && start < len(data) {
		return len(data), data[start:], nil
	}
	return start, nil, nil
}
