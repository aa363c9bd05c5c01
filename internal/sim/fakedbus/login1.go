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

// RebootWithFlags flags, as logind defines them (systemd
// src/basic/login-util.h, SD_LOGIND_*).
const (
	FlagRootCheckInhibitors       uint64 = 1 << 0 // SD_LOGIND_ROOT_CHECK_INHIBITORS
	FlagRebootViaKexec            uint64 = 1 << 1 // SD_LOGIND_REBOOT_VIA_KEXEC
	FlagSoftReboot                uint64 = 1 << 2 // SD_LOGIND_SOFT_REBOOT (systemd 254+)
	FlagSoftRebootIfNextrootSetUp uint64 = 1 << 3 // SD_LOGIND_SOFT_REBOOT_IF_NEXTROOT_SET_UP (systemd 255+)
	FlagSkipInhibitors            uint64 = 1 << 4 // SD_LOGIND_SKIP_INHIBITORS (systemd 256+)
	flagsPublic                          = FlagRootCheckInhibitors | FlagRebootViaKexec | FlagSoftReboot | FlagSoftRebootIfNextrootSetUp | FlagSkipInhibitors
	flagsPublicBeforeSoftReboot          = FlagRootCheckInhibitors | FlagRebootViaKexec
	errInvalidArgs                       = "org.freedesktop.DBus.Error.InvalidArgs" // SD_BUS_ERROR_INVALID_ARGS
)

// RebootCall is one Reboot or RebootWithFlags call as logind received it.
type RebootCall struct {
	// WithFlags: RebootWithFlags (else the old Reboot(b interactive)).
	WithFlags bool
	Flags     uint64
	// Interactive is Reboot's argument, or for RebootWithFlags the
	// message header's ALLOW_INTERACTIVE_AUTHORIZATION flag.
	Interactive bool
	// Soft: logind turned it into a soft reboot.
	Soft bool
}

// Login1 is a fake logind Manager: Reboot, RebootWithFlags and PowerOff are
// checked like logind checks them, recorded and reported to the callbacks;
// nothing else happens.
type Login1 struct {
	// OnReboot runs inside a Reboot (or non-soft RebootWithFlags) call,
	// before it returns.
	OnReboot func()
	// OnSoftReboot runs inside a RebootWithFlags call that logind turns
	// into a soft reboot, before it returns.
	OnSoftReboot func()
	// OnPowerOff runs inside the PowerOff call, before it returns.
	OnPowerOff func()
	// NoSoftReboot plays logind before systemd 254 (Debian 12 has 252),
	// which knows no soft-reboot flag: RebootWithFlags accepts only the
	// root-check-inhibitors and kexec flags.
	NoSoftReboot bool
	// NextrootSetUp answers whether /run/nextroot holds an OS tree, for
	// SD_LOGIND_SOFT_REBOOT_IF_NEXTROOT_SET_UP; nil: it does not.
	NextrootSetUp func() bool

	mu        sync.Mutex
	reboots   []RebootCall
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
					{Name: "RebootWithFlags", Args: []introspect.Arg{{Name: "flags", Type: "t", Direction: "in"}}},
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

// Reboots returns how many full reboots logind accepted (Reboot, and
// RebootWithFlags without a soft reboot).
func (l *Login1) Reboots() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rebootsLocked()
}

// SoftReboots returns how many soft reboots logind accepted.
func (l *Login1) SoftReboots() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.reboots) - l.rebootsLocked()
}

func (l *Login1) rebootsLocked() int {
	n := 0
	for _, c := range l.reboots {
		if !c.Soft {
			n++
		}
	}
	return n
}

// RebootArgs returns the interactive argument of every accepted Reboot and
// RebootWithFlags call.
func (l *Login1) RebootArgs() []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []bool
	for _, c := range l.reboots {
		out = append(out, c.Interactive)
	}
	return out
}

// RebootCalls returns every accepted Reboot and RebootWithFlags call.
func (l *Login1) RebootCalls() []RebootCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]RebootCall(nil), l.reboots...)
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

func (m login1Manager) Reboot(msg dbus.Message, interactive bool) *dbus.Error {
	if err := signature(msg, "Reboot", "b"); err != nil {
		return err
	}
	return m.l.reboot(RebootCall{Interactive: interactive})
}

// signature refuses a call whose arguments are not exactly want, as sd-bus
// does from the method's vtable before logind sees it (godbus alone would
// convert a "u" into a uint64).
func signature(msg dbus.Message, method, want string) *dbus.Error {
	if got := dbus.SignatureOf(msg.Body...).String(); got != want {
		return dbus.NewError(errInvalidArgs, []any{fmt.Sprintf("Invalid arguments '%s' to call %s.%s(), expecting '%s'.", got, Login1Iface, method, want)})
	}
	return nil
}

// RebootWithFlags checks flags as logind does (systemd
// src/login/logind-dbus.c, method_do_shutdown_or_sleep, with_flags): unknown
// bits, or kexec together with soft reboot, are InvalidArgs; "interactive"
// comes from the message header. SD_LOGIND_SOFT_REBOOT, or
// SD_LOGIND_SOFT_REBOOT_IF_NEXTROOT_SET_UP with /run/nextroot set up, turns
// the reboot into a soft reboot.
func (m login1Manager) RebootWithFlags(msg dbus.Message, flags uint64) *dbus.Error {
	if err := signature(msg, "RebootWithFlags", "t"); err != nil {
		return err
	}
	l := m.l
	public := flagsPublic
	if l.NoSoftReboot {
		public = flagsPublicBeforeSoftReboot
	}
	if flags&^public != 0 {
		return dbus.NewError(errInvalidArgs, []any{"Invalid flags parameter"})
	}
	if flags&(FlagRebootViaKexec|FlagSoftReboot) == FlagRebootViaKexec|FlagSoftReboot {
		return dbus.NewError(errInvalidArgs, []any{"Both reboot via kexec and soft reboot selected, which is not supported"})
	}
	soft := flags&FlagSoftReboot != 0 || (flags&FlagSoftRebootIfNextrootSetUp != 0 && l.NextrootSetUp != nil && l.NextrootSetUp())
	return l.reboot(RebootCall{WithFlags: true, Flags: flags, Soft: soft,
		Interactive: msg.Flags&dbus.FlagAllowInteractiveAuthorization != 0})
}

func (l *Login1) reboot(c RebootCall) *dbus.Error {
	l.mu.Lock()
	l.reboots = append(l.reboots, c)
	cb := l.OnReboot
	if c.Soft {
		cb = l.OnSoftReboot
	}
	l.mu.Unlock()
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
