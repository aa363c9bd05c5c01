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

	softRebootTarget = "soft-reboot.target"
)

// Errors of Systemd methods wrap one of these.
var (
	ErrDBus      = errors.New("D-Bus call failed")
	ErrJobFailed = errors.New("systemd job did not complete")
	ErrBadReply  = errors.New("unexpected D-Bus reply")
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

// SoftReboot starts soft-reboot.target with mode replace-irreversibly and
// waits for the job's result; anything but "done" is an error.
func (s *Systemd) SoftReboot(ctx context.Context) error {
	// Listen before starting the job, so its JobRemoved cannot be missed.
	match := []dbus.MatchOption{
		dbus.WithMatchSender(systemdName),
		dbus.WithMatchObjectPath(systemdPath),
		dbus.WithMatchInterface(systemdIface),
		dbus.WithMatchMember("JobRemoved"),
	}
	if err := s.conn.AddMatchSignalContext(ctx, match...); err != nil {
		return fmt.Errorf("%w: subscribing to JobRemoved: %w", ErrDBus, err)
	}
	defer s.conn.RemoveMatchSignalContext(context.WithoutCancel(ctx), match...)
	sigs := make(chan *dbus.Signal, 64)
	s.conn.Signal(sigs)
	defer s.conn.RemoveSignal(sigs)

	var job dbus.ObjectPath
	err := s.conn.Object(systemdName, systemdPath).
		CallWithContext(ctx, systemdIface+".StartUnit", 0, softRebootTarget, "replace-irreversibly").
		Store(&job)
	if err != nil {
		return fmt.Errorf("%w: StartUnit %s: %w", ErrDBus, softRebootTarget, err)
	}
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for job %s: %w", job, ctx.Err())
		case sig, ok := <-sigs:
			if !ok {
				return fmt.Errorf("%w: connection closed while waiting for job %s", ErrDBus, job)
			}
			if sig.Name != systemdIface+".JobRemoved" || sig.Path != systemdPath || len(sig.Body) != 4 {
				continue
			}
			if p, _ := sig.Body[1].(dbus.ObjectPath); p != job {
				continue
			}
			result, _ := sig.Body[3].(string)
			if result != "done" {
				return fmt.Errorf("%w: %s job %s: %q", ErrJobFailed, softRebootTarget, job, result)
			}
			return nil
		}
	}
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
