package testbootc

import (
	"context"
	"testing"
)

// Build is tests/testbootc.Build for this package's own tests, which cannot
// import it (it imports this package).
func Build(tb testing.TB) string {
	tb.Helper()
	out, err := BuildExecutable(context.Background(), tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	return out
}
