package fakedbus

import (
	"fmt"
	"sync"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/introspect"
)

// logind's names.
const (
	Login1Name  = "org.freedesktop.login1"
	Login1Path  = dbus.ObjectPath("/org/freedesktop/login1")
	Login1Iface = "org.freedesktop.login1.Manager"
)

// Login1 is a fake logind Manager: Reboot and PowerOff are counted and
// reported to the callbacks, nothing else happens.
type Login1 struct {
	// OnReboot runs inside the Reboot call, before it returns.
	OnReboot func()
	// OnPowerOff runs inside the PowerOff call, before it returns.
	OnPowerOff func()

	mu        sync.Mutex
	reboots   []bool // the interactive argument of each call
	poweroffs []bool
	conn      *dbus.Conn
}

// Serve connects to the bus at addr, exports the Manager object and claims
// org.freedesktop.login1.
func (l *Login1) Serve(addr string) error {
	conn, err := connect(addr)
	if err != nil {
		return err
	}
	m := login1Manager{l}
	if err := conn.Export(m, Login1Path, Login1Iface); err != nil {
		conn.Close()
		return err
	}
	node := &introspect.Node{
		Name: string(Login1Path),
		Interfaces: []introspect.Interface{
			introspect.IntrospectData,
			{
				Name: Login1Iface,
				Methods: []introspect.Method{
					{Name: "Reboot", Args: []introspect.Arg{{Name: "interactive", Type: "b", Direction: "in"}}},
					{Name: "PowerOff", Args: []introspect.Arg{{Name: "interactive", Type: "b", Direction: "in"}}},
				},
			},
		},
	}
	if err := conn.Export(introspect.NewIntrospectable(node), Login1Path, "org.freedesktop.DBus.Introspectable"); err != nil {
		conn.Close()
		return err
	}
	if err := claim(conn, Login1Name); err != nil {
		conn.Close()
		return err
	}
	l.mu.Lock()
	l.conn = conn
	l.mu.Unlock()
	return nil
}

// Reboots returns how many times Reboot was called.
func (l *Login1) Reboots() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.reboots)
}

// RebootArgs returns the interactive argument of every Reboot call.
func (l *Login1) RebootArgs() []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]bool(nil), l.reboots...)
}

// PowerOffs returns how many times PowerOff was called.
func (l *Login1) PowerOffs() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.poweroffs)
}

// Close releases the name and the connection.
func (l *Login1) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return nil
	}
	err := l.conn.Close()
	l.conn = nil
	return err
}

// login1Manager holds the D-Bus methods apart from Login1's Go methods,
// which godbus would otherwise export too.
type login1Manager struct{ l *Login1 }

func (m login1Manager) Reboot(interactive bool) *dbus.Error {
	m.l.mu.Lock()
	m.l.reboots = append(m.l.reboots, interactive)
	cb := m.l.OnReboot
	m.l.mu.Unlock()
	if cb != nil {
		cb()
	}
	return nil
}

func (m login1Manager) PowerOff(interactive bool) *dbus.Error {
	m.l.mu.Lock()
	m.l.poweroffs = append(m.l.poweroffs, interactive)
	cb := m.l.OnPowerOff
	m.l.mu.Unlock()
	if cb != nil {
		cb()
	}
	return nil
}

func connect(addr string) (*dbus.Conn, error) {
	conn, err := dbus.Connect(addr)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", addr, err)
	}
	return conn, nil
}

func claim(conn *dbus.Conn, name string) error {
	reply, err := conn.RequestName(name, dbus.NameFlagDoNotQueue)
	if err != nil {
		return fmt.Errorf("requesting %s: %w", name, err)
	}
	if reply != dbus.RequestNameReplyPrimaryOwner {
		return fmt.Errorf("requesting %s: name already taken (reply %d)", name, reply)
	}
	return nil
}
