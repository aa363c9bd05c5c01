// Package record keeps the agent's durable reboot record: the grant it is
// about to spend on a reboot, written before the reboot so that a restarted
// agent never reboots twice for one grant (docs/design.md, "Spent").
//
// A file is an envelope {"version":1,"payload":{...},"sha256":"<hex>"} whose
// checksum covers the payload bytes. A torn, corrupt or unknown file reads as
// ErrCorrupt, never as "no record": the caller must then not act.
package record

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
)

// Version is the envelope version this package writes and reads.
const Version = 1

// File names in the state directory.
const (
	RecordFile = "reboot-record.json"
	SpentFile  = "spent-grants.json"
)

// maxSpent bounds the spent list; a node holds one reboot grant at a time,
// so a handful of past grants is plenty.
const maxSpent = 16

// maxFile bounds what Read accepts.
const maxFile = 64 << 10

// ErrCorrupt is returned for a file that exists but cannot be trusted.
var ErrCorrupt = errors.New("reboot record corrupt")

// Record is the grant about to be spent on a reboot, with the boot it was
// written in.
type Record struct {
	Grant           lease.ID  `json:"grant"`
	Image           string    `json:"image"`
	BootID          string    `json:"bootID"`
	SoftRebootCount uint32    `json:"softRebootCount"`
	Soft            bool      `json:"soft"`
	Recorded        time.Time `json:"recorded"`
	// Rollback: the reboot is into the rollback deployment under a
	// rollback grant (amendment 25). Absent in records of older agents.
	Rollback bool `json:"rollback,omitempty"`
}

func (r *Record) validate() error {
	switch {
	case r.Grant.Lease == "":
		return errors.New("no grant lease")
	case !lease.ValidBootID(r.BootID):
		return fmt.Errorf("boot ID %q", r.BootID)
	case r.Recorded.IsZero():
		return errors.New("no time")
	}
	if _, err := imageref.ParsePinned(r.Image); err != nil {
		return err
	}
	return nil
}

// Store is a state directory.
type Store struct {
	Dir string
}

type envelope struct {
	Version int             `json:"version"`
	Payload json.RawMessage `json:"payload"`
	SHA256  string          `json:"sha256"`
}

// Read returns the record, (nil, nil) when there is none, or an error
// wrapping ErrCorrupt when the file cannot be trusted.
func (s Store) Read() (*Record, error) {
	var r Record
	ok, err := s.read(RecordFile, &r)
	if err != nil || !ok {
		return nil, err
	}
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, s.path(RecordFile), err)
	}
	return &r, nil
}

// Write replaces the record durably: temp file, fsync, rename, fsync of the
// directory. When it returns nil the record survives a crash.
func (s Store) Write(r Record) error {
	if err := r.validate(); err != nil {
		return fmt.Errorf("refusing to write an invalid reboot record: %w", err)
	}
	return s.write(RecordFile, r)
}

// Clear removes the record durably. Clearing an absent record is not an error.
func (s Store) Clear() error {
	err := os.Remove(s.path(RecordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("removing reboot record: %w", err)
	}
	return syncDir(s.Dir)
}

// Spent returns the reboot grants already spent by a reboot in an earlier
// boot (nil when none), or an error wrapping ErrCorrupt.
func (s Store) Spent() ([]lease.ID, error) {
	var ids []lease.ID
	if _, err := s.read(SpentFile, &ids); err != nil {
		return nil, err
	}
	return ids, nil
}

// AddSpent durably adds id to the spent list (keeping the newest entries).
func (s Store) AddSpent(id lease.ID) error {
	ids, err := s.Spent()
	if err != nil {
		return err
	}
	for _, have := range ids {
		if have == id {
			return nil
		}
	}
	ids = append(ids, id)
	if len(ids) > maxSpent {
		ids = ids[len(ids)-maxSpent:]
	}
	return s.write(SpentFile, ids)
}

func (s Store) path(name string) string { return filepath.Join(s.Dir, name) }

func (s Store) read(name string, into any) (bool, error) {
	p := s.path(name)
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", p, err)
	}
	defer f.Close()
	data, err := readLimited(f)
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", p, err)
	}
	corrupt := func(why string, a ...any) (bool, error) {
		return false, fmt.Errorf("%w: %s: %s", ErrCorrupt, p, fmt.Sprintf(why, a...))
	}
	var env envelope
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return corrupt("%v", err)
	}
	if dec.More() {
		return corrupt("trailing data")
	}
	if env.Version != Version {
		return corrupt("unknown version %d", env.Version)
	}
	sum := sha256.Sum256(env.Payload)
	if env.SHA256 != hex.EncodeToString(sum[:]) {
		return corrupt("checksum mismatch")
	}
	pd := json.NewDecoder(bytes.NewReader(env.Payload))
	pd.DisallowUnknownFields()
	if err := pd.Decode(into); err != nil {
		return corrupt("payload: %v", err)
	}
	return true, nil
}

func readLimited(f *os.File) ([]byte, error) {
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(f, maxFile+1))
	if err != nil {
		return nil, err
	}
	if n > maxFile {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrCorrupt, maxFile)
	}
	return buf.Bytes(), nil
}

func (s Store) write(name string, v any) error {
	payload, err := json.Marshal(v)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(payload)
	data, err := json.Marshal(envelope{Version: Version, Payload: payload, SHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("creating state directory: %w", err)
	}
	tmp, err := os.CreateTemp(s.Dir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", name, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("syncing %s: %w", name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), s.path(name)); err != nil {
		return fmt.Errorf("renaming %s: %w", name, err)
	}
	return syncDir(s.Dir)
}

// syncDir makes a rename or remove in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening state directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing state directory: %w", err)
	}
	return nil
}
