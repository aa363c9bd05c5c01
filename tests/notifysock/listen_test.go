package notifysock

import (
	"github.com/bootc-fleet/bootc-fleet/internal/sim/notifysock"
	"os"
	"testing"
)

func send(t *testing.T, path, msg string) {
	t.Helper()
	if err := notifysock.Send(path, msg); err != nil {
		t.Fatal(err)
	}
}

func TestListenDeliversDatagrams(t *testing.T) {
	path, msgs := Listen(t)
	if len(path) >= 108 {
		t.Fatalf("socket path %q is %d bytes", path, len(path))
	}
	if os.Getenv("NOTIFY_SOCKET") != path {
		t.Errorf("NOTIFY_SOCKET = %q, want %q", os.Getenv("NOTIFY_SOCKET"), path)
	}
	send(t, path, "STATUS=starting")
	send(t, path, "MAINPID=1\nREADY=1")
	if got := Expect(t, msgs, "READY=1"); got != "MAINPID=1\nREADY=1" {
		t.Errorf("READY datagram %q", got)
	}
}
