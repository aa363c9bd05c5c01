package fakedbus

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
)

func dial(t *testing.T, addr string) *dbus.Conn {
	t.Helper()
	conn, err := dbus.Connect(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestLogin1(t *testing.T) {
	addr := StartBus(t)
	var reboots atomic.Int32
	l := &Login1{OnReboot: func() { reboots.Add(1) }}
	if err := l.Serve(addr); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	obj := dial(t, addr).Object(Login1Name, Login1Path)
	if err := obj.Call(Login1Iface+".Reboot", 0, false).Err; err != nil {
		t.Fatal(err)
	}
	if err := obj.Call(Login1Iface+".PowerOff", 0, true).Err; err != nil {
		t.Fatal(err)
	}
	if l.Reboots() != 1 || reboots.Load() != 1 || l.PowerOffs() != 1 {
		t.Errorf("reboots %d (callback %d), poweroffs %d; want 1, 1, 1", l.Reboots(), reboots.Load(), l.PowerOffs())
	}
	if err := obj.Call(Login1Iface+".Reboot", 0, "yes").Err; err == nil {
		t.Error("Reboot with a string argument succeeded")
	}
	if err := obj.Call(Login1Iface+".Reboot", 0, uint32(0)).Err; err == nil {
		t.Error("Reboot with a u argument succeeded")
	}
	var xml string
	if err := obj.Call("org.freedesktop.DBus.Introspectable.Introspect", 0).Store(&xml); err != nil || !strings.Contains(xml, `name="Reboot"`) {
		t.Errorf("introspection %q, %v", xml, err)
	}
	// The name is owned: a second logind cannot start on the same bus.
	if err := (&Login1{}).Serve(addr); err == nil {
		t.Error("a second Login1 claimed org.freedesktop.login1")
	}
}

// RebootWithFlags follows logind's signature ("t") and flag checks
// (systemd src/login/logind-dbus.c, method_do_shutdown_or_sleep).
func TestLogin1RebootWithFlags(t *testing.T) {
	tests := []struct {
		name      string
		old       bool // logind before systemd 254
		arg       any
		nextroot  bool
		wantErr   string // D-Bus error name, "" for success
		wantMsg   string
		wantSoft  bool
		wantFlags uint64
	}{
		{"soft reboot", false, FlagSoftReboot, false, "", "", true, FlagSoftReboot},
		{"no flags is a reboot", false, uint64(0), false, "", "", false, 0},
		{"check inhibitors, full reboot", false, FlagRootCheckInhibitors, false, "", "", false, FlagRootCheckInhibitors},
		{"soft if nextroot set up, and it is", false, FlagSoftRebootIfNextrootSetUp, true, "", "", true, FlagSoftRebootIfNextrootSetUp},
		{"soft if nextroot set up, and it is not", false, FlagSoftRebootIfNextrootSetUp, false, "", "", false, FlagSoftRebootIfNextrootSetUp},
		{"unknown flag", false, uint64(1 << 5), false, errInvalidArgs, "Invalid flags parameter", false, 0},
		{"the internal interactive bit is not public", false, uint64(1 << 63), false, errInvalidArgs, "Invalid flags parameter", false, 0},
		{"kexec and soft together", false, FlagRebootViaKexec | FlagSoftReboot, false, errInvalidArgs, "Both reboot via kexec and soft reboot selected", false, 0},
		{"systemd 252 has no soft reboot flag", true, FlagSoftReboot, false, errInvalidArgs, "Invalid flags parameter", false, 0},
		{"wrong signature (b, as Reboot)", false, false, false, errInvalidArgs, "", false, 0},
		{"wrong signature (u)", false, uint32(4), false, errInvalidArgs, "Invalid arguments 'u' to call org.freedesktop.login1.Manager.RebootWithFlags(), expecting 't'.", false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr := StartBus(t)
			var full, soft atomic.Int32
			l := &Login1{NoSoftReboot: tc.old, OnReboot: func() { full.Add(1) }, OnSoftReboot: func() { soft.Add(1) },
				NextrootSetUp: func() bool { return tc.nextroot }}
			if err := l.Serve(addr); err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			err := dial(t, addr).Object(Login1Name, Login1Path).Call(Login1Iface+".RebootWithFlags", 0, tc.arg).Err
			if tc.wantErr != "" {
				var de dbus.Error
				if !errors.As(err, &de) || de.Name != tc.wantErr || !strings.Contains(fmt.Sprint(de.Body...), tc.wantMsg) {
					t.Fatalf("RebootWithFlags(%v) = %v (%T), want %s %q", tc.arg, err, err, tc.wantErr, tc.wantMsg)
				}
				if full.Load()+soft.Load() != 0 || len(l.RebootCalls()) != 0 {
					t.Fatalf("a refused call still rebooted (full %d, soft %d)", full.Load(), soft.Load())
				}
				return
			}
			if err != nil {
				t.Fatalf("RebootWithFlags(%v): %v", tc.arg, err)
			}
			wantSoft, wantFull := int32(0), int32(1)
			if tc.wantSoft {
				wantSoft, wantFull = 1, 0
			}
			calls := l.RebootCalls()
			if soft.Load() != wantSoft || full.Load() != wantFull || l.SoftReboots() != int(wantSoft) || l.Reboots() != int(wantFull) {
				t.Fatalf("soft %d (recorded %d), full %d (recorded %d); want %d, %d", soft.Load(), l.SoftReboots(), full.Load(), l.Reboots(), wantSoft, wantFull)
			}
			if len(calls) != 1 || !calls[0].WithFlags || calls[0].Flags != tc.wantFlags || calls[0].Interactive {
				t.Fatalf("calls %+v, want one non-interactive RebootWithFlags(%#x)", calls, tc.wantFlags)
			}
		})
	}
}

func TestSystemd1StartUnitEmitsJobRemoved(t *testing.T) {
	addr := StartBus(t)
	var soft atomic.Int32
	s := &Systemd1{OnSoftReboot: func() { soft.Add(1) }}
	if err := s.Serve(addr); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	conn := dial(t, addr)
	if err := conn.AddMatchSignal(dbus.WithMatchInterface(Systemd1Iface), dbus.WithMatchMember("JobRemoved")); err != nil {
		t.Fatal(err)
	}
	sigs := make(chan *dbus.Signal, 8)
	conn.Signal(sigs)
	obj := conn.Object(Systemd1Name, Systemd1Path)
	var job dbus.ObjectPath
	if err := obj.Call(Systemd1Iface+".StartUnit", 0, "soft-reboot.target", "replace-irreversibly").Store(&job); err != nil {
		t.Fatal(err)
	}
	select {
	case sig := <-sigs:
		if len(sig.Body) != 4 || sig.Body[1] != job || sig.Body[2] != "soft-reboot.target" || sig.Body[3] != "done" {
			t.Errorf("JobRemoved %v, want job %s done", sig.Body, job)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no JobRemoved")
	}
	if soft.Load() != 1 {
		t.Errorf("OnSoftReboot ran %d times", soft.Load())
	}
	if got := s.Started(); len(got) != 1 || got[0].Job != job || got[0].Mode != "replace-irreversibly" {
		t.Errorf("Started() = %+v", got)
	}
}

func TestSystemd1Property(t *testing.T) {
	addr := StartBus(t)
	s := &Systemd1{SoftRebootsCount: 2}
	if err := s.Serve(addr); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	old := &Systemd1{OmitSoftRebootsCount: true}
	obj := dial(t, addr).Object(Systemd1Name, Systemd1Path)
	get := func() (dbus.Variant, error) {
		var v dbus.Variant
		err := obj.Call("org.freedesktop.DBus.Properties.Get", 0, Systemd1Iface, "SoftRebootsCount").Store(&v)
		return v, err
	}
	if v, err := get(); err != nil || v.Value() != uint32(2) {
		t.Fatalf("SoftRebootsCount = %v, %v; want uint32 2", v, err)
	}
	s.SetSoftRebootsCount(5)
	if v, err := get(); err != nil || v.Value() != uint32(5) {
		t.Fatalf("after set SoftRebootsCount = %v, %v; want 5", v, err)
	}
	if err := obj.Call("org.freedesktop.DBus.Properties.Set", 0, Systemd1Iface, "SoftRebootsCount", dbus.MakeVariant(uint32(9))).Err; err == nil {
		t.Error("SoftRebootsCount writable over D-Bus")
	}

	// A second bus with an old systemd.
	addr2 := StartBus(t)
	if err := old.Serve(addr2); err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	var v dbus.Variant
	err := dial(t, addr2).Object(Systemd1Name, Systemd1Path).
		Call("org.freedesktop.DBus.Properties.Get", 0, Systemd1Iface, "SoftRebootsCount").Store(&v)
	var de dbus.Error
	if !errors.As(err, &de) || de.Name != ErrUnknownProperty {
		t.Fatalf("old systemd Get = %v (%T), want %s", err, err, ErrUnknownProperty)
	}
}

// fake-host-bus, as a harness runs it: address on stdout, a marker line and
// the configured program on each reboot.
func TestFakeHostBusCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/fake-host-bus")
	}
	if _, err := os.Stat(DaemonPath); err != nil {
		t.Skip("no dbus-daemon")
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "fake-host-bus")
	if out, err := exec.Command("go", "build", "-o", exe, "./cmd/fake-host-bus").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	marker := filepath.Join(dir, "marker")
	touched := filepath.Join(dir, "touched")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "--marker", marker, "--soft-reboots-count=4",
		"--on-reboot", "touch", "--on-reboot-arg", touched)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); cmd.Wait() }()
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	conn := dial(t, strings.TrimSpace(addr))
	if err := conn.Object(Login1Name, Login1Path).Call(Login1Iface+".Reboot", 0, false).Err; err != nil {
		t.Fatal(err)
	}
	// A soft reboot through logind, as `systemctl soft-reboot` asks.
	if err := conn.Object(Login1Name, Login1Path).Call(Login1Iface+".RebootWithFlags", 0, FlagSoftReboot).Err; err != nil {
		t.Fatal(err)
	}
	sd := conn.Object(Systemd1Name, Systemd1Path)
	// And one by starting the target directly.
	if err := sd.Call(Systemd1Iface+".StartUnit", 0, "soft-reboot.target", "replace-irreversibly").Err; err != nil {
		t.Fatal(err)
	}
	var v dbus.Variant
	if err := sd.Call("org.freedesktop.DBus.Properties.Get", 0, Systemd1Iface, "SoftRebootsCount").Store(&v); err != nil || v.Value() != uint32(6) {
		t.Errorf("SoftRebootsCount after two soft reboots = %v, %v; want 6", v, err)
	}
	data, err := os.ReadFile(marker)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "reboot ") || !strings.HasPrefix(lines[1], "soft-reboot ") || !strings.HasPrefix(lines[2], "soft-reboot ") {
		t.Errorf("marker %q, want a reboot then two soft-reboot lines", lines)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(touched); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("--on-reboot program did not run")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
