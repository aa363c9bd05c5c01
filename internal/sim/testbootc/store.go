package testbootc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Files in a state directory.
const (
	StateFile       = "state.json"
	LockFile        = "lock"
	SysrootLockFile = "sysroot.lock" // ostree's sysroot lock (/sysroot/ostree/lock)
	InvocationsFile = "invocations.jsonl"
	HangPIDsFile    = "hang.pids"   // pids of a hanging switch and its child
	SignalsFile     = "signals.log" // signals a hanging switch received
	DefaultBootID   = "boot_id"     // default boot-id file name
)

// EnvState names the state directory the executable uses.
const EnvState = "BOOTC_TEST_STATE"

// Dir is a state directory: a JSON state file updated atomically under an
// flock, plus logs. Every executable invocation goes through it.
type Dir string

// Init creates dir and writes s as its state. An empty s.BootIDFile becomes
// dir/boot_id; the boot ID is written there.
func Init(dir string, s State) (Dir, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	d := Dir(abs)
	if s.BootIDFile == "" {
		s.BootIDFile = filepath.Join(abs, DefaultBootID)
	}
	m := NewMachine(s)
	unlock, err := d.lock()
	if err != nil {
		return "", err
	}
	defer unlock()
	if err := d.save(m); err != nil {
		return "", err
	}
	return d, writeFileAtomic(m.s.BootIDFile, []byte(m.s.BootID+"\n"))
}

// Path returns a file of the directory.
func (d Dir) Path(name string) string { return filepath.Join(string(d), name) }

// Update loads the machine under the lock, runs fn, and saves the result
// (also when fn fails, so a consumed Failure knob sticks). A reboot writes
// the new boot ID to the boot-id file.
func (d Dir) Update(fn func(*Machine) error) error {
	unlock, err := d.lock()
	if err != nil {
		return err
	}
	defer unlock()
	m, err := d.load()
	if err != nil {
		return err
	}
	before := m.s.BootID
	fnErr := fn(m)
	if err := d.save(m); err != nil {
		return err
	}
	if m.s.BootID != before && m.s.BootIDFile != "" {
		if err := writeFileAtomic(m.s.BootIDFile, []byte(m.s.BootID+"\n")); err != nil {
			return err
		}
	}
	return fnErr
}

// Machine returns a snapshot of the stored machine.
func (d Dir) Machine() (*Machine, error) {
	unlock, err := d.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return d.load()
}

// Configure changes the stored knobs.
func (d Dir) Configure(fn func(*Knobs)) error {
	return d.Update(func(m *Machine) error { m.Configure(fn); return nil })
}

// Reboot plays a reboot on the stored machine and returns the new boot ID.
func (d Dir) Reboot(opts RebootOptions) (string, error) {
	var id string
	err := d.Update(func(m *Machine) error { id = m.Reboot(opts); return nil })
	return id, err
}

// Invocation is one run of the executable.
type Invocation struct {
	Time time.Time `json:"time"`
	Args []string  `json:"args"` // argv without argv[0]
}

// Invocations returns every recorded invocation, oldest first.
func (d Dir) Invocations() ([]Invocation, error) {
	f, err := os.Open(d.Path(InvocationsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Invocation
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var inv Invocation
		if err := json.Unmarshal(sc.Bytes(), &inv); err != nil {
			return nil, fmt.Errorf("%s: %w", InvocationsFile, err)
		}
		out = append(out, inv)
	}
	return out, sc.Err()
}

// HangPIDs returns the pids a hanging switch recorded (itself, then its child).
func (d Dir) HangPIDs() ([]int, error) {
	data, err := os.ReadFile(d.Path(HangPIDsFile))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		p, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", HangPIDsFile, err)
		}
		pids = append(pids, p)
	}
	return pids, nil
}

// Signals returns the signals a hanging switch received, one per line.
func (d Dir) Signals() ([]string, error) {
	data, err := os.ReadFile(d.Path(SignalsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return strings.Fields(string(data)), err
}

func (d Dir) record(args []string) error {
	line, err := json.Marshal(Invocation{Time: time.Now().UTC(), Args: args})
	if err != nil {
		return err
	}
	unlock, err := d.lock()
	if err != nil {
		return err
	}
	defer unlock()
	f, err := os.OpenFile(d.Path(InvocationsFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (d Dir) lock() (func(), error) {
	f, err := os.OpenFile(d.Path(LockFile), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("flock %s: %w", f.Name(), err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// LockSysroot takes the sysroot lock file exclusively, polling so that ctx
// can end the wait (ostree_sysroot_lock blocks on flock of
// /sysroot/ostree/lock).
func (d Dir) LockSysroot(ctx context.Context) (func(), error) {
	f, err := os.OpenFile(d.Path(SysrootLockFile), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("flock %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (d Dir) load() (*Machine, error) {
	data, err := os.ReadFile(d.Path(StateFile))
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", d.Path(StateFile), err)
	}
	return NewMachine(s), nil
}

// save writes the state only when it changed: like bootc, a status read
// leaves the deployment directories alone, so watchers see no change.
func (d Dir) save(m *Machine) error {
	data, err := json.MarshalIndent(m.State(), "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if old, err := os.ReadFile(d.Path(StateFile)); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return writeFileAtomic(d.Path(StateFile), data)
}

func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Mem is a Store in memory, for harnesses that run many hosts in one
// process: the same command line and the same sysroot lock as Dir, over one
// Machine.
type Mem struct {
	M       *Machine
	sysroot chan struct{}
	mu      sync.Mutex
	invs    []Invocation
}

// NewMem returns a store over m.
func NewMem(m *Machine) *Mem { return &Mem{M: m, sysroot: make(chan struct{}, 1)} }

// Update runs fn on the machine (whose methods lock it themselves).
func (s *Mem) Update(fn func(*Machine) error) error { return fn(s.M) }

// LockSysroot waits for the sysroot lock until ctx ends.
func (s *Mem) LockSysroot(ctx context.Context) (func(), error) {
	select {
	case s.sysroot <- struct{}{}:
		return func() { <-s.sysroot }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Run runs a bootc command line over the store and records it (it is the
// agent's bootc.Runner for in-process hosts).
func (s *Mem) Run(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	s.mu.Lock()
	s.invs = append(s.invs, Invocation{Time: time.Now().UTC(), Args: append([]string(nil), args...)})
	s.mu.Unlock()
	return Exec(ctx, s, args, stdout, stderr), nil
}

// Invocations returns every command line Exec ran, oldest first.
func (s *Mem) Invocations() []Invocation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Invocation(nil), s.invs...)
}
