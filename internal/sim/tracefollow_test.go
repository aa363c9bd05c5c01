package sim

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// TestFollowTraceReadsEachStepOnce appends lines to a trace file in pieces
// cut at random places, as successive agent runs would (each opening the
// file O_APPEND), and checks that after each sync every complete line was
// handed on exactly once, in order, and a partial one not yet.
func TestFollowTraceReadsEachStepOnce(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	var got []string
	tr, err := followTrace(path, func(l []byte) { got = append(got, string(l)) })
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for run := range 3 {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		var text string
		for i := range 20 {
			l := fmt.Sprintf(`{"kind":"stage","run":%d,"i":%d}`, run, i)
			want = append(want, l)
			text += l + "\n"
		}
		for len(text) > 0 {
			k := 1 + rng.IntN(min(len(text), 40))
			if _, err := f.WriteString(text[:k]); err != nil {
				t.Fatal(err)
			}
			text = text[k:]
			tr.sync()
			// got is written by the follower only; sync orders it before us.
			complete := len(want) - countLines(text)
			if len(got) != complete {
				t.Fatalf("seed %d: after a write, %d lines handed on, want %d", seed, len(got), complete)
			}
		}
		f.Close()
	}
	tr.close()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("seed %d: line %d = %q, want %q", seed, i, got[i], want[i])
		}
	}
}

func countLines(s string) int {
	n := 0
	for _, c := range s {
		if c == '\n' {
			n++
		}
	}
	return n
}
