package host

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	"github.com/bootc-fleet/bootc-fleet/tests/fakedbus"
)

// hostBus starts a private bus with fake logind and systemd on it and dials
// it as the system bus.
func hostBus(t *testing.T, sd *fakedbus.Systemd1, l1 *fakedbus.Login1) *Systemd {
	t.Helper()
	addr := fakedbus.StartBus(t)
	if err := sd.Serve(addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sd.Close() })
	if err := l1.Serve(addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l1.Close() })
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := DialSystemd(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestSoftRebootsCount(t *testing.T) {
	tests := []struct {
		name          string
		fake          func() *fakedbus.Systemd1
		set           *uint32
		wantCount     uint32
		wantSupported bool
	}{
		{"systemd 254+ reports the count", func() *fakedbus.Systemd1 { return &fakedbus.Systemd1{SoftRebootsCount: 3} }, nil, 3, true},
		{"count after a soft reboot", func() *fakedbus.Systemd1 { return &fakedbus.Systemd1{} }, ptr(uint32(1)), 1, true},
		{"systemd 252 has no property", func() *fakedbus.Systemd1 { return &fakedbus.Systemd1{OmitSoftRebootsCount: true} }, nil, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sd := tc.fake()
			s := hostBus(t, sd, &fakedbus.Login1{})
			if tc.set != nil {
				sd.SetSoftRebootsCount(*tc.set)
			}
			n, ok, err := s.SoftRebootsCount(ctx(t))
			if err != nil || n != tc.wantCount || ok != tc.wantSupported {
				t.Fatalf("SoftRebootsCount = %d, %v, %v; want %d, %v, nil", n, ok, err, tc.wantCount, tc.wantSupported)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestSoftRebootsCountNoSystemd(t *testing.T) {
	// Nobody owns org.freedesktop.systemd1: an error, not "unsupported".
	addr := fakedbus.StartBus(t)
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", addr)
	s, err := DialSystemd(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, _, err := s.SoftRebootsCount(ctx(t)); !errors.Is(err, ErrDBus) {
		t.Fatalf("SoftRebootsCount = %v, want ErrDBus", err)
	}
	if err := s.Reboot(ctx(t)); !errors.Is(err, ErrDBus) {
		t.Fatalf("Reboot = %v, want ErrDBus", err)
	}
}

func TestUnknownPropertyErrorNames(t *testing.T) {
	for name, want := range map[string]bool{
		"org.freedesktop.DBus.Error.UnknownProperty":             true,
		"org.freedesktop.DBus.Properties.Error.PropertyNotFound": true,
		"org.freedesktop.DBus.Error.AccessDenied":                false,
		"org.freedesktop.DBus.Error.ServiceUnknown":              false,
	} {
		if got := unknownPropertyErrors[dbusErrorName(dbus.Error{Name: name})]; got != want {
			t.Errorf("%s counted as unknown property = %v, want %v", name, got, want)
		}
	}
}

func TestReboot(t *testing.T) {
	called := make(chan struct{}, 1)
	l1 := &fakedbus.Login1{OnReboot: func() { called <- struct{}{} }}
	sd := &fakedbus.Systemd1{}
	s := hostBus(t, sd, l1)
	if err := s.Reboot(ctx(t)); err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	select {
	case <-called:
	default:
		t.Fatal("OnReboot did not run during the call")
	}
	if got := l1.RebootArgs(); !reflect.DeepEqual(got, []bool{false}) {
		t.Errorf("logind Reboot calls %v, want one non-interactive call", got)
	}
	if len(sd.Started()) != 0 || l1.PowerOffs() != 0 {
		t.Errorf("Reboot also started %v / powered off %d times", sd.Started(), l1.PowerOffs())
	}
}

// A soft reboot goes through logind (RebootWithFlags with
// SD_LOGIND_SOFT_REBOOT, non-interactive), not by starting
// soft-reboot.target past logind's inhibitors.
func TestSoftReboot(t *testing.T) {
	called := make(chan struct{}, 1)
	l1 := &fakedbus.Login1{OnSoftReboot: func() { called <- struct{}{} }}
	sd := &fakedbus.Systemd1{}
	s := hostBus(t, sd, l1)
	if err := s.SoftReboot(ctx(t)); err != nil {
		t.Fatalf("SoftReboot: %v", err)
	}
	select {
	case <-called:
	default:
		t.Fatal("OnSoftReboot did not run during the call")
	}
	calls := l1.RebootCalls()
	want := []fakedbus.RebootCall{{WithFlags: true, Flags: fakedbus.FlagSoftReboot, Soft: true}}
	if !reflect.DeepEqual(calls, want) {
		t.Errorf("logind calls %+v, want %+v", calls, want)
	}
	if len(sd.Started()) != 0 || l1.Reboots() != 0 {
		t.Errorf("SoftReboot also started %v / rebooted fully %d times", sd.Started(), l1.Reboots())
	}
}

// On a logind without soft reboot (systemd < 254) the request is refused,
// and nothing reboots.
func TestSoftRebootRefusedByOldLogind(t *testing.T) {
	l1 := &fakedbus.Login1{NoSoftReboot: true}
	s := hostBus(t, &fakedbus.Systemd1{OmitSoftRebootsCount: true}, l1)
	err := s.SoftReboot(ctx(t))
	if !errors.Is(err, ErrDBus) || dbusErrorName(err) != "org.freedesktop.DBus.Error.InvalidArgs" {
		t.Fatalf("SoftReboot = %v, want ErrDBus carrying InvalidArgs", err)
	}
	if l1.Reboots()+l1.SoftReboots() != 0 {
		t.Fatal("a refused soft reboot rebooted")
	}
}
