package bootc

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/bootc-fleet/bootc-fleet/tests/testbootc"
)

// The lines are what bootc prints for each failure: its context chain
// (crates/lib/src/cli.rs, crates/ostree-ext/src/container/store.rs), the
// image proxy's "failed to invoke method OpenImage: " and containers/image's
// text (go.podman.io/image/v5: signature/, docker/errors.go).
func TestClassify(t *testing.T) {
	const pre = "error: Switching: Switching (ostree): Preparing import: Fetching manifest: failed to invoke method OpenImage: "
	const img = "quay.io/example/os@sha256:16dc16dc16dc16dc16dc16dc16dc16dc16dc16dc16dc16dc16dc16dc16dc16dc"
	for _, tc := range []struct {
		name   string
		stderr string
		want   error
	}{
		{"insecure default refused", "error: Switching: Switching (ostree): Preparing import: Fetching manifest: containers-policy.json specifies a default of `insecureAcceptAnything`; refusing usage\n", ErrSignatureRejected},
		{"upgrade: insecure default refused", "error: Upgrading: Preparing import: Fetching manifest: containers-policy.json specifies a default of `insecureAcceptAnything`; refusing usage\n", ErrSignatureRejected},
		{"no signature", pre + "A signature was required, but no signature exists\n", ErrSignatureRejected},
		{"no signature, counts", pre + "A signature was required, but no signature exists (0 non-sigstore signatures, 1 sigstore non-signature attachments)\n", ErrSignatureRejected},
		{"reject", pre + "Running image docker://" + img + " is rejected by policy.\n", ErrSignatureRejected},
		{"any signatures rejected", pre + "Any signatures for image docker://" + img + " are rejected by policy.\n", ErrSignatureRejected},
		{"wrong key", pre + "cryptographic signature verification failed: invalid signature when validating ASN.1 encoded signature\n", ErrSignatureRejected},
		{"identity", pre + "Signature for identity \"quay.io/other/os\" is not accepted\n", ErrSignatureRejected},
		{"digest", pre + "Signature for digest sha256:aaaa does not match\n", ErrSignatureRejected},
		{"several", pre + "None of the signatures were accepted, reasons: Signature for identity \"a\" is not accepted; cryptographic signature verification failed: x\n", ErrSignatureRejected},
		{"gpg key", pre + "signature by key 0123ABCD is not accepted\n", ErrSignatureRejected},
		{"gpg invalid", pre + "Invalid GPG signature: &{...}\n", ErrSignatureRejected},
		{"copy path", "error: Pulling: Source image rejected: A signature was required, but no signature exists\n", ErrSignatureRejected},
		{"colored", "\x1b[31merror: \x1b[0mSwitching: Switching (ostree): Preparing import: Fetching manifest: failed to invoke method OpenImage: A signature was required, but no signature exists\n", ErrSignatureRejected},
		{"progress first", "Fetching manifest...\nlayers: 3\n" + pre + "A signature was required, but no signature exists\n", ErrSignatureRejected},
		{"401", pre + "reading manifest sha256:16dc in quay.io/example/os: authentication required\n", ErrRegistryUnauthorized},
		{"401 message", pre + "reading manifest sha256:16dc in quay.io/example/os: unauthorized: access to the requested resource is not authorized\n", ErrRegistryUnauthorized},
		{"403", pre + "reading manifest sha256:16dc in quay.io/example/os: requested access to the resource is denied\n", ErrRegistryUnauthorized},
		{"403 message", pre + "reading manifest sha256:16dc in quay.io/example/os: denied: requested access to the resource is denied\n", ErrRegistryUnauthorized},
		{"token", pre + "fetching manifest sha256:16dc in quay.io/example/os: unable to retrieve auth token: invalid username/password: unauthorized: incorrect username or password\n", ErrRegistryUnauthorized},
		{"permission denied is no 403", "error: Switching: Writing origin: Permission denied (os error 13)\n", nil},
		{"file permission denied", "error: Loading global authfile: open /etc/ostree/auth.json: permission denied: x\n", nil},
		{"TLS", pre + "pinging container registry quay.io: Get \"https://quay.io/v2/\": tls: failed to verify certificate: x509: certificate signed by unknown authority\n", nil},
		{"not found", pre + "reading manifest sha256:16dc in quay.io/example/os: manifest unknown\n", nil},
		{"disk", "error: Switching: no space left on device\n", nil},
		{"no rollback", "error: Rollback: Rollback (ostree): No rollback available\n", ErrNoRollback},
		{"rollback not soft-reboot capable", "Next boot: rollback deployment\nerror: Rollback: Rollback (ostree): Handling soft reboot: Soft reboot was required but rollback deployment is not soft-reboot capable\n", ErrSoftRebootNotCapable},
		{"staged not soft-reboot capable", "error: Upgrading: Handling staged soft reboot: Handling soft reboot: Soft reboot was required but staged deployment is not soft-reboot capable\n", ErrSoftRebootNotCapable},
		{"no rollback mid-line is not bootc's refusal", "error: Rollback: No rollback available in the image (os error 2)\n", nil},
		{"no error line", "A signature was required, but no signature exists\n", nil},
		{"empty", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Classify(tc.stderr); !errors.Is(got, tc.want) {
				t.Fatalf("Classify(%q) = %v, want %v", tc.stderr, got, tc.want)
			}
		})
	}
}

func TestFailureMessage(t *testing.T) {
	err := &CommandError{Args: []string{"switch"}, ExitCode: 1, Kind: ErrFailed,
		Stderr: "progress\nerror: Switching: A signature was required, but no signature exists\n"}
	if got, want := FailureMessage(err), "Switching: A signature was required, but no signature exists"; got != want {
		t.Fatalf("FailureMessage = %q, want %q", got, want)
	}
	plain := errors.New("boom")
	if got := FailureMessage(plain); got != "boom" {
		t.Fatalf("FailureMessage(plain) = %q", got)
	}
}

// A failed command carries its class, so errors.Is finds it.
func TestCommandErrorCarriesClass(t *testing.T) {
	_, cli := newHost(t, testbootc.Knobs{SwitchFailure: &testbootc.Failure{ExitCode: 1,
		Stderr: "error: Switching: Switching (ostree): Preparing import: Fetching manifest: failed to invoke method OpenImage: A signature was required, but no signature exists\n"}})
	err := cli.Stage(context.Background(), mustPinned(t, targetRef), probe(t, cli), StageOptions{EnforceSignatures: true})
	if !errors.Is(err, ErrSignatureRejected) || !errors.Is(err, ErrFailed) {
		t.Fatalf("Stage = %v, want ErrSignatureRejected and ErrFailed", err)
	}
}

// With EnforceSignatures every switch carries --enforce-container-sigpolicy,
// and the staged deployment reports ContainerPolicy.
func TestCLIStageEnforcesSignatures(t *testing.T) {
	for _, tc := range []struct {
		gen        testbootc.Generation
		wantSwitch []string
	}{
		{testbootc.Gen1_16, []string{"switch", "--enforce-container-sigpolicy", targetRef}},
		{testbootc.GenSwitchDownloadOnly, []string{"switch", "--download-only", "--enforce-container-sigpolicy", targetRef}},
	} {
		t.Run(string(tc.gen), func(t *testing.T) {
			d, cli := newHost(t, testbootc.Knobs{Generation: tc.gen})
			ctx := context.Background()
			if err := cli.Stage(ctx, mustPinned(t, targetRef), probe(t, cli), StageOptions{EnforceSignatures: true}); err != nil {
				t.Fatalf("Stage: %v", err)
			}
			var switches [][]string
			for _, inv := range invocations(t, d) {
				if inv[0] == "switch" && inv[len(inv)-1] != "--help" {
					switches = append(switches, inv)
				}
			}
			if !reflect.DeepEqual(switches, [][]string{tc.wantSwitch}) {
				t.Fatalf("switches %q, want %q", switches, [][]string{tc.wantSwitch})
			}
			st, err := cli.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Staged == nil || st.Staged.Signature != SignatureContainerPolicy || !st.Staged.DownloadOnly {
				t.Fatalf("staged %+v, want ContainerPolicy, locked", st.Staged)
			}
			if st.Booted.Signature != SignatureInsecure {
				t.Fatalf("booted signature %q, want Insecure (bootc prints none)", st.Booted.Signature)
			}
		})
	}
}
