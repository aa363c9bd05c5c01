package bootc

import (
	"os"
	"testing"
)

// BenchmarkParse reads a real staged + booted status document.
func BenchmarkParse(b *testing.B) {
	doc, err := os.ReadFile("testdata/spec-staged-booted.json")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(doc); err != nil {
			b.Fatal(err)
		}
	}
}
