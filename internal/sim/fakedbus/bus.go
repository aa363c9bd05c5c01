// Package fakedbus runs a private dbus-daemon and fake logind and systemd
// services on it, so the agent's D-Bus code talks to a real bus on a
// simulated host (point DBUS_SYSTEM_BUS_ADDRESS at the address).
// tests/fakedbus adds the helper tests start a bus with.
package fakedbus

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DaemonPath is the dbus-daemon binary used.
var DaemonPath = "/usr/bin/dbus-daemon"

// Only a listen address, EXTERNAL auth and an allow-all policy: no
// service activation (a --session bus would try to start a real systemd).
const busConfig = `<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <listen>unix:tmpdir=/tmp</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow receive_sender="*"/>
    <allow eavesdrop="true"/>
  </policy>
</busconfig>
`

// ErrNoDaemon is returned when dbus-daemon is not installed.
var ErrNoDaemon = errors.New("dbus-daemon not found")

// StartBusProcess starts a private dbus-daemon with its config in dir and
// returns its address. stop ends it (and is safe to call twice).
func StartBusProcess(ctx context.Context, dir string) (addr string, stop func(), err error) {
	if _, err := os.Stat(DaemonPath); err != nil {
		return "", nil, fmt.Errorf("%w at %s: %w", ErrNoDaemon, DaemonPath, err)
	}
	conf := filepath.Join(dir, "bus.conf")
	if err := os.WriteFile(conf, []byte(busConfig), 0o644); err != nil {
		return "", nil, err
	}
	cmd := exec.Command(DaemonPath, "--config-file="+conf, "--nofork", "--print-address")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	lines := make(chan string, 1)
	go func() {
		r := bufio.NewReader(out)
		line, _ := r.ReadString('\n')
		lines <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case addr = <-lines:
	case <-ctx.Done():
		stop()
		return "", nil, ctx.Err()
	case <-done:
		return "", nil, fmt.Errorf("dbus-daemon exited before printing its address: %s", stderr.String())
	}
	if addr == "" {
		stop()
		return "", nil, fmt.Errorf("dbus-daemon printed no address")
	}
	return addr, stop, nil
}

// syncBuffer collects a child's stderr for error messages.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 64<<10 {
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
