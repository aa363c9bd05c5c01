package host

import (
	"context"
	"fmt"
	"regexp"
	"sort"

	"github.com/godbus/dbus/v5"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// What the health gate reads from systemd (docs/design.md, amendment 24):
// the manager's SystemState, the failed units, and the ActiveState of
// boot-complete.target and of the units the pool requires. The method and
// property names and signatures are systemd's (man
// org.freedesktop.systemd1, src/core/dbus-manager.c): Manager.SystemState
// (s), Manager.ListUnitsFiltered(as states) -> a(ssssssouso), Manager.GetUnit
// (s name) -> o, and Unit.ActiveState (s) on the unit's object.

const (
	unitIface = "org.freedesktop.systemd1.Unit"
	// errNoSuchUnit is systemd's answer to GetUnit for a unit it has not
	// loaded (BUS_ERROR_NO_SUCH_UNIT, src/libsystemd/sd-bus/bus-common-errors.h).
	errNoSuchUnit = "org.freedesktop.systemd1.NoSuchUnit"
	// BootCompleteTarget is the target images using systemd's boot
	// assessment order their checks before (man systemd.special).
	BootCompleteTarget = "boot-complete.target"
	// maxListedUnits bounds what ListUnitsFiltered may return before the
	// reply is refused as not a host's.
	maxListedUnits = 1000000
)

// unitNameRE is the schema's unit name (fleetv1.NodeHealthSpec.RequiredUnits).
var unitNameRE = regexp.MustCompile(`^[A-Za-z0-9:_.\\@-]+\.(service|socket|target|mount|path|timer|scope|slice|swap|device|automount)$`)

// stateRE is an ActiveState as the schema takes it.
var stateRE = regexp.MustCompile(`^[a-z]{1,32}$`)

// ValidUnitName reports whether name is a unit name the agent asks about.
func ValidUnitName(name string) bool { return len(name) <= 255 && unitNameRE.MatchString(name) }

// Health is the host's state as systemd reports it, bounded and validated
// for BootcNode status.host (without the boot, which the caller adds).
type Health struct {
	SystemState      fleetv1.SystemState
	FailedUnits      []string // sorted, at most fleetv1.MaxFailedUnits
	FailedUnitsTotal int32
	BootComplete     string
	Units            []fleetv1.UnitState
}

// HostHealth reads the manager's state, its failed units, and the
// ActiveState of boot-complete.target and of each unit in units (names that
// are not unit names, and any past fleetv1.MaxRequiredUnits, are skipped; a
// unit systemd has not loaded reports ""). Any D-Bus error fails the whole
// read: a partial picture of the host is not reported.
func (s *Systemd) HostHealth(ctx context.Context, units []string) (Health, error) {
	var h Health
	state, err := s.managerString(ctx, "SystemState")
	if err != nil {
		return Health{}, err
	}
	h.SystemState = systemState(state)
	if h.FailedUnits, h.FailedUnitsTotal, err = s.failedUnits(ctx); err != nil {
		return Health{}, err
	}
	if h.BootComplete, err = s.activeState(ctx, BootCompleteTarget); err != nil {
		return Health{}, err
	}
	seen := map[string]bool{}
	for _, u := range units {
		if len(h.Units) == fleetv1.MaxRequiredUnits {
			break
		}
		if !ValidUnitName(u) || seen[u] {
			continue
		}
		seen[u] = true
		st, err := s.activeState(ctx, u)
		if err != nil {
			return Health{}, err
		}
		h.Units = append(h.Units, fleetv1.UnitState{Name: u, ActiveState: st})
	}
	return h, nil
}

// systemState maps the manager's state onto the schema's enum; a state this
// agent does not know is "unknown".
func systemState(s string) fleetv1.SystemState {
	switch st := fleetv1.SystemState(s); st {
	case fleetv1.SystemInitializing, fleetv1.SystemStarting, fleetv1.SystemRunning, fleetv1.SystemDegraded,
		fleetv1.SystemMaintenance, fleetv1.SystemStopping, fleetv1.SystemOffline:
		return st
	}
	return fleetv1.SystemUnknown
}

func (s *Systemd) managerString(ctx context.Context, name string) (string, error) {
	var v dbus.Variant
	err := s.conn.Object(systemdName, systemdPath).
		CallWithContext(ctx, "org.freedesktop.DBus.Properties.Get", 0, systemdIface, name).Store(&v)
	if err != nil {
		return "", callErr("reading "+name, err)
	}
	str, ok := v.Value().(string)
	if !ok {
		return "", fmt.Errorf("%w: %s has type %s, want s", ErrBadReply, name, v.Signature())
	}
	return str, nil
}

// listedUnit is one entry of ListUnits*: name, description, load state,
// active state, sub state, followed unit, unit path, job ID, job type, job path.
type listedUnit struct {
	Name, Description, LoadState, ActiveState, SubState, Following string
	Path                                                           dbus.ObjectPath
	JobID                                                          uint32
	JobType                                                        string
	JobPath                                                        dbus.ObjectPath
}

// failedUnits lists the units in state failed: the names sorted, at most
// fleetv1.MaxFailedUnits of them, and how many there are.
func (s *Systemd) failedUnits(ctx context.Context) ([]string, int32, error) {
	var list []listedUnit
	err := s.conn.Object(systemdName, systemdPath).
		CallWithContext(ctx, systemdIface+".ListUnitsFiltered", 0, []string{"failed"}).Store(&list)
	if err != nil {
		return nil, 0, callErr("ListUnitsFiltered([failed])", err)
	}
	if len(list) > maxListedUnits {
		return nil, 0, fmt.Errorf("%w: ListUnitsFiltered returned %d units", ErrBadReply, len(list))
	}
	var names []string
	for _, u := range list {
		if u.ActiveState == "failed" && len(u.Name) <= 255 && u.Name != "" {
			names = append(names, u.Name)
		}
	}
	sort.Strings(names)
	total := int32(len(names))
	if len(names) > fleetv1.MaxFailedUnits {
		names = names[:fleetv1.MaxFailedUnits]
	}
	return names, total, nil
}

// activeState is the unit's ActiveState, "" when systemd has not loaded it.
func (s *Systemd) activeState(ctx context.Context, unit string) (string, error) {
	var path dbus.ObjectPath
	err := s.conn.Object(systemdName, systemdPath).CallWithContext(ctx, systemdIface+".GetUnit", 0, unit).Store(&path)
	if err != nil {
		if dbusErrorName(err) == errNoSuchUnit {
			return "", nil
		}
		return "", callErr("GetUnit("+unit+")", err)
	}
	if !path.IsValid() {
		return "", fmt.Errorf("%w: GetUnit(%s) returned %q", ErrBadReply, unit, path)
	}
	var v dbus.Variant
	err = s.conn.Object(systemdName, path).
		CallWithContext(ctx, "org.freedesktop.DBus.Properties.Get", 0, unitIface, "ActiveState").Store(&v)
	if err != nil {
		return "", callErr("reading "+unit+" ActiveState", err)
	}
	st, ok := v.Value().(string)
	if !ok {
		return "", fmt.Errorf("%w: %s ActiveState has type %s, want s", ErrBadReply, unit, v.Signature())
	}
	if !stateRE.MatchString(st) {
		return "", fmt.Errorf("%w: %s ActiveState %q", ErrBadReply, unit, truncate(st, 40))
	}
	return st, nil
}

// callErr wraps a failed call with the D-Bus error's name, which says more
// than its message (e.g. org.freedesktop.DBus.Error.AccessDenied).
func callErr(op string, err error) error {
	if name := dbusErrorName(err); name != "" {
		return fmt.Errorf("%w: %s: %s: %w", ErrDBus, op, name, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrDBus, op, err)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
