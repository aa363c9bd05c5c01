package record

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
)

func sample() Record {
	return Record{
		Grant:           lease.ID{Lease: "pool-reboot-0", UID: "3f1c", Transitions: 4},
		Image:           "quay.io/example/os@sha256:" + strings.Repeat("ab", 32),
		BootID:          "11111111-2222-3333-4444-555555555555",
		SoftRebootCount: 2,
		Soft:            true,
		Recorded:        time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
	}
}

func TestReadAbsentIsNoRecord(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	r, err := s.Read()
	if r != nil || err != nil {
		t.Fatalf("Read = %v, %v; want nil, nil", r, err)
	}
	if err := s.Clear(); err != nil {
		t.Fatalf("Clear of an absent record: %v", err)
	}
	if err := (Store{Dir: filepath.Join(t.TempDir(), "missing")}).Clear(); err != nil {
		t.Fatalf("Clear in a missing directory: %v", err)
	}
}

func TestWriteReadClearRoundTrip(t *testing.T) {
	s := Store{Dir: filepath.Join(t.TempDir(), "state")}
	want := sample()
	if err := s.Write(want); err != nil {
		t.Fatal(err)
	}
	got, err := s.Read()
	if err != nil || got == nil || *got != want {
		t.Fatalf("Read = %+v, %v; want %+v", got, err, want)
	}
	entries, _ := os.ReadDir(s.Dir)
	if len(entries) != 1 {
		t.Fatalf("state dir holds %d files after a write, want only the record (no temp files)", len(entries))
	}
	if err := s.Clear(); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Read(); got != nil || err != nil {
		t.Fatalf("Read after Clear = %v, %v", got, err)
	}
}

func TestWriteRefusesInvalidRecords(t *testing.T) {
	for name, mut := range map[string]func(*Record){
		"unpinned image": func(r *Record) { r.Image = "quay.io/example/os:latest" },
		"bad boot ID":    func(r *Record) { r.BootID = "yesterday" },
		"no lease":       func(r *Record) { r.Grant.Lease = "" },
		"no record time": func(r *Record) { r.Recorded = time.Time{} },
	} {
		t.Run(name, func(t *testing.T) {
			r := sample()
			mut(&r)
			s := Store{Dir: t.TempDir()}
			if err := s.Write(r); err == nil {
				t.Fatal("Write accepted an invalid record")
			}
		})
	}
}

func TestBadFilesReadAsCorruptNeverAsNoRecord(t *testing.T) {
	good := func(t *testing.T) []byte {
		s := Store{Dir: t.TempDir()}
		if err := s.Write(sample()); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(s.path(RecordFile))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name string
		data func(t *testing.T) []byte
	}{
		{"empty file (torn before the first byte)", func(*testing.T) []byte { return nil }},
		{"truncated in the middle (torn write)", func(t *testing.T) []byte { b := good(t); return b[:len(b)/2] }},
		{"truncated by one byte before the closing brace", func(t *testing.T) []byte {
			b := good(t)
			return b[:len(b)-2]
		}},
		{"garbage", func(*testing.T) []byte { return []byte("\x00\x01not json at all") }},
		{"wrong checksum", func(t *testing.T) []byte {
			return []byte(strings.Replace(string(good(t)), `"soft":true`, `"soft":false`, 1))
		}},
		{"unknown version", func(t *testing.T) []byte {
			return []byte(strings.Replace(string(good(t)), `"version":1`, `"version":2`, 1))
		}},
		{"payload without checksum", func(*testing.T) []byte {
			return []byte(`{"version":1,"payload":{"image":"x"}}`)
		}},
		{"valid envelope around an invalid record", func(*testing.T) []byte {
			// the checksum is sha256("{}"): only the record check rejects it
			return []byte(`{"version":1,"payload":{},"sha256":"44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"}`)
		}},
		{"trailing data after the envelope", func(t *testing.T) []byte { return append(good(t), []byte("{}")...) }},
		{"too large", func(*testing.T) []byte { return make([]byte, maxFile+10) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := Store{Dir: t.TempDir()}
			if err := os.WriteFile(s.path(RecordFile), tc.data(t), 0o600); err != nil {
				t.Fatal(err)
			}
			r, err := s.Read()
			if r != nil || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Read = %+v, %v; want nil, ErrCorrupt", r, err)
			}
		})
	}
}

func TestSpentListIsDurableAndBounded(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	if ids, err := s.Spent(); ids != nil || err != nil {
		t.Fatalf("Spent on an empty dir = %v, %v", ids, err)
	}
	for i := range maxSpent + 3 {
		id := lease.ID{Lease: "pool-reboot-0", UID: "u", Transitions: int32(i + 1)}
		if err := s.AddSpent(id); err != nil {
			t.Fatal(err)
		}
		if err := s.AddSpent(id); err != nil { // adding twice keeps one entry
			t.Fatal(err)
		}
	}
	ids, err := s.Spent()
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != maxSpent || ids[len(ids)-1].Transitions != maxSpent+3 || ids[0].Transitions != 4 {
		t.Fatalf("Spent = %v; want the newest %d", ids, maxSpent)
	}
	if err := os.WriteFile(s.path(SpentFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Spent(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Spent on a torn file: %v, want ErrCorrupt", err)
	}
	if err := s.AddSpent(lease.ID{Lease: "x"}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("AddSpent over a torn file: %v, want ErrCorrupt (never overwrite what we cannot read)", err)
	}
}
