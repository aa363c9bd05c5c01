package text

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncateCutsAtRuneBoundaries(t *testing.T) {
	for _, c := range []struct {
		name, in string
		max      int
		want     string
	}{
		{"short enough", "abc", 10, "abc"},
		{"exactly max", "abcdef", 6, "abcdef"},
		{"ascii", "abcdefghij", 8, "abcde…"},
		{"cut inside a 3-byte rune backs off to its start", "ab日本語", 8, "ab日…"},
		{"cut inside a 4-byte rune", "a😀😀😀", 9, "a😀…"},
		{"invalid UTF-8 becomes U+FFFD", "a\xffb", 10, "a\uFFFDb"},
		{"a run of invalid bytes becomes one U+FFFD", "\xff\xff\xffabc", 6, "\uFFFDabc"},
		{"invalid UTF-8, then cut", "\xffabcdefg", 7, "\uFFFDa…"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Truncate(c.in, c.max); got != c.want {
				t.Fatalf("Truncate(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
			}
		})
	}
}

// Whatever the input, the result is valid UTF-8, at most limit bytes, survives
// a JSON round trip unchanged (what the API server stores is what was
// computed), and truncating it again changes nothing.
func TestTruncateIsStableThroughJSON(t *testing.T) {
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	pieces := []string{"a", "é", "日", "😀", "\xff", "\xe6\x97", " ", "…"}
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		for n := rng.IntN(60); n > 0; n-- {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		in, limit := b.String(), 3+rng.IntN(40)
		got := Truncate(in, limit)
		raw, _ := json.Marshal(got)
		var back string
		if err := json.Unmarshal(raw, &back); err != nil {
			t.Fatal(err)
		}
		if !utf8.ValidString(got) || len(got) > limit || back != got || Truncate(got, limit) != got {
			t.Fatalf("seed %d: Truncate(%q, %d) = %q (valid %v, %d bytes, after JSON %q, again %q)",
				seed, in, limit, got, utf8.ValidString(got), len(got), back, Truncate(got, limit))
		}
	}
}
