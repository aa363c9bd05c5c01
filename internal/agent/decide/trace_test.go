package decide

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// TestTraces runs the scripts in testdata/trace: each command changes the
// world or feeds Step one input, and prints the effects, their results and
// the state after. `go test ./internal/agent/decide -run TestTraces -rewrite`
// rewrites the expected output.
//
// Commands:
//
//	observe [fail]                    a round (fail: bootc status fails)
//	run [fail]                        run the first pending effect
//	stabilize                         run every pending effect, each ok
//	report                            an accepted report of the last decision
//	grant stage|reboot|rollback <img> [phase=P] [boot=other]
//	revoke stage|reboot
//	set-phase <P>                     rewrite the reboot grant's phase in place
//	stage-done done|failed|rejected|unauthorized
//	desired <img>
//	policy Reboot|AllowSoftReboot
//	advance <duration>
//	reboot [soft] [restart]           the host goes down and up
//	restart                           the agent's process starts anew
func TestTraces(t *testing.T) {
	datadriven.Walk(t, "testdata/trace", func(t *testing.T, path string) {
		w := newWorld(t0)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			w.out = nil
			if err := traceCommand(w, d); err != nil {
				d.Fatalf(t, "%v", err)
			}
			out := strings.Join(append(w.out, w.summary()), "\n") + "\n"
			return traceNames.Replace(out)
		})
	})
}

// traceNames prints the images by their script names.
var traceNames = strings.NewReplacer(short(imgV1), "v1", short(imgV2), "v2", short(imgV3), "v3")

var traceImages = map[string]imageref.Pinned{"v1": imgV1, "v2": imgV2, "v3": imgV3}

func traceImage(d *datadriven.TestData, i int) (imageref.Pinned, error) {
	if len(d.CmdArgs) <= i {
		return imageref.Pinned{}, fmt.Errorf("%s: want an image", d.Cmd)
	}
	img, ok := traceImages[d.CmdArgs[i].Key]
	if !ok {
		return imageref.Pinned{}, fmt.Errorf("unknown image %q", d.CmdArgs[i].Key)
	}
	return img, nil
}

func traceKind(d *datadriven.TestData) lease.Kind {
	if d.HasArg("reboot") || d.HasArg("rollback") {
		return lease.KindReboot
	}
	return lease.KindStage
}

func traceCommand(w *world, d *datadriven.TestData) error {
	switch d.Cmd {
	case "observe":
		w.failNext = d.HasArg("fail")
		w.observe()
	case "run":
		w.run(!d.HasArg("fail"))
	case "stabilize":
		for i := 0; len(w.pending) > 0 && i < 20; i++ {
			w.run(true)
		}
	case "report":
		w.report()
	case "grant":
		return traceGrant(w, d)
	case "revoke":
		w.revoke(traceKind(d))
	case "set-phase":
		w.setPhase(lease.Phase(d.CmdArgs[0].Key))
	case "stage-done":
		w.stageEnds(d.CmdArgs[0].Key)
	case "desired":
		img, err := traceImage(d, 0)
		if err != nil {
			return err
		}
		w.desired = Desired{Set: true, Image: img}
	case "policy":
		w.policy = fleetv1.RebootPolicy(d.CmdArgs[0].Key)
	case "advance":
		dur, err := time.ParseDuration(d.CmdArgs[0].Key)
		if err != nil {
			return err
		}
		w.now = w.now.Add(dur)
		w.out = append(w.out, "now: +"+w.now.Sub(t0).String())
	case "reboot":
		w.reboot(d.HasArg("soft"), d.HasArg("restart"))
		w.out = append(w.out, fmt.Sprintf("boot: %s/%d, booted %s", w.boot.BootID[:8], w.boot.SoftRebootCount, describe(w.booted)))
	case "restart":
		w.s, w.pending, w.running = NewState(w.s.Params), nil, nil
	default:
		return fmt.Errorf("unknown command %q", d.Cmd)
	}
	return nil
}

func traceGrant(w *world, d *datadriven.TestData) error {
	img, err := traceImage(d, 1)
	if err != nil {
		return err
	}
	boot := w.boot
	if d.HasArg("boot") {
		boot = BootIdentity{BootID: bootB}
	}
	var phase lease.Phase
	for _, a := range d.CmdArgs {
		if a.Key == "phase" && len(a.Vals) == 1 {
			phase = lease.Phase(a.Vals[0])
		}
	}
	if d.HasArg("rollback") {
		w.grantRollback(img, phase)
	} else {
		w.grant(traceKind(d), img, boot, phase)
	}
	g := w.leases[lease.SlotName("pool", traceKind(d), 0)]
	w.out = append(w.out, "granted: "+g.ID.String())
	return nil
}
