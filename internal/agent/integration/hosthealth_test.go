package integration

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// The agent reports in status.host what systemd says over D-Bus in the boot
// it runs in (docs/design.md, amendment 24): the manager's state, the failed
// units, boot-complete.target and the units spec.health.requiredUnits names,
// through the real CRD schema. When systemd does not answer, the report
// goes on without the host block.
func TestAgentReportsHostHealth(t *testing.T) {
	n := newNode(t, "it-host")
	ctx := context.Background()
	n.sd.SetSystemState("degraded")
	for name, st := range map[string]string{"kubelet.service": "active", "bad.service": "failed", "boot-complete.target": "active"} {
		if err := n.sd.SetUnit(name, st); err != nil {
			t.Fatal(err)
		}
	}
	var bn fleetv1.BootcNode
	if err := env.Client.Get(ctx, client.ObjectKey{Name: n.name}, &bn); err != nil {
		t.Fatal(err)
	}
	bn.Spec.Health = &fleetv1.NodeHealthSpec{RequiredUnits: []string{"kubelet.service", "absent.service"}}
	if err := env.Client.Update(ctx, &bn); err != nil {
		t.Fatal(err)
	}
	n.start()
	boot := n.bootID()
	want := fleetv1.HostHealth{BootID: boot, SystemState: fleetv1.SystemDegraded, FailedUnits: []string{"bad.service"},
		FailedUnitsTotal: 1, BootComplete: "active",
		Units: []fleetv1.UnitState{{Name: "kubelet.service", ActiveState: "active"}, {Name: "absent.service"}}}
	n.wait("the host's health reported", hostIs(t, want))

	// The unit recovers: the next report says so.
	n.sd.SetSystemState("running")
	if err := n.sd.SetUnit("bad.service", "active"); err != nil {
		t.Fatal(err)
	}
	want.SystemState, want.FailedUnits, want.FailedUnitsTotal = fleetv1.SystemRunning, nil, 0
	n.wait("the recovered host reported", hostIs(t, want))

	// systemd refuses the read: status.host goes, the report stays.
	n.sd.FailListUnits("org.freedesktop.DBus.Error.AccessDenied")
	st := n.wait("no host block", func(s fleetv1.BootcNodeStatus) bool { return s.Host == nil })
	if st.BootID != boot || st.Phase == "" {
		t.Fatalf("status without its report: boot %q phase %q", st.BootID, st.Phase)
	}
	if !n.logged("could not read the host's health from systemd", "AccessDenied") {
		t.Error("the failed read was not logged")
	}
}

func hostIs(t *testing.T, want fleetv1.HostHealth) func(fleetv1.BootcNodeStatus) bool {
	var last string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last status.host: %s", last)
		}
	})
	return func(s fleetv1.BootcNodeStatus) bool {
		last = fmt.Sprintf("%+v", s.Host)
		return s.Host != nil && reflect.DeepEqual(*s.Host, want)
	}
}
