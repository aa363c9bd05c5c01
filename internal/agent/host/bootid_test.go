package host

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadBootID(t *testing.T) {
	const id = "4a1c2f9e-7d3b-4c55-9e1a-0b2c3d4e5f60"
	tests := []struct {
		name    string
		content string
		want    string
		wantErr error
	}{
		{"kernel format with newline", id + "\n", id, nil},
		{"surrounding space", "  " + id + " \n", id, nil},
		{"empty", "", "", ErrInvalidBootID},
		{"uppercase", strings.ToUpper(id) + "\n", "", ErrInvalidBootID},
		{"no dashes", strings.ReplaceAll(id, "-", "") + "\n", "", ErrInvalidBootID},
		{"two IDs", id + "\n" + id + "\n", "", ErrInvalidBootID},
		{"huge file", strings.Repeat("a", 1<<16), "", ErrInvalidBootID},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "boot_id")
			if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := ReadBootID(p)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("ReadBootID = %q, %v; want %v", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ReadBootID = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		if _, err := ReadBootID(filepath.Join(t.TempDir(), "nope")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("err = %v, want ErrNotExist", err)
		}
	})
	t.Run("this machine", func(t *testing.T) {
		if _, err := os.Stat(DefaultBootIDPath); err != nil {
			t.Skip("no", DefaultBootIDPath)
		}
		if _, err := ReadBootID(""); err != nil {
			t.Fatalf("ReadBootID(default): %v", err)
		}
	})
}
