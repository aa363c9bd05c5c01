package sim

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
	"github.com/bootc-fleet/bootc-fleet/internal/agent/host"
	"github.com/bootc-fleet/bootc-fleet/internal/sim/testbootc"
	"github.com/bootc-fleet/bootc-fleet/tests/fakedbus"
)

// A node booted into an image pushed bad says over a real D-Bus, as the
// agent reads it, what systemd says of a host whose image breaks a unit;
// booted into any other image, its manager runs, boot complete, and the
// unit that failed in the earlier boot is gone.
func TestPlayHostHealthFollowsTheBootedImage(t *testing.T) {
	addr := fakedbus.StartBus(t)
	sd := &fakedbus.Systemd1{}
	if err := sd.Serve(addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sd.Close() })
	t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := host.DialSystemd(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	bad, good := "sha256:"+strings.Repeat("b", 64), "sha256:"+strings.Repeat("a", 64)
	n := &ProcNode{Name: "node-0", Systemd: sd, f: &ProcFleet{bad: map[string]bool{bad: true}}}
	for _, tt := range []struct {
		booted string
		want   host.Health
	}{
		{bad, host.Health{SystemState: fleetv1.SystemDegraded, FailedUnits: []string{BadImageUnit}, FailedUnitsTotal: 1, BootComplete: "inactive"}},
		{good, host.Health{SystemState: fleetv1.SystemRunning, BootComplete: "active"}},
	} {
		st := testbootc.State{Booted: &testbootc.Deployment{Image: "r.example/os@" + tt.booted, Digest: tt.booted}}
		if n.Bootc, err = testbootc.Init(filepath.Join(t.TempDir(), "bootc"), st); err != nil {
			t.Fatal(err)
		}
		if err := n.playHostHealth(); err != nil {
			t.Fatal(err)
		}
		h, err := s.HostHealth(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(h, tt.want) {
			t.Errorf("booted %s: host health %+v, want %+v", tt.booted[:15], h, tt.want)
		}
	}
}
