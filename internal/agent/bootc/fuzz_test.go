package bootc

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
)

func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/spec-*.json")
	for _, p := range files {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(doc(APIVersionV1, Kind, `{"booted":`+okEntry+`}`)))
	f.Add([]byte(`{}`))
	f.Add([]byte(doc(APIVersionV1, Kind, `{"booted":`+okEntry+`,"rollback":`+okEntry+`,"rollbackQueued":true}`)))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			return
		}
		if s.APIVersion != APIVersionV1 && s.APIVersion != APIVersionV1Alpha1 {
			t.Fatalf("accepted apiVersion %q", s.APIVersion)
		}
		if s.RollbackQueued && s.Rollback == nil {
			t.Fatal("accepted a queued rollback without a rollback deployment")
		}
		for _, e := range []*Entry{s.Booted, s.Staged, s.Rollback} {
			if e == nil {
				continue
			}
			if e.Image != "" && !imageref.IsDigest(e.Digest) {
				t.Fatalf("accepted digest %q", e.Digest)
			}
			if e.Image == "" && e.Digest != "" {
				t.Fatalf("digest %q without image", e.Digest)
			}
			if p, err := e.Pinned(); err == nil {
				if _, err := imageref.ParsePinned(p.String()); err != nil {
					t.Fatalf("Pinned() gave invalid %q: %v", p, err)
				}
			}
		}
	})
}
