// Package text shortens strings for API fields and messages a person reads.
// Both programs store what it returns and compare it with what they read
// back, so it returns only valid UTF-8 (the API server's JSON would turn
// any invalid byte into U+FFFD, and the value read back would never equal
// the one computed) and cuts only at a rune boundary.
package text

import (
	"strings"
	"unicode/utf8"
)

// Ellipsis ends a shortened string.
const Ellipsis = "…"

// Truncate returns s made valid UTF-8 (each run of invalid bytes becomes one
// U+FFFD) and, if that is longer than limit
// bytes, cut at the last rune boundary that leaves room for Ellipsis, which
// it then ends with. The result is at most limit bytes (for limit >= 3) and a
// fixed point: Truncate(Truncate(s, n), n) == Truncate(s, n).
func Truncate(s string, limit int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, string(utf8.RuneError))
	}
	if len(s) <= limit {
		return s
	}
	cut := limit - len(Ellipsis)
	if cut < 0 {
		cut = 0
	}
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + Ellipsis
}

// ShortDigest abbreviates a digest for messages: sha256:ab12cd34ef56….
func ShortDigest(d string) string {
	if len(d) > len("sha256:")+12 {
		return d[:len("sha256:")+12] + Ellipsis
	}
	return d
}
