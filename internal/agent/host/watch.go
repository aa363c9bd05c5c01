package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watch sends on the returned channel when any of paths changes and every
// poll interval (poll <= 0: no polling). The channel has capacity 1 and
// coalesces: a receiver that was busy sees one pending signal, never a
// backlog. It is closed when ctx ends.
//
// A path may not exist yet: Watch then watches its nearest existing parent
// and moves down as directories appear. A directory path is watched one
// level deep (entries created, written, removed); the poll covers the rest.
func Watch(ctx context.Context, paths []string, poll time.Duration) (<-chan struct{}, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching %v: %w", paths, err)
	}
	ws := &watchSet{w: w, exists: map[string]bool{}}
	for _, p := range paths {
		abs, err := filepath.Abs(p)
		if err != nil {
			w.Close()
			return nil, err
		}
		ws.targets = append(ws.targets, filepath.Clean(abs))
	}
	if _, err := ws.rearm(); err != nil {
		w.Close()
		return nil, err
	}
	out := make(chan struct{}, 1)
	go ws.run(ctx, poll, out)
	return out, nil
}

type watchSet struct {
	w       *fsnotify.Watcher
	targets []string
	exists  map[string]bool
}

func (ws *watchSet) run(ctx context.Context, poll time.Duration, out chan struct{}) {
	defer close(out)
	defer ws.w.Close()
	var tick <-chan time.Time
	if poll > 0 {
		t := time.NewTicker(poll)
		defer t.Stop()
		tick = t.C
	}
	notify := func() {
		select {
		case out <- struct{}{}:
		default: // one signal already pending
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			notify()
		case ev, ok := <-ws.w.Events:
			if !ok {
				return
			}
			appeared, _ := ws.rearm()
			if appeared || ws.relevant(ev.Name) {
				notify()
			}
		case err, ok := <-ws.w.Errors:
			if !ok {
				return
			}
			// An overflow means events were lost: re-read to be safe.
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				notify()
			}
		}
	}
}

// relevant reports whether an event on name concerns a target: the target
// itself or an entry inside a target directory.
func (ws *watchSet) relevant(name string) bool {
	name = filepath.Clean(name)
	for _, t := range ws.targets {
		if name == t || strings.HasPrefix(name, t+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

// rearm makes sure each target's parent (or nearest existing ancestor) and
// each existing target directory are watched. It reports whether a target
// appeared or vanished since the last call (the events that created it may
// have happened before its directory was watched).
//
// The parent's watch is added before the target is looked at: a target
// created after the look then raises an event on the new watch, and one
// created before it is seen by the look. Looking first would lose a target
// created between the look and the watch.
func (ws *watchSet) rearm() (changed bool, err error) {
	for _, t := range ws.targets {
		if err := ws.watchNearestAncestor(t); err != nil {
			return changed, err
		}
		fi, statErr := os.Stat(t)
		exists := statErr == nil
		if exists != ws.exists[t] {
			changed = true
			ws.exists[t] = exists
		}
		if exists && fi.IsDir() {
			if e := ws.w.Add(t); e != nil && !errors.Is(e, os.ErrNotExist) {
				return changed, fmt.Errorf("watching %s: %w", t, e)
			}
		}
	}
	return changed, nil
}

func (ws *watchSet) watchNearestAncestor(t string) error {
	dir := filepath.Dir(t)
	for {
		e := ws.w.Add(dir)
		if e == nil {
			return nil
		}
		if !errors.Is(e, os.ErrNotExist) && !errors.Is(e, os.ErrPermission) {
			return fmt.Errorf("watching %s: %w", dir, e)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return fmt.Errorf("watching %s: no existing parent", t)
		}
		dir = parent
	}
}
