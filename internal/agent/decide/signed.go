package decide

import (
	"github.com/bootc-fleet/bootc-fleet/api/lease"
	fleetv1 "github.com/bootc-fleet/bootc-fleet/api/v1alpha1"
)

// Private registries and signed images (docs/design.md, amendment 14).

// authFiles names where bootc looks for registry credentials as root, in
// its order (bootc crates/ostree-ext/src/globals.rs, get_config_paths and
// ConfigPaths::open_file: the first that exists is used).
const authFiles = "/run/ostree/auth.json, then /etc/ostree/auth.json, then /usr/lib/ostree/auth.json"

// unverifiedStaged: the desired image is staged, but bootc did not verify
// it while signed images are required. It is not "staged": never unlocked
// or rebooted into; under a stage grant it is staged again with
// enforcement, which bootc sees as a new spec (the signature is part of
// it, crates/lib/src/cli.rs switch_ostree).
func unverifiedStaged(o Observation) Action {
	img := o.Desired.Image
	if o.InFlight == nil && !o.Status.Staged.DownloadOnly {
		if _, err := validGrant(o, lease.ActionStage, img); err != nil {
			return Action{Kind: Nothing, Phase: fleetv1.PhaseDegraded, Reason: fleetv1.ReasonUnlockedWithoutGrant,
				Message: "staged " + short(img) + " is unlocked without a reboot grant and was not verified by the container signature policy; any reboot will apply it"}
		}
	}
	a := stageOrWait(o)
	if a.Reason == fleetv1.ReasonWaitingForStageGrant {
		a.Message += "; the staged deployment was not verified by the container signature policy (signature " + signatureName(o.Status.Staged) + "), so it is staged again with enforcement"
	}
	return a
}

func signatureName(d *Deployment) string {
	if d == nil || d.Signature == "" {
		return "unknown"
	}
	return string(d.Signature)
}

// prefix starts the message of a classified stage failure with its class
// ("RegistryUnauthorized: ", amendment 14) and, for refused credentials,
// where bootc took them from.
func (f *StageFailure) prefix() string {
	switch f.Class {
	case "":
		return ""
	case fleetv1.ReasonRegistryUnauthorized:
		return f.Class + ": the registry refused bootc's credentials (bootc sends those of the first of " + authFiles + " that exists, none: anonymous); "
	}
	return f.Class + ": "
}
