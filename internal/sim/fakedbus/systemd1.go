package fakedbus

import (
	"fmt"
	"sync"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/introspect"
	"github.com/godbus/dbus/v5/prop"
)

// systemd's names.
const (
	Systemd1Name  = "org.freedesktop.systemd1"
	Systemd1Path  = dbus.ObjectPath("/org/freedesktop/systemd1")
	Systemd1Iface = "org.freedesktop.systemd1.Manager"

	// SoftRebootTarget is the unit a soft reboot starts.
	SoftRebootTarget = "soft-reboot.target"

	// ErrUnknownProperty is what systemd (sd-bus) answers for a property it
	// does not have, e.g. SoftRebootsCount on systemd 252.
	ErrUnknownProperty = "org.freedesktop.DBus.Error.UnknownProperty"
)

// StartedUnit records one StartUnit call.
type StartedUnit struct {
	Name, Mode string
	Job        dbus.ObjectPath
}

// Systemd1 is a fake systemd Manager: the SoftRebootsCount and SystemState
// properties, StartUnit, which answers with a job path and then emits
// JobRemoved, and the units the health gate reads (units.go).
type Systemd1 struct {
	// SystemState is the initial manager state (default "running").
	SystemState string
	// OmitSoftRebootsCount hides the property, like systemd before 254.
	OmitSoftRebootsCount bool
	// SoftRebootsCount is the initial property value.
	SoftRebootsCount uint32
	// JobResult is the result JobRemoved reports (default "done").
	JobResult string
	// OnSoftReboot runs inside StartUnit("soft-reboot.target", ...).
	OnSoftReboot func()
	// OnStartUnit runs inside every StartUnit call.
	OnStartUnit func(name, mode string)

	mu      sync.Mutex
	units   map[string]*unit
	listErr string
	started []StartedUnit
	jobSeq  uint32
	conn    *dbus.Conn
	props   *prop.Properties
	signals chan jobRemoved
	done    chan struct{}
}

type jobRemoved struct {
	id     uint32
	job    dbus.ObjectPath
	unit   string
	result string
}

// Serve connects to the bus at addr, exports the Manager and claims
// org.freedesktop.systemd1.
func (s *Systemd1) Serve(addr string) error {
	conn, err := connect(addr)
	if err != nil {
		return err
	}
	props := map[string]*prop.Prop{}
	if !s.OmitSoftRebootsCount {
		props["SoftRebootsCount"] = &prop.Prop{Value: s.SoftRebootsCount, Emit: prop.EmitTrue}
	}
	s.mu.Lock()
	if s.SystemState == "" {
		s.SystemState = DefaultSystemState
	}
	props["SystemState"] = &prop.Prop{Value: s.SystemState, Emit: prop.EmitTrue}
	s.mu.Unlock()
	p, err := prop.Export(conn, Systemd1Path, prop.Map{Systemd1Iface: props})
	if err != nil {
		conn.Close()
		return err
	}
	// Answer unknown properties the way sd-bus does.
	if err := conn.Export(properties{p}, Systemd1Path, "org.freedesktop.DBus.Properties"); err != nil {
		conn.Close()
		return err
	}
	if err := conn.Export(systemd1Manager{s}, Systemd1Path, Systemd1Iface); err != nil {
		conn.Close()
		return err
	}
	node := &introspect.Node{
		Name: string(Systemd1Path),
		Interfaces: []introspect.Interface{
			introspect.IntrospectData,
			prop.IntrospectData,
			{
				Name:       Systemd1Iface,
				Properties: p.Introspection(Systemd1Iface),
				Methods: append([]introspect.Method{
					{Name: "StartUnit", Args: []introspect.Arg{
						{Name: "name", Type: "s", Direction: "in"},
						{Name: "mode", Type: "s", Direction: "in"},
						{Name: "job", Type: "o", Direction: "out"},
					}},
					{Name: "Subscribe"},
					{Name: "Unsubscribe"},
				}, unitMethods...),
				Signals: []introspect.Signal{{Name: "JobRemoved", Args: []introspect.Arg{
					{Name: "id", Type: "u"}, {Name: "job", Type: "o"}, {Name: "unit", Type: "s"}, {Name: "result", Type: "s"},
				}}},
			},
		},
	}
	if err := conn.Export(introspect.NewIntrospectable(node), Systemd1Path, "org.freedesktop.DBus.Introspectable"); err != nil {
		conn.Close()
		return err
	}
	s.mu.Lock()
	s.conn, s.props = conn, p
	s.signals = make(chan jobRemoved, 64)
	s.done = make(chan struct{})
	err = s.exportUnits()
	s.mu.Unlock()
	if err != nil {
		s.Close()
		return err
	}
	go s.emit(conn, s.signals, s.done)
	if err := claim(conn, Systemd1Name); err != nil {
		s.Close()
		return err
	}
	return nil
}

// emit sends JobRemoved signals in order, after StartUnit has answered
// (the buffered queue decouples them from the method call).
func (s *Systemd1) emit(conn *dbus.Conn, q <-chan jobRemoved, done chan<- struct{}) {
	defer close(done)
	for j := range q {
		_ = conn.Emit(Systemd1Path, Systemd1Iface+".JobRemoved", j.id, j.job, j.unit, j.result)
	}
}

// SetSoftRebootsCount changes the property (and emits PropertiesChanged).
// It has no effect when the property is omitted.
func (s *Systemd1) SetSoftRebootsCount(n uint32) {
	s.mu.Lock()
	p := s.props
	s.SoftRebootsCount = n
	s.mu.Unlock()
	if p != nil && !s.OmitSoftRebootsCount {
		p.SetMust(Systemd1Iface, "SoftRebootsCount", n)
	}
}

// CurrentSoftRebootsCount returns the property's current value.
func (s *Systemd1) CurrentSoftRebootsCount() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.SoftRebootsCount
}

// Started returns every StartUnit call so far.
func (s *Systemd1) Started() []StartedUnit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]StartedUnit(nil), s.started...)
}

// Close releases the name and the connection.
func (s *Systemd1) Close() error {
	s.mu.Lock()
	conn, q, done := s.conn, s.signals, s.done
	s.conn, s.signals = nil, nil
	s.mu.Unlock()
	if conn == nil {
		return nil
	}
	close(q)
	<-done
	return conn.Close()
}

type systemd1Manager struct{ s *Systemd1 }

func (m systemd1Manager) StartUnit(name, mode string) (dbus.ObjectPath, *dbus.Error) {
	s := m.s
	s.mu.Lock()
	s.jobSeq++
	id := s.jobSeq
	job := dbus.ObjectPath(fmt.Sprintf("%s/job/%d", Systemd1Path, id))
	s.started = append(s.started, StartedUnit{Name: name, Mode: mode, Job: job})
	result := s.JobResult
	if result == "" {
		result = "done"
	}
	onStart, onSoft := s.OnStartUnit, s.OnSoftReboot
	s.mu.Unlock()
	if onStart != nil {
		onStart(name, mode)
	}
	if name == SoftRebootTarget && onSoft != nil {
		onSoft()
	}
	s.mu.Lock()
	if s.signals != nil { // not closed
		s.signals <- jobRemoved{id: id, job: job, unit: name, result: result}
	}
	s.mu.Unlock()
	return job, nil
}

func (m systemd1Manager) Subscribe() *dbus.Error   { return nil }
func (m systemd1Manager) Unsubscribe() *dbus.Error { return nil }

// properties wraps prop.Properties so a missing property gets sd-bus's
// error name, which is what clients see on a real systemd.
type properties struct{ p *prop.Properties }

func (w properties) Get(iface, name string) (dbus.Variant, *dbus.Error) {
	v, err := w.p.Get(iface, name)
	if err != nil && err.Name == prop.ErrPropNotFound.Name {
		return v, dbus.NewError(ErrUnknownProperty, []any{"Unknown property or interface."})
	}
	return v, err
}

func (w properties) GetAll(iface string) (map[string]dbus.Variant, *dbus.Error) {
	return w.p.GetAll(iface)
}

func (w properties) Set(iface, name string, v dbus.Variant) *dbus.Error {
	return w.p.Set(iface, name, v)
}
