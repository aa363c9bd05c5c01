package host

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/tests/fakedbus"
)

// The host's health as systemd reports it over a real dbus-daemon: the
// manager's state, the failed units (sorted, cut at 16, all counted),
// boot-complete.target and the required units, with a unit systemd has not
// loaded reporting "" and names that are not unit names not asked about.
func TestHostHealth(t *testing.T) {
	sd := &fakedbus.Systemd1{SystemState: "degraded"}
	for i := 20; i >= 1; i-- {
		if err := sd.SetUnit(fmt.Sprintf("bad-%02d.service", i), "failed"); err != nil {
			t.Fatal(err)
		}
	}
	for name, st := range map[string]string{"kubelet.service": "active", "crio.service": "activating", BootCompleteTarget: "active"} {
		if err := sd.SetUnit(name, st); err != nil {
			t.Fatal(err)
		}
	}
	s := hostBus(t, sd, &fakedbus.Login1{})
	h, err := s.HostHealth(ctx(t), []string{"kubelet.service", "crio.service", "absent.service", "bad-01.service", "not a unit", "kubelet.service"})
	if err != nil {
		t.Fatal(err)
	}
	var failed []string
	for i := 1; i <= fleetv1.MaxFailedUnits; i++ {
		failed = append(failed, fmt.Sprintf("bad-%02d.service", i))
	}
	want := Health{SystemState: fleetv1.SystemDegraded, FailedUnits: failed, FailedUnitsTotal: 20, BootComplete: "active",
		Units: []fleetv1.UnitState{{Name: "kubelet.service", ActiveState: "active"}, {Name: "crio.service", ActiveState: "activating"},
			{Name: "absent.service"}, {Name: "bad-01.service", ActiveState: "failed"}}}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("HostHealth =\n%+v\nwant\n%+v", h, want)
	}

	// The controls change what systemd says; a unit unloaded is "" again.
	sd.SetSystemState("running")
	for i := 1; i <= 20; i++ {
		sd.UnloadUnit(fmt.Sprintf("bad-%02d.service", i))
	}
	sd.UnloadUnit(BootCompleteTarget)
	if err := sd.SetUnit("crio.service", "active"); err != nil {
		t.Fatal(err)
	}
	h, err = s.HostHealth(ctx(t), []string{"crio.service"})
	if err != nil {
		t.Fatal(err)
	}
	want = Health{SystemState: fleetv1.SystemRunning, Units: []fleetv1.UnitState{{Name: "crio.service", ActiveState: "active"}}}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("HostHealth after the changes =\n%+v\nwant\n%+v", h, want)
	}
}

// A state the agent does not know is reported as unknown; a required-units
// list longer than the schema allows is cut.
func TestHostHealthBounds(t *testing.T) {
	sd := &fakedbus.Systemd1{SystemState: "rebooting-into-space"}
	s := hostBus(t, sd, &fakedbus.Login1{})
	var units []string
	for i := 0; i < 40; i++ {
		units = append(units, fmt.Sprintf("u%02d.service", i))
	}
	h, err := s.HostHealth(ctx(t), units)
	if err != nil {
		t.Fatal(err)
	}
	if h.SystemState != fleetv1.SystemUnknown || len(h.Units) != fleetv1.MaxRequiredUnits || h.BootComplete != "" {
		t.Fatalf("HostHealth = %+v; want state unknown, %d units, boot-complete.target not loaded", h, fleetv1.MaxRequiredUnits)
	}
}

// Without a systemd on the bus the read fails as a whole (no partial host).
func TestHostHealthNoSystemd(t *testing.T) {
	sd := &fakedbus.Systemd1{}
	s := hostBus(t, sd, &fakedbus.Login1{})
	sd.Close()
	if _, err := s.HostHealth(ctx(t), nil); !errors.Is(err, ErrDBus) {
		t.Fatalf("HostHealth without systemd: %v, want ErrDBus", err)
	}
}
