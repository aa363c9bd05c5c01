// Package notifysock is a real sd_notify receiver for simulated hosts: a
// unixgram socket to point NOTIFY_SOCKET at, delivering each datagram as a
// string. tests/notifysock adds the helpers tests bind it with.
package notifysock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Socket is a bound notify socket.
type Socket struct {
	Path string
	msgs chan string
	conn *net.UnixConn
	dir  string
	once sync.Once
	done chan struct{}

	mu   sync.Mutex
	seen []string
}

// Open binds a unixgram socket in a new short directory under /tmp (socket
// paths must fit in 108 bytes, test temp dirs often do not).
func Open() (*Socket, error) {
	dir, err := os.MkdirTemp("/tmp", "ns")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "n")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("binding %s: %w", path, err)
	}
	s := &Socket{Path: path, msgs: make(chan string, 1024), conn: conn, dir: dir, done: make(chan struct{})}
	go s.read()
	return s, nil
}

func (s *Socket) read() {
	defer close(s.done)
	defer close(s.msgs)
	buf := make([]byte, 64<<10)
	for {
		n, _, err := s.conn.ReadFromUnix(buf)
		if err != nil {
			return
		}
		m := string(buf[:n])
		s.mu.Lock()
		s.seen = append(s.seen, m)
		s.mu.Unlock()
		select {
		case s.msgs <- m:
		default: // a reader that never reads must not block the socket
		}
	}
}

// Messages delivers each datagram in arrival order; closed by Close.
func (s *Socket) Messages() <-chan string { return s.msgs }

// All returns every datagram received so far.
func (s *Socket) All() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seen...)
}

// Close unbinds the socket and removes its directory.
func (s *Socket) Close() error {
	var err error
	s.once.Do(func() {
		err = s.conn.Close()
		<-s.done
		os.RemoveAll(s.dir)
	})
	return err
}

// ErrTimeout is returned when no matching message arrived in time.
var ErrTimeout = errors.New("no matching notify message")

// WaitPrefix reads from msgs until a datagram with one line starting with
// prefix arrives, and returns that datagram. Other datagrams are skipped.
func WaitPrefix(ctx context.Context, msgs <-chan string, prefix string) (string, error) {
	for {
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%w %q: %w", ErrTimeout, prefix, ctx.Err())
		case m, ok := <-msgs:
			if !ok {
				return "", fmt.Errorf("%w %q: socket closed", ErrTimeout, prefix)
			}
			for _, line := range strings.Split(m, "\n") {
				if strings.HasPrefix(line, prefix) {
					return m, nil
				}
			}
		}
	}
}

// WaitPrefixTimeout is WaitPrefix with a timeout.
func WaitPrefixTimeout(msgs <-chan string, prefix string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return WaitPrefix(ctx, msgs, prefix)
}

// Send sends one datagram to the socket at path, as sd_notify does.
func Send(path, msg string) error {
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte(msg))
	return err
}
