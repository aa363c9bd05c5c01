package agent

import (
	"encoding/json"
	"io"
	"log/slog"
	"sync"
)

// NewTraceWriter returns a Deps.Trace that writes each Step to w as one JSON
// line, in one Write call, so a reader following an O_APPEND file never sees
// two steps interleaved. A failed write is logged once and does not stop the
// agent: the trace is a record for tests and audits, never a gate.
func NewTraceWriter(w io.Writer, log *slog.Logger) func(Step) {
	var (
		mu     sync.Mutex
		warned bool
	)
	return func(s Step) {
		b, err := json.Marshal(s)
		if err == nil {
			mu.Lock()
			_, err = w.Write(append(b, '\n'))
			mu.Unlock()
		}
		if err != nil && !warned {
			warned = true
			log.Warn("cannot write the step trace; going on without it", "err", err)
		}
	}
}
