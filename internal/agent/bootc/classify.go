package bootc

import (
	"errors"
	"regexp"
	"strings"
)

// Classes of a failed bootc command, found in what bootc printed. A
// CommandError wraps one when its stderr matches (errors.Is).
var (
	// ErrSignatureRejected: the host's container signature policy refused
	// the image, or bootc refused the policy itself (a default of
	// insecureAcceptAnything under --enforce-container-sigpolicy). A policy
	// decision is deterministic: trying again gives the same answer.
	ErrSignatureRejected = errors.New("the host's container signature policy rejected the image")
	// ErrRegistryUnauthorized: the registry refused bootc's credentials
	// (HTTP 401) or their access (HTTP 403).
	ErrRegistryUnauthorized = errors.New("the registry refused bootc's credentials")
	// ErrSoftRebootNotCapable: --soft-reboot=required and bootc reads the
	// staged or rollback deployment as not soft-reboot capable. bootc
	// fails after it unlocked the staged deployment or queued the
	// rollback (crates/lib/src/cli.rs, handle_soft_reboot).
	ErrSoftRebootNotCapable = errors.New("bootc says the deployment is not soft-reboot capable")
)

// rollbackPatterns are bootc's own texts of a failed `bootc rollback`, each
// a class of its own (the error line ends with the message).
var rollbackPatterns = []struct {
	re    *regexp.Regexp
	class error
}{
	// crates/lib/src/deploy.rs, rollback.
	{regexp.MustCompile(`(?:^|: )No rollback available$`), ErrNoRollback},
	// crates/lib/src/cli.rs, handle_soft_reboot.
	{regexp.MustCompile(`Soft reboot was required but (?:staged|rollback) deployment is not soft-reboot capable$`), ErrSoftRebootNotCapable},
}

// AuthFiles are the files bootc reads registry credentials from as root,
// in its order: the first that exists is used (bootc
// crates/ostree-ext/src/globals.rs, get_config_paths and open_file).
var AuthFiles = []string{"/run/ostree/auth.json", "/etc/ostree/auth.json", "/usr/lib/ostree/auth.json"}

// signaturePatterns are the texts of a signature-policy refusal. bootc
// prints the image proxy's error after "failed to invoke method
// OpenImage: " (containers-image-proxy-rs), which is containers/image's
// (go.podman.io/image/v5/signature):
var signaturePatterns = []*regexp.Regexp{
	// bootc crates/ostree-ext/src/container/store.rs, prepare_internal.
	regexp.MustCompile("containers-policy\\.json specifies a default of `insecureAcceptAnything`; refusing usage"),
	// policy_eval_simple.go: "Running image %s is rejected by policy." and
	// "Any signatures for image %s are rejected by policy."
	regexp.MustCompile(`(?:Running image \S+ is|Any signatures for image \S+ are) rejected by policy\.`),
	// policy_eval_sigstore.go, policy_eval_signedby.go.
	regexp.MustCompile(`A signature was required, but no signature exists`),
	regexp.MustCompile(`None of the signatures were accepted, reasons: `),
	// policy_eval_sigstore.go, policy_eval_signedby.go (ValidateSigned*).
	regexp.MustCompile(`Signature for identity ".*" is not accepted`),
	regexp.MustCompile(`Signature for digest \S+ does not match`),
	// internal/sigstore_payload.go, VerifySigstorePayload.
	regexp.MustCompile(`cryptographic signature verification failed: `),
	// policy_eval.go, IsRunningImageAllowed with requireSigned.
	regexp.MustCompile(`No signature verification policy found for image `),
	// simple.go, verifyAndExtractSignature; mechanism_gpgme.go.
	regexp.MustCompile(`signature by key \S+ (?:of \S+ )?is not accepted`),
	regexp.MustCompile(`Invalid GPG signature: `),
	// copy/single.go, when the pull goes through copy (podman, unified storage).
	regexp.MustCompile(`Source image rejected: `),
}

// unauthorizedPatterns are containers/image's texts for a registry's 401
// and 403 (docker/errors.go, registryHTTPResponseToError: a default
// errcode message printed alone, any other as "<code>: <message>";
// ErrUnauthorizedForCredentials for a refused token request), each after
// the ": " that ends the context ("reading manifest X in Y: ...").
var unauthorizedPatterns = []*regexp.Regexp{
	regexp.MustCompile(`: authentication required\b`),
	regexp.MustCompile(`: unauthorized: `),
	regexp.MustCompile(`: requested access to the resource is denied\b`),
	regexp.MustCompile(`: denied: `),
	regexp.MustCompile(`: unable to retrieve auth token: invalid username/password: `),
}

// Classify names the class of a failure from bootc's stderr:
// ErrSignatureRejected, ErrRegistryUnauthorized, ErrNoRollback,
// ErrSoftRebootNotCapable, or nil. Only bootc's own error lines
// ("error: ...") are read; progress output is not.
func Classify(stderr string) error {
	line := ErrorLine(stderr)
	if line == "" {
		return nil
	}
	for _, re := range signaturePatterns {
		if re.MatchString(line) {
			return ErrSignatureRejected
		}
	}
	for _, re := range unauthorizedPatterns {
		if re.MatchString(line) {
			return ErrRegistryUnauthorized
		}
	}
	for _, p := range rollbackPatterns {
		if p.re.MatchString(line) {
			return p.class
		}
	}
	return nil
}

// sgrRE matches ANSI color sequences. bootc colors "error: " red through
// anstream, which strips colors when stderr is not a terminal
// (crates/utils/src/lib.rs, run_main); CLICOLOR_FORCE would keep them.
var sgrRE = regexp.MustCompile("\x1b\\[[0-9;]*m")

// ErrorLine is bootc's error message: the last line of stderr that starts
// with "error: " (bootc-utils run_main prints "error: {:#}"), without that
// prefix; "" if there is none.
func ErrorLine(stderr string) string {
	lines := strings.Split(sgrRE.ReplaceAllString(stderr, ""), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), "error: "); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// FailureMessage is what bootc said of err's failure (its error line), or
// err's own text when err is no bootc failure with an error line.
func FailureMessage(err error) string {
	var ce *CommandError
	if errors.As(err, &ce) {
		if l := ErrorLine(ce.Stderr); l != "" {
			return l
		}
	}
	return err.Error()
}
