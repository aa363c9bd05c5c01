package decide

import (
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Amendment 14: signed images and refused credentials. Each case fails
// without the branch it names.
func TestDecideSignedImages(t *testing.T) {
	verified := func() *Deployment {
		d := dep(imgV2)
		d.Signature = fleetv1.SignatureContainerPolicy
		return d
	}
	unverified := func() *Deployment {
		d := dep(imgV2)
		d.Signature = fleetv1.SignatureInsecure
		return d
	}
	signed := func(o Observation) Observation { o.RequireSigned = true; return o }
	rejected := &Rejection{Image: imgV2, Message: "Switching: Switching (ostree): Preparing import: Fetching manifest: failed to invoke method OpenImage: A signature was required, but no signature exists"}
	unauthorized := func(attempts int) *StageFailure {
		return &StageFailure{Image: imgV2, Grant: stageGrant(imgV2).ID, Attempts: attempts, RetryAt: t0.Add(time.Minute),
			Class: fleetv1.ReasonRegistryUnauthorized, Message: "Switching: Switching (ostree): Preparing import: Fetching manifest: failed to invoke method OpenImage: reading manifest sha256:2222 in quay.io/example/os: authentication required"}
	}
	tests := []struct {
		name    string
		obs     Observation
		kind    Kind
		phase   fleetv1.NodePhase
		reason  string
		enforce bool
		msg     []string // substrings of the message
		prefix  string   // the message starts with it
	}{
		{"stage under requireSignedImages enforces", func() Observation {
			o := signed(base())
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}(), Stage, fleetv1.PhaseStaging, fleetv1.ReasonStaging, true, nil, ""},
		{"stage without it does not", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}(), Stage, fleetv1.PhaseStaging, fleetv1.ReasonStaging, false, nil, ""},
		{"verified staged waits for a reboot slot", func() Observation {
			return signed(withStaged(base(), verified()))
		}(), Nothing, fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant, false, nil, ""},
		{"verified staged reboots under a reboot grant", func() Observation {
			o := signed(withStaged(base(), verified()))
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}(), ApplyAndReboot, fleetv1.PhaseRebooting, fleetv1.ReasonRebooting, false, nil, ""},
		{"unverified staged is not staged: no reboot under a reboot grant", func() Observation {
			o := signed(withStaged(base(), unverified()))
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}(), Nothing, fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant, false, []string{"not verified", "Insecure"}, ""},
		{"unverified staged is staged again with enforcement under a stage grant", func() Observation {
			o := signed(withStaged(base(), unverified()))
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			return o
		}(), Stage, fleetv1.PhaseStaging, fleetv1.ReasonStaging, true, nil, ""},
		{"unverified staged waits for a stage slot", func() Observation {
			return signed(withStaged(base(), unverified()))
		}(), Nothing, fleetv1.PhaseWaiting, fleetv1.ReasonWaitingForStageGrant, false, []string{"staged again with enforcement"}, ""},
		{"unverified staged without requireSignedImages is staged", func() Observation {
			return withStaged(base(), unverified())
		}(), Nothing, fleetv1.PhaseStaged, fleetv1.ReasonWaitingForRebootGrant, false, nil, ""},
		{"unverified unlocked staged without a stage grant is Degraded", func() Observation {
			d := unverified()
			d.DownloadOnly = false
			o := signed(withStaged(base(), d))
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}(), Nothing, fleetv1.PhaseDegraded, fleetv1.ReasonUnlockedWithoutGrant, false, []string{"not verified"}, ""},
		{"booted on the target is up to date whatever its signature", func() Observation {
			o := signed(base())
			o.Status.Booted = &Deployment{Image: imgV2, Signature: fleetv1.SignatureInsecure}
			return o
		}(), Nothing, fleetv1.PhaseIdle, fleetv1.ReasonUpToDate, false, nil, ""},
		{"a recorded reboot into an unverified staged deployment is dropped", func() Observation {
			o := signed(recorded(withStaged(base(), unverified()), idA(), t0.Add(-time.Second)))
			o.Grants = []HeldGrant{rebootGrant(imgV2)}
			return o
		}(), ClearRecord, fleetv1.PhaseWaiting, fleetv1.ReasonStagedNotVerified, false, []string{"not rebooting"}, ""},
		{"rejected image: Degraded with bootc's message, no stage", func() Observation {
			o := signed(base())
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			o.Rejected = rejected
			return o
		}(), Nothing, fleetv1.PhaseDegraded, fleetv1.ReasonSignatureRejected, false, []string{rejected.Message}, ""},
		{"rejected image: also without requireSignedImages (the policy applies to every pull)", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			o.Rejected = rejected
			return o
		}(), Nothing, fleetv1.PhaseDegraded, fleetv1.ReasonSignatureRejected, false, nil, ""},
		{"rejection of another image does not stop this one", func() Observation {
			o := signed(base())
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			o.Rejected = &Rejection{Image: imgV3, Message: "x"}
			return o
		}(), Stage, fleetv1.PhaseStaging, fleetv1.ReasonStaging, true, nil, ""},
		{"rejected image cancels a stage in flight", func() Observation {
			o := signed(base())
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			o.Rejected = rejected
			o.InFlight = &imgV2
			return o
		}(), CancelStage, fleetv1.PhaseDegraded, fleetv1.ReasonSignatureRejected, false, nil, ""},
		{"refused credentials: retried as StageFailed, message names the auth files", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			o.LastStageFailure = unauthorized(1)
			return o
		}(), Nothing, fleetv1.PhaseDegraded, fleetv1.ReasonStageFailed, false,
			[]string{"/run/ostree/auth.json, then /etc/ostree/auth.json, then /usr/lib/ostree/auth.json", "authentication required", "attempt 1 of 3"}, "RegistryUnauthorized: "},
		{"refused credentials: let go after the last attempt", func() Observation {
			o := base()
			o.Grants = []HeldGrant{stageGrant(imgV2)}
			o.LastStageFailure = unauthorized(lease.MaxStageAttempts)
			return o
		}(), Nothing, fleetv1.PhaseWaiting, fleetv1.ReasonStageFailed, false, []string{"gave up"}, "RegistryUnauthorized: "},
		{"refused credentials: waiting for a slot", func() Observation {
			o := base()
			o.LastStageFailure = unauthorized(lease.MaxStageAttempts)
			return o
		}(), Nothing, fleetv1.PhaseWaiting, fleetv1.ReasonStageFailed, false, []string{"waiting for a stage slot"}, "RegistryUnauthorized: "},
		{"refused credentials: retried once the delay passed", func() Observation {
			o := base()
			o.Now = t0.Add(2 * time.Minute)
			g := stageGrant(imgV2)
			g.LastHeartbeat = o.Now.Add(-time.Second)
			g.Renewed = o.Now.Add(-time.Second)
			o.Grants = []HeldGrant{g}
			o.LastStageFailure = unauthorized(1)
			return o
		}(), Stage, fleetv1.PhaseStaging, fleetv1.ReasonStaging, false, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := Decide(tc.obs)
			if a.Kind != tc.kind || a.Phase != tc.phase || a.Reason != tc.reason || a.Enforce != tc.enforce {
				t.Fatalf("Decide = %s (enforce %v), want %s %s/%s (enforce %v)", a, a.Enforce, tc.kind, tc.phase, tc.reason, tc.enforce)
			}
			for _, s := range tc.msg {
				if !strings.Contains(a.Message, s) {
					t.Errorf("message %q lacks %q", a.Message, s)
				}
			}
			if !strings.HasPrefix(a.Message, tc.prefix) {
				t.Errorf("message %q does not start with %q", a.Message, tc.prefix)
			}
		})
	}
}

// A rejected image lets go of its stage grant with reason SignatureRejected;
// refused credentials keep it while retrying.
func TestClaimsSignatureRejected(t *testing.T) {
	o := base()
	o.RequireSigned = true
	g := stageGrant(imgV2)
	o.Grants = []HeldGrant{g}
	o.Rejected = &Rejection{Image: imgV2, Message: "A signature was required, but no signature exists"}
	c := Claims(o, Decide(o))
	if len(c) != 1 || c[0].ID != g.ID || c[0].Released != fleetv1.ReasonSignatureRejected {
		t.Fatalf("Claims = %+v, want %s released SignatureRejected", c, g.ID)
	}
	o.Rejected = nil
	o.LastStageFailure = &StageFailure{Image: imgV2, Grant: g.ID, Attempts: 1, RetryAt: t0.Add(time.Minute), Class: fleetv1.ReasonRegistryUnauthorized, Message: "authentication required"}
	c = Claims(o, Decide(o))
	if len(c) != 1 || c[0].Released != "" {
		t.Fatalf("Claims = %+v, want the grant kept while retrying", c)
	}
}

// TestDecideSignedImagesProperty checks amendment 14 on random observations
// (genObservation plus signatures, requireSignedImages, a rejection and a
// classified stage failure; rapid prints the failing seed and draws).
func TestDecideSignedImagesProperty(t *testing.T) {
	kinds := map[Kind]int{}
	defer func() { t.Logf("actions drawn: %v", kinds) }()
	sigs := []fleetv1.ImageSignature{fleetv1.SignatureContainerPolicy, fleetv1.SignatureInsecure, fleetv1.SignatureUnknown, fleetv1.SignatureOstreeRemote}
	rapid.Check(t, func(t *rapid.T) {
		o := genObservation(t)
		for _, d := range []*Deployment{o.Status.Booted, o.Status.Staged} {
			if d != nil {
				d.Signature = rapid.SampledFrom(sigs).Draw(t, "signature")
			}
		}
		o.RequireSigned = rapid.Bool().Draw(t, "requireSigned")
		if rapid.IntRange(0, 3).Draw(t, "rejected") == 0 {
			o.Rejected = &Rejection{Image: rapid.SampledFrom([]imageref.Pinned{imgV1, imgV2, imgV3}).Draw(t, "rejected.image"),
				Message: "A signature was required, but no signature exists"}
		}
		if f := o.LastStageFailure; f != nil && rapid.Bool().Draw(t, "sf.unauthorized") {
			f.Class = fleetv1.ReasonRegistryUnauthorized
		}
		a := Decide(o)
		kinds[a.Kind]++
		if a.Kind == Stage && a.Enforce != o.RequireSigned {
			t.Fatalf("stage with enforcement %v under requireSignedImages %v", a.Enforce, o.RequireSigned)
		}
		if a.Kind == ApplyAndReboot && o.RequireSigned && o.Status.Staged.Signature != fleetv1.SignatureContainerPolicy {
			t.Fatalf("reboot into a staged deployment with signature %q under requireSignedImages", o.Status.Staged.Signature)
		}
		if r := o.Rejected; a.Kind == Stage && r != nil && r.Image == a.Image {
			t.Fatalf("stage of %s, which the signature policy rejected", a.Image)
		}
		if f := o.LastStageFailure; a.Reason == fleetv1.ReasonStageFailed && f != nil && f.Class != "" && f.Image == o.Desired.Image &&
			!strings.HasPrefix(a.Message, f.Class+": ") {
			t.Fatalf("StageFailed of class %s with message %q", f.Class, a.Message)
		}
		for _, c := range Claims(o, a) {
			if c.Released == fleetv1.ReasonSignatureRejected && (o.Rejected == nil || o.Rejected.Image != o.Desired.Image) {
				t.Fatalf("grant %s released as SignatureRejected without a rejection of the desired image", c.ID)
			}
		}
	})
}
