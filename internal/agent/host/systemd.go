package host

import (
	"context"
	"errors"
	"fmt"

	"github.com/godbus/dbus/v5"
)

const (
	systemdName  = "org.freedesktop.systemd1"
	systemdPath  = dbus.ObjectPath("/org/freedesktop/systemd1")
	systemdIface = "org.freedesktop.systemd1.Manager"
	login1Name   = "org.freedesktop.login1"
	login1Path   = dbus.ObjectPath("/org/freedesktop/login1")
	login1Iface  = "org.freedesktop.login1.Manager"
)

// Errors of Systemd methods wrap one of these.
var (
	ErrDBus     = errors.New("D-Bus call failed")
	ErrBadReply = errors.New("unexpected D-Bus reply")
)

// Systemd talks to systemd and logind over the system bus
// ($DBUS_SYSTEM_BUS_ADDRESS when set). It is safe for concurrent use.
type Systemd struct {
	conn *dbus.Conn
}

// DialSystemd opens a private connection to the system bus. ctx bounds the
// dial only, not the connection's life (which ends with Close).
func DialSystemd(ctx context.Context) (*Systemd, error) {
	type result struct {
		conn *dbus.Conn
		err  error
	}
	res := make(chan result, 1)
	go func() {
		conn, err := dbus.ConnectSystemBus()
		res <- result{conn, err}
	}()
	select {
	case r := <-res:
		if r.err != nil {
			return nil, fmt.Errorf("%w: connecting to the system bus: %w", ErrDBus, r.err)
		}
		return &Systemd{conn: r.conn}, nil
	case <-ctx.Done():
		go func() {
			if r := <-res; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, fmt.Errorf("%w: connecting to the system bus: %w", ErrDBus, ctx.Err())
	}
}

// Close closes the connection.
func (s *Systemd) Close() error { return s.conn.Close() }

// Names systemd versions use for a property they do not have.
var unknownPropertyErrors = map[string]bool{
	"org.freedesktop.DBus.Error.UnknownProperty":             true, // sd-bus
	"org.freedesktop.DBus.Properties.Error.PropertyNotFound": true, // godbus services
	"org.freedesktop.DBus.Error.InvalidArgs":                 true, // old GDBus-style services
}

// SoftRebootsCount returns systemd's Manager.SoftRebootsCount. Systemd
// before 254 has no such property: then it returns 0, false, nil.
func (s *Systemd) SoftRebootsCount(ctx context.Context) (count uint32, supported bool, err error) {
	var v dbus.Variant
	err = s.conn.Object(systemdName, systemdPath).
		CallWithContext(ctx, "org.freedesktop.DBus.Properties.Get", 0, systemdIface, "SoftRebootsCount").
		Store(&v)
	if err != nil {
		if unknownPropertyErrors[dbusErrorName(err)] {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("%w: reading SoftRebootsCount: %w", ErrDBus, err)
	}
	n, ok := v.Value().(uint32)
	if !ok {
		return 0, false, fmt.Errorf("%w: SoftRebootsCount has type %s, want u", ErrBadReply, v.Signature())
	}
	return n, true, nil
}

// Reboot asks logind to reboot now (Manager.Reboot(false): no interactive
// authorization). It returns once logind accepted the request.
func (s *Systemd) Reboot(ctx context.Context) error {
	call := s.conn.Object(login1Name, login1Path).CallWithContext(ctx, login1Iface+".Reboot", 0, false)
	if call.Err != nil {
		return fmt.Errorf("%w: logind Reboot: %w", ErrDBus, call.Err)
	}
	return nil
}

// sdLogindSoftReboot is SD_LOGIND_SOFT_REBOOT, the RebootWithFlags flag
// that makes logind perform a userspace-only (soft) reboot (systemd
// src/basic/login-util.h: UINT64_C(1) << 2; logind accepts it since v254).
// logind checks the flags in src/login/logind-dbus.c,
// method_do_shutdown_or_sleep: unknown bits are InvalidArgs ("Invalid flags
// parameter"), and a soft reboot then passes logind's inhibitor and polkit
// checks (verify_shutdown_creds) before logind starts soft-reboot.target.
const sdLogindSoftReboot uint64 = 1 << 2

// SoftReboot asks logind for a soft reboot now:
// Manager.RebootWithFlags(SD_LOGIND_SOFT_REBOOT), as `systemctl soft-reboot`
// does, so logind's inhibitors (the kubelet's graceful node shutdown takes a
// delay lock) hold it like a full reboot. The *WithFlags methods take
// "interactive" from the message header's ALLOW_INTERACTIVE_AUTHORIZATION
// flag instead of an argument; the call does not set it, which is Reboot's
// interactive=false. It returns once logind accepted the request; whether
// the soft reboot enters the new deployment depends on /run/nextroot, which
// `bootc upgrade --from-downloaded --soft-reboot=auto` prepares.
func (s *Systemd) SoftReboot(ctx context.Context) error {
	call := s.conn.Object(login1Name, login1Path).CallWithContext(ctx, login1Iface+".RebootWithFlags", 0, sdLogindSoftReboot)
	if call.Err != nil {
		return fmt.Errorf("%w: logind RebootWithFlags(SD_LOGIND_SOFT_REBOOT): %w", ErrDBus, call.Err)
	}
	return nil
}

// dbusErrorName returns the D-Bus error name carried by err, if any.
func dbusErrorName(err error) string {
	var v dbus.Error
	if errors.As(err, &v) {
		return v.Name
	}
	var p *dbus.Error
	if errors.As(err, &p) && p != nil {
		return p.Name
	}
	return ""
}
