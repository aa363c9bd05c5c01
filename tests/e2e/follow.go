package e2e

// The boot follower: what the harness sees of each boot of a node, over the
// node's own system bus and from the test bootc's state.

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/godbus/dbus/v5"
)

// tracef notes a step of the boot follower; a failing test prints them.
func (n *Node) tracef(format string, args ...any) {
	line := time.Now().UTC().Format("15:04:05.000 ") + fmt.Sprintf(format, args...)
	n.mu.Lock()
	n.trace = append(n.trace, line)
	n.mu.Unlock()
}

// followBoots follows the agent in the container's boot bl, and in every
// boot a soft reboot starts in the same container, until the container
// exits. A soft reboot shows on the host as the node's system bus going
// away while the container runs on: the test bootc's soft-reboot count grows
// (e2e-soft-reboot.service, which runs once the agent stopped; the kubelet
// is down from then on), then systemd's SoftRebootsCount does (the new
// userspace runs; the kubelet is back, in the same boot ID). The count of
// the test bootc is watched too, so a bus follower that missed the bus
// closing cannot hold the next userspace's gate shut.
func (n *Node) followBoots(b *Boot, bl *BootLog) {
	t := n.f.t
	for {
		gone, stop, err := n.watchAgent(b, bl)
		if err != nil {
			if n.f.ctx.Err() == nil {
				t.Errorf("%s: boot %d: following %s: %v", n.Name, bl.N, AgentUnit, err)
			}
			return
		}
		played := n.playedSoftReboots()
	wait:
		for {
			select {
			case <-b.Done():
				stop()
				n.tracef("boot %d: the container exited", bl.N)
				return
			case <-gone:
				n.tracef("boot %d: the system bus closed", bl.N)
				break wait
			case <-time.After(100 * time.Millisecond):
				if n.bootcSoftReboots() > played {
					n.tracef("boot %d: the test bootc played a soft reboot while the bus follower ran on; closing it", bl.N)
					stop()
					break wait
				}
			}
		}
		next, ok := n.awaitSoftReboot(b, bl)
		if !ok {
			return // the container is exiting: a full reboot or a poweroff
		}
		bl = next
	}
}

// bootcSoftReboots is the number of soft reboots the test bootc played (-1
// when its state cannot be read).
func (n *Node) bootcSoftReboots() int {
	m, err := n.Bootc.Machine()
	if err != nil {
		return -1
	}
	return m.State().SoftReboots
}

func (n *Node) playedSoftReboots() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.softPlayed
}

// awaitSoftReboot waits, after the bus went away, for the container to exit
// (false) or for a soft reboot to finish (true, with the new boot's log).
func (n *Node) awaitSoftReboot(b *Boot, prev *BootLog) (*BootLog, bool) {
	softReboots := n.bootcSoftReboots
	played := n.playedSoftReboots()
	var down time.Time
	var lastErr string
	for {
		if down.IsZero() && softReboots() > played {
			down = time.Now()
			n.tracef("boot %d: the test bootc played soft reboot %d", prev.N, played+1)
			n.mu.Lock()
			n.softPlayed = softReboots()
			n.mu.Unlock()
			_ = n.f.kubelet(n.Name, false, "")
			n.f.Events.add(n.Name, evDown, "soft-reboot")
		}
		if !down.IsZero() {
			// Bounded, then asked again: a systemctl that reaches PID 1
			// between two userspaces can wait minutes for an answer (seen:
			// the next userspace's gate timed out, 120 s, behind it).
			ctx, cancel := context.WithTimeout(n.f.ctx, 3*time.Second)
			out, err := b.Exec(ctx, "systemctl", "show", "-P", "SoftRebootsCount")
			cancel()
			if got := fmt.Sprintf("%q %v", strings.TrimSpace(out), err); got != lastErr {
				lastErr = got
				n.tracef("boot %d: SoftRebootsCount: %s", prev.N, got)
			}
			if c, perr := strconv.ParseUint(strings.TrimSpace(out), 10, 32); err == nil && perr == nil && uint32(c) > prev.SoftRebootsCount {
				bl := &BootLog{BootID: b.BootID, Started: down, Up: time.Now(), Soft: true, SoftRebootsCount: uint32(c)}
				n.mu.Lock()
				prev.Down = down
				bl.N = len(n.boots) + 1
				n.boots = append(n.boots, bl)
				n.mu.Unlock()
				if err := n.f.kubelet(n.Name, true, b.BootID); err != nil {
					n.f.t.Errorf("%s: kubelet: %v", n.Name, err)
				}
				n.f.Events.add(n.Name, evUp, b.BootID+" soft")
				n.notify()
				return bl, true
			}
		}
		select {
		case <-b.Done():
			n.tracef("boot %d: the container exited", prev.N)
			return nil, false
		case <-n.f.ctx.Done():
			return nil, false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// watchAgent follows the agent unit's ActiveState over the node's own
// system bus from before it starts: the e2e gate holds the unit's start
// until the harness has subscribed, then the harness opens the gate. It
// returns once the subscription is set up; recording goes on until the bus
// closes, with the boot or with a soft reboot, or stop is called, and then
// gone is closed.
func (n *Node) watchAgent(b *Boot, bl *BootLog) (gone <-chan struct{}, stop func(), err error) {
	ctx, cancel := context.WithTimeout(n.f.ctx, 60*time.Second)
	defer cancel()
	var conn *dbus.Conn
	for {
		c, err := connectBounded(n.f.ctx, b.BusAddress(), 10*time.Second)
		if err == nil {
			conn = c
			n.tracef("boot %d: connected to the system bus", bl.N)
			break
		}
		select {
		case <-b.Done():
			return nil, nil, fmt.Errorf("container exited before its system bus came up")
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("system bus: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	sd := conn.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1")
	if err := sd.CallWithContext(ctx, "org.freedesktop.systemd1.Manager.Subscribe", 0).Err; err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("systemd Subscribe: %w", err)
	}
	path := unitPath(AgentUnit)
	if err := conn.AddMatchSignalContext(ctx, dbus.WithMatchObjectPath(path),
		dbus.WithMatchInterface("org.freedesktop.DBus.Properties"), dbus.WithMatchMember("PropertiesChanged")); err != nil {
		conn.Close()
		return nil, nil, err
	}
	ch := make(chan *dbus.Signal, 256)
	conn.Signal(ch)
	unit := conn.Object("org.freedesktop.systemd1", path)
	// Bounded: the bus goes away in a soft reboot, and a follower stuck on a
	// call would miss the agent stopping and the next userspace.
	get := func(iface, prop string) string {
		cctx, cancel := context.WithTimeout(n.f.ctx, 5*time.Second)
		defer cancel()
		var v dbus.Variant
		if err := unit.CallWithContext(cctx, "org.freedesktop.DBus.Properties.Get", 0, iface, prop).Store(&v); err != nil {
			return ""
		}
		return fmt.Sprint(v.Value())
	}
	record := func(active, sub string) {
		tr := Transition{At: time.Now(), ActiveState: active, Sub: sub}
		if active == "active" {
			tr.StatusText = get("org.freedesktop.systemd1.Service", "StatusText")
			tr.MainPID = get("org.freedesktop.systemd1.Service", "MainPID")
		}
		n.tracef("boot %d: agent %s/%s", bl.N, active, sub)
		n.mu.Lock()
		if k := len(bl.Transitions); k == 0 || bl.Transitions[k-1].ActiveState != active || bl.Transitions[k-1].Sub != sub {
			bl.Transitions = append(bl.Transitions, tr)
			if active == "active" && bl.AgentFirstActive.IsZero() {
				bl.AgentFirstActive = tr.At
			}
		}
		n.mu.Unlock()
		n.notify()
	}
	record(get("org.freedesktop.systemd1.Unit", "ActiveState"), get("org.freedesktop.systemd1.Unit", "SubState"))
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer conn.Close()
		for {
			select {
			case s, ok := <-ch:
				if !ok {
					n.tracef("boot %d: signals ended", bl.N)
					return
				}
				if len(s.Body) < 2 {
					continue
				}
				if iface, _ := s.Body[0].(string); iface != "org.freedesktop.systemd1.Unit" {
					continue
				}
				ch, _ := s.Body[1].(map[string]dbus.Variant)
				active, sub := variantString(ch["ActiveState"]), variantString(ch["SubState"])
				if active == "" {
					active = get("org.freedesktop.systemd1.Unit", "ActiveState")
				}
				if sub == "" {
					sub = get("org.freedesktop.systemd1.Unit", "SubState")
				}
				if active != "" {
					record(active, sub)
				}
			case <-b.Done():
				return
			}
		}
	}()
	// Open the gate: the agent's start job runs now.
	n.tracef("boot %d: subscribed; opening the gate", bl.N)
	stop = func() { conn.Close() }
	return done, stop, os.WriteFile(b.Path(gateFile), nil, 0o644)
}

// connectBounded connects to a D-Bus address and authenticates within
// timeout: a bus socket that a userspace in transition still holds may
// accept a connection that nobody answers. The connection lives until ctx
// ends or it is closed.
func connectBounded(ctx context.Context, addr string, timeout time.Duration) (*dbus.Conn, error) {
	cctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(timeout, cancel)
	c, err := dbus.Connect(addr, dbus.WithContext(cctx))
	if !timer.Stop() {
		if err == nil {
			c.Close()
		}
		return nil, fmt.Errorf("connecting to %s: no answer within %s", addr, timeout)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	go func() { <-c.Context().Done(); cancel() }()
	return c, nil
}

func variantString(v dbus.Variant) string {
	s, _ := v.Value().(string)
	return s
}

// unitPath is systemd's D-Bus object path of a unit.
func unitPath(unit string) dbus.ObjectPath {
	var sb strings.Builder
	for i := 0; i < len(unit); i++ {
		c := unit[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			sb.WriteByte(c)
		} else {
			fmt.Fprintf(&sb, "_%02x", c)
		}
	}
	return dbus.ObjectPath("/org/freedesktop/systemd1/unit/" + sb.String())
}

// Diagnosis is what the harness saw of the node: its boot follower's trace
// and the test bootc's invocations and state (for failures).
func (n *Node) Diagnosis() string {
	var sb strings.Builder
	n.mu.Lock()
	sb.WriteString("boot follower:\n")
	for _, l := range n.trace {
		sb.WriteString("  " + l + "\n")
	}
	n.mu.Unlock()
	if inv, err := n.Bootc.Invocations(); err != nil {
		fmt.Fprintf(&sb, "test bootc invocations: %v\n", err)
	} else {
		sb.WriteString("test bootc invocations:\n")
		for _, i := range inv {
			fmt.Fprintf(&sb, "  %s %q\n", i.Time.UTC().Format("15:04:05.000"), i.Args)
		}
	}
	if m, err := n.Bootc.Machine(); err != nil {
		fmt.Fprintf(&sb, "test bootc state: %v\n", err)
	} else {
		fmt.Fprintf(&sb, "test bootc state: %+v\n", m.State())
	}
	return sb.String()
}
