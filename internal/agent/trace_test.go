package agent_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/lease"
	"github.com/bootc-fleet/bootc-fleet/internal/agent"
)

func TestTraceWriterWritesOneJSONLinePerStep(t *testing.T) {
	var out bytes.Buffer
	trace := agent.NewTraceWriter(&out, slog.New(slog.DiscardHandler))
	at := time.Date(2026, 12, 3, 8, 0, 0, 123, time.UTC)
	steps := []agent.Step{
		{Time: at, Kind: "stage", Lease: "s-0", ResourceVersion: "42", Grant: lease.ID{Lease: "s-0", UID: "u", Transitions: 3},
			Image: "quay.io/x@sha256:" + strings.Repeat("a", 64), BootID: "b1"},
		{Time: at, Kind: agent.StepStageEnded, Lease: "s-0", Image: "img", Outcome: agent.StageCancelled},
		{Time: at, Kind: "soft-reboot", Lease: "r-0", ResourceVersion: "7", Image: "img", BootID: "b1", SoftRebootCount: 2},
	}
	for _, s := range steps {
		trace(s)
	}
	sc := bufio.NewScanner(&out)
	var got []agent.Step
	for sc.Scan() {
		var s agent.Step
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got = append(got, s)
	}
	if len(got) != len(steps) {
		t.Fatalf("read %d steps, wrote %d", len(got), len(steps))
	}
	for i := range steps {
		if got[i] != steps[i] {
			t.Errorf("step %d: read back %+v, wrote %+v", i, got[i], steps[i])
		}
	}
}

type failingWriter struct{ writes int }

func (w *failingWriter) Write([]byte) (int, error) { w.writes++; return 0, errors.New("disk full") }

func TestTraceWriterGoesOnAfterAFailedWrite(t *testing.T) {
	var logs bytes.Buffer
	w := &failingWriter{}
	trace := agent.NewTraceWriter(w, slog.New(slog.NewTextHandler(&logs, nil)))
	trace(agent.Step{Kind: "stage"})
	trace(agent.Step{Kind: "apply"})
	if w.writes != 2 {
		t.Errorf("writes = %d, want 2: a failure must not stop later steps", w.writes)
	}
	if n := strings.Count(logs.String(), "cannot write the step trace"); n != 1 {
		t.Errorf("warned %d times, want once:\n%s", n, logs.String())
	}
}
