package fakedbus

import (
	"errors"
	"testing"

	"github.com/godbus/dbus/v5"
)

// The health methods answer with systemd's signatures and error names
// (man org.freedesktop.systemd1): ListUnitsFiltered a(ssssssouso), GetUnit o
// or org.freedesktop.systemd1.NoSuchUnit, the unit object's ActiveState s at
// systemd's escaped path.
func TestSystemd1Units(t *testing.T) {
	addr := StartBus(t)
	sd := &Systemd1{}
	if err := sd.SetUnit("kubelet.service", "active"); err != nil {
		t.Fatal(err)
	}
	if err := sd.Serve(addr); err != nil {
		t.Fatal(err)
	}
	defer sd.Close()
	if err := sd.SetUnit("bad@x-1.service", "failed"); err != nil {
		t.Fatal(err)
	}
	conn := dial(t, addr)
	mgr := conn.Object(Systemd1Name, Systemd1Path)
	call := mgr.Call(Systemd1Iface+".ListUnitsFiltered", 0, []string{"failed"})
	if call.Err != nil {
		t.Fatal(call.Err)
	}
	if sig := dbus.SignatureOf([]ListedUnit{}).String(); sig != "a(ssssssouso)" {
		t.Fatalf("ListUnitsFiltered reply signature %q, want a(ssssssouso)", sig)
	}
	var units []ListedUnit
	if err := call.Store(&units); err != nil || len(units) != 1 || units[0].Name != "bad@x-1.service" || units[0].ActiveState != "failed" {
		t.Fatalf("failed units %+v, %v", units, err)
	}
	if want := dbus.ObjectPath("/org/freedesktop/systemd1/unit/bad_40x_2d1_2eservice"); units[0].Path != want {
		t.Fatalf("unit path %q, want %q", units[0].Path, want)
	}
	var path dbus.ObjectPath
	if err := mgr.Call(Systemd1Iface+".GetUnit", 0, "kubelet.service").Store(&path); err != nil {
		t.Fatal(err)
	}
	var v dbus.Variant
	if err := conn.Object(Systemd1Name, path).Call("org.freedesktop.DBus.Properties.Get", 0, Systemd1UnitIface, "ActiveState").Store(&v); err != nil || v.Value() != "active" {
		t.Fatalf("ActiveState %v, %v", v, err)
	}
	err := mgr.Call(Systemd1Iface+".GetUnit", 0, "absent.service").Err
	var e dbus.Error
	if !errors.As(err, &e) || e.Name != ErrNoSuchUnit {
		t.Fatalf("GetUnit of an unloaded unit: %v, want %s", err, ErrNoSuchUnit)
	}
	if err := mgr.Call("org.freedesktop.DBus.Properties.Get", 0, Systemd1Iface, "SystemState").Store(&v); err != nil || v.Value() != DefaultSystemState {
		t.Fatalf("SystemState %v, %v", v, err)
	}
}
