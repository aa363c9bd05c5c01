package notifysock

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

func send(t *testing.T, path, msg string) {
	t.Helper()
	if err := Send(path, msg); err != nil {
		t.Fatal(err)
	}
}

func TestWaitPrefixTimesOut(t *testing.T) {
	s, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	send(t, s.Path, "STATUS=x")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := WaitPrefix(ctx, s.Messages(), "READY=1"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("WaitPrefix = %v, want ErrTimeout", err)
	}
	if _, err := WaitPrefixTimeout(s.Messages(), "READY=1", 10*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("WaitPrefixTimeout = %v, want ErrTimeout", err)
	}
	if got := s.All(); len(got) != 1 || got[0] != "STATUS=x" {
		t.Errorf("All() = %q", got)
	}
	dir := s.dir
	s.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("socket dir %s left behind", dir)
	}
}
