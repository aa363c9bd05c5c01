package fakedbus

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/introspect"
	"github.com/godbus/dbus/v5/prop"
)

// The part of systemd's Manager the health gate reads, with systemd's
// names and signatures (man org.freedesktop.systemd1;
// src/core/dbus-manager.c): the SystemState property (s), ListUnitsFiltered
// (as) -> a(ssssssouso), GetUnit (s) -> o, which answers
// org.freedesktop.systemd1.NoSuchUnit for a unit not loaded, and each
// loaded unit's object with org.freedesktop.systemd1.Unit's ActiveState (s).

const (
	// Systemd1UnitIface is a unit object's interface.
	Systemd1UnitIface = "org.freedesktop.systemd1.Unit"
	// ErrNoSuchUnit is systemd's answer to GetUnit for a unit it has not loaded.
	ErrNoSuchUnit = "org.freedesktop.systemd1.NoSuchUnit"
	// DefaultSystemState is the manager's state unless set.
	DefaultSystemState = "running"
)

// UnitPath is the object path systemd gives a unit: its name with every
// byte but [A-Za-z0-9] escaped as _xx (src/basic/unit-name.c,
// unit_dbus_path_from_name; src/libsystemd/sd-bus/bus-util.c, bus_label_escape).
func UnitPath(name string) dbus.ObjectPath {
	var b strings.Builder
	b.WriteString(string(Systemd1Path) + "/unit/")
	if name == "" {
		b.WriteString("_")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "_%02x", c)
		}
	}
	return dbus.ObjectPath(b.String())
}

// ListedUnit is one entry of ListUnitsFiltered's reply (ssssssouso).
type ListedUnit struct {
	Name, Description, LoadState, ActiveState, SubState, Following string
	Path                                                           dbus.ObjectPath
	JobID                                                          uint32
	JobType                                                        string
	JobPath                                                        dbus.ObjectPath
}

// unit is one loaded unit of the fake manager.
type unit struct {
	active string
	props  *prop.Properties
}

// SetSystemState sets the manager's SystemState (and emits PropertiesChanged).
func (s *Systemd1) SetSystemState(state string) {
	s.mu.Lock()
	s.SystemState = state
	p := s.props
	s.mu.Unlock()
	if p != nil {
		p.SetMust(Systemd1Iface, "SystemState", state)
	}
}

// SetUnit loads a unit with this ActiveState (active, failed, inactive,
// activating, ...), or changes its state; GetUnit then finds it and
// ListUnitsFiltered lists it.
func (s *Systemd1) SetUnit(name, activeState string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.units == nil {
		s.units = map[string]*unit{}
	}
	if u, ok := s.units[name]; ok {
		u.active = activeState
		if u.props != nil {
			u.props.SetMust(Systemd1UnitIface, "ActiveState", activeState)
		}
		return nil
	}
	u := &unit{active: activeState}
	s.units[name] = u
	if s.conn != nil {
		return s.exportUnit(name, u)
	}
	return nil
}

// UnloadUnit forgets a unit: GetUnit answers NoSuchUnit again.
func (s *Systemd1) UnloadUnit(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.units[name]; !ok {
		return
	}
	delete(s.units, name)
	if s.conn != nil {
		path := UnitPath(name)
		_ = s.conn.Export(nil, path, "org.freedesktop.DBus.Properties")
	}
}

// exportUnit puts u's object on the bus (s.mu held).
func (s *Systemd1) exportUnit(name string, u *unit) error {
	p, err := prop.Export(s.conn, UnitPath(name), prop.Map{Systemd1UnitIface: {
		"Id":          {Value: name},
		"ActiveState": {Value: u.active, Emit: prop.EmitTrue},
	}})
	if err != nil {
		return err
	}
	u.props = p
	return nil
}

// exportUnits exports the manager's health methods' introspection and the
// units set before Serve (s.mu held).
func (s *Systemd1) exportUnits() error {
	for name, u := range s.units {
		if err := s.exportUnit(name, u); err != nil {
			return err
		}
	}
	return nil
}

// unitMethods are the health methods' introspection.
var unitMethods = []introspect.Method{
	{Name: "ListUnitsFiltered", Args: []introspect.Arg{
		{Name: "states", Type: "as", Direction: "in"},
		{Name: "units", Type: "a(ssssssouso)", Direction: "out"},
	}},
	{Name: "GetUnit", Args: []introspect.Arg{
		{Name: "name", Type: "s", Direction: "in"},
		{Name: "unit", Type: "o", Direction: "out"},
	}},
}

// FailListUnits makes ListUnitsFiltered answer with this D-Bus error name
// (e.g. org.freedesktop.DBus.Error.AccessDenied); "" answers again.
func (s *Systemd1) FailListUnits(errName string) {
	s.mu.Lock()
	s.listErr = errName
	s.mu.Unlock()
}

// ListUnitsFiltered lists the loaded units whose load, active or sub state
// is one of states (systemd matches all three); the fake's sub state is its
// active state and every unit is loaded.
func (m systemd1Manager) ListUnitsFiltered(states []string) ([]ListedUnit, *dbus.Error) {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listErr != "" {
		return nil, dbus.NewError(s.listErr, []any{"refused by the test"})
	}
	out := []ListedUnit{}
	for name, u := range s.units {
		if len(states) > 0 && !slices.Contains(states, u.active) && !slices.Contains(states, "loaded") {
			continue
		}
		out = append(out, ListedUnit{Name: name, LoadState: "loaded", ActiveState: u.active, SubState: u.active,
			Path: UnitPath(name), JobPath: "/"})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// GetUnit returns a loaded unit's object path.
func (m systemd1Manager) GetUnit(name string) (dbus.ObjectPath, *dbus.Error) {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.units[name]; !ok {
		return "", dbus.NewError(ErrNoSuchUnit, []any{"Unit " + name + " not loaded."})
	}
	return UnitPath(name), nil
}
