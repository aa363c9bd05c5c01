package sim

import (
	"bytes"
	"os"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// traceFollower reads the trace file every run of a node's agent appends
// to (--trace-file), from its start, handing each complete JSON line to
// on exactly once, in order.
type traceFollower struct {
	on    func([]byte)
	syncs chan chan struct{}
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

// followTrace creates path if need be and follows it until close.
func followTrace(path string, on func([]byte)) (*traceFollower, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	w, err := fsnotify.NewWatcher()
	if err == nil {
		err = w.Add(path)
	}
	if err != nil {
		f.Close()
		if w != nil {
			w.Close()
		}
		return nil, err
	}
	t := &traceFollower{on: on, syncs: make(chan chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go t.run(f, w)
	return t, nil
}

// traceFollowEvery is how often the file is read for new lines when no
// write event came (a safety net: inotify reports every write); sync reads
// at once.
const traceFollowEvery = time.Second

func (t *traceFollower) run(f *os.File, w *fsnotify.Watcher) {
	defer close(t.done)
	defer f.Close()
	defer w.Close()
	var partial []byte
	buf := make([]byte, 64<<10)
	drain := func() {
		for {
			k, err := f.Read(buf)
			partial = append(partial, buf[:k]...)
			for {
				i := bytes.IndexByte(partial, '\n')
				if i < 0 {
					break
				}
				t.on(partial[:i])
				partial = partial[i+1:]
			}
			if k == 0 || err != nil {
				return
			}
		}
	}
	tick := time.NewTicker(traceFollowEvery)
	defer tick.Stop()
	for {
		drain()
		select {
		case reply := <-t.syncs:
			drain()
			close(reply)
		case <-t.stop:
			drain()
			return
		case <-w.Events:
		case <-w.Errors:
		case <-tick.C:
		}
	}
}

// sync returns once every line written before it was called was handed on.
func (t *traceFollower) sync() {
	reply := make(chan struct{})
	select {
	case t.syncs <- reply:
		<-reply
	case <-t.done:
	}
}

// close reads what is left and stops following.
func (t *traceFollower) close() {
	t.once.Do(func() { close(t.stop) })
	<-t.done
}
