// Package testbootc is a strict stand-in for bootc on a test host: an
// in-memory state machine (Machine) that prints the same BootcHost documents
// bootc prints, bootc's command line in the CLI generations users run (Exec),
// and a thin executable (cmd/test-bootc) over a state directory. Harnesses
// also use it to play reboots.
//
// Each behaviour follows bootc's source (bootc-dev/bootc; files named where
// the behaviour is modelled), including the unkind parts: status waits for
// the sysroot lock a pull holds, manifest lists are peeled, a download-only
// staged deployment does not survive a reboot, and flags a release lacks
// fail the way clap fails.
package testbootc

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
)

// Deployment is one ostree deployment of a container image.
type Deployment struct {
	Image             string     `json:"image"`  // reference as given to switch
	Digest            string     `json:"digest"` // sha256:<64 hex>
	Version           string     `json:"version,omitempty"`
	Timestamp         *time.Time `json:"timestamp,omitempty"`
	DownloadOnly      bool       `json:"downloadOnly,omitempty"`
	SoftRebootCapable bool       `json:"softRebootCapable,omitempty"`
	// Signature is the origin's signature source: SigContainerPolicy
	// (switched with --enforce-container-sigpolicy) or "" (unverified).
	Signature string `json:"signature,omitempty"`
}

// Failure makes a command fail like bootc does: exit code and stderr text.
type Failure struct {
	ExitCode int    `json:"exitCode"`
	Stderr   string `json:"stderr"`
	// Times is how many invocations still fail; 0 means every one.
	Times int `json:"times,omitempty"`
}

// Knobs are the behaviours a test sets.
type Knobs struct {
	// SwitchDelay: the executable's switch sleeps this long before staging.
	SwitchDelay Duration `json:"switchDelay,omitempty"`
	// SwitchHang: the executable's switch starts a child and sleeps until killed.
	SwitchHang bool `json:"switchHang,omitempty"`
	// HangIgnoreTERM: a hanging switch ignores SIGTERM (only SIGKILL ends it).
	HangIgnoreTERM bool     `json:"hangIgnoreTERM,omitempty"`
	SwitchFailure  *Failure `json:"switchFailure,omitempty"`
	ApplyFailure   *Failure `json:"applyFailure,omitempty"`
	StatusFailure  *Failure `json:"statusFailure,omitempty"`
	// RollbackFailure makes `bootc rollback` fail before it changes anything.
	RollbackFailure *Failure `json:"rollbackFailure,omitempty"`
	// SoftRebootCapable marks newly staged deployments as soft-reboot capable.
	SoftRebootCapable bool `json:"softRebootCapable,omitempty"`
	// Versions maps a digest to the version label of its image.
	Versions map[string]string `json:"versions,omitempty"`
	// Generation is the bootc release whose command line Exec follows
	// (default Gen1_16; see generation.go).
	Generation Generation `json:"generation,omitempty"`
	// ManifestLists maps a manifest-list (index) digest to the digest of the
	// manifest for this host's platform: switching to repo@<index> stages
	// the platform manifest, as bootc does.
	ManifestLists map[string]string `json:"manifestLists,omitempty"`
	// APIVersion printed in documents (default org.containers.bootc/v1).
	APIVersion string `json:"apiVersion,omitempty"`
	// Pull: switch and upgrade --download-only fetch the manifest from the
	// registry the reference names, with the host configuration under Root
	// (auth.json, certs.d, policy.json, registries.d; pull.go). Off, they
	// stage the digest as given (ManifestLists peels indexes).
	Pull bool `json:"pull,omitempty"`
	// Root is the host's root directory in pull mode (default: the state
	// directory's "root").
	Root string `json:"root,omitempty"`
}

// State is everything a Machine holds; it is what the executable persists.
type State struct {
	Booted   *Deployment `json:"booted,omitempty"`
	Staged   *Deployment `json:"staged,omitempty"`
	Rollback *Deployment `json:"rollback,omitempty"`
	// RollbackQueued: `bootc rollback` put the rollback deployment first in
	// the boot order, so the next boot boots it (rollback.go).
	RollbackQueued  bool   `json:"rollbackQueued,omitempty"`
	BootID          string `json:"bootID"`
	BootIDFile      string `json:"bootIDFile,omitempty"` // written on every reboot by Dir
	SoftRebootCount uint32 `json:"softRebootCount"`
	Reboots         int    `json:"reboots"`
	SoftReboots     int    `json:"softReboots"`
	Knobs           Knobs  `json:"knobs"`
	// Stale, when set, is returned by Status instead of the current document.
	Stale *Stale `json:"stale,omitempty"`
	// NextRoot is the digest of the deployment a soft reboot was prepared
	// for (ostree's /run/nextroot), if any. It lives in /run: a reboot and
	// the soft reboot that uses it clear it.
	NextRoot string `json:"nextRoot,omitempty"`
	// Images are the container images in the ostree repository in pull
	// mode, by reference, with the manifest digest imported: a digest
	// reference already there is not fetched again (ostree-ext
	// container/store.rs, prepare_internal), and images no deployment
	// uses are pruned after a stage (crates/lib/src/deploy.rs, cleanup).
	Images map[string]string `json:"images,omitempty"`
}

// Stale is a frozen status document returned until Until (or, with a zero
// Until, until Settle), like bootc status lagging early in a boot.
type Stale struct {
	Document json.RawMessage `json:"document"`
	Until    time.Time       `json:"until,omitzero"`
	// Boot is the boot ID (and soft-reboot count) the frozen document
	// describes, so a simulation can tell which boot a status came from.
	Boot string `json:"boot,omitempty"`
}

// Errors of Machine operations. Each message matches what the executable prints.
var (
	ErrTagRef     = errors.New("test-bootc: tag refs need a registry")
	ErrNoStaged   = errors.New("No staged deployment found")
	ErrInvalidRef = errors.New("test-bootc: invalid image reference")
	// ErrNoImage: upgrade with no tracked image (bootc cli.rs, upgrade).
	ErrNoImage = errors.New("No image source specified")
	// ErrSoftRebootNotCapable is bootc's error for --soft-reboot=required on
	// a staged deployment that is not soft-reboot capable, with the context
	// bootc's upgrade path adds (crates/lib/src/cli.rs, handle_soft_reboot).
	ErrSoftRebootNotCapable = errors.New("Upgrading: Handling staged soft reboot: Handling soft reboot: Soft reboot was required but staged deployment is not soft-reboot capable")
)

// Messages bootc prints on stdout for the outcomes the agent meets
// (bootc crates/lib/src/cli.rs: switch_ostree, upgrade).
const (
	MsgSpecUnchanged      = "Image specification is unchanged."
	MsgNoUpdate           = "No update available."
	MsgDownloadedLocked   = "Image downloaded, but will not be applied on reboot"
	MsgStagedNotChanged   = "Staged update present, not changed"
	MsgWillApply          = "Staged deployment will now be applied on reboot"
	MsgAlreadyWillApply   = "Staged deployment is already set to apply on reboot"
	msgSwitchDownloadOnly = "Image downloaded; it will not be applied on reboot until `bootc upgrade --from-downloaded`."
)

// SoftRebootMode is bootc's --soft-reboot value (crates/lib/src/cli.rs,
// SoftRebootMode): "" (the flag not given), "auto" or "required".
type SoftRebootMode string

const (
	// SoftRebootAuto prepares a soft reboot when the staged deployment can
	// take one, and nothing otherwise.
	SoftRebootAuto SoftRebootMode = "auto"
	// SoftRebootRequired prepares a soft reboot, and fails (after the
	// unlock) when the staged deployment cannot take one.
	SoftRebootRequired SoftRebootMode = "required"
)

// FailureError is returned when a Failure knob fired.
type FailureError struct{ Failure Failure }

func (e *FailureError) Error() string { return strings.TrimSpace(e.Failure.Stderr) }

// Machine is one simulated bootc host. It is safe for concurrent use.
type Machine struct {
	mu  sync.Mutex
	s   State
	now func() time.Time
	// lastBoot is the boot the last Status document described.
	lastBoot string
}

// NewMachine returns a machine in state s. A missing boot ID is generated.
func NewMachine(s State) *Machine {
	if s.BootID == "" {
		s.BootID = NewBootID()
	}
	return &Machine{s: clone(s), now: time.Now}
}

// NewBooted returns a machine booted on ref (repo@sha256:...).
func NewBooted(ref string) (*Machine, error) {
	p, err := imageref.ParsePinned(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRef, err)
	}
	return NewMachine(State{Booted: &Deployment{Image: p.String(), Digest: p.Digest}}), nil
}

// SetClock replaces time.Now (for simulations with virtual time).
func (m *Machine) SetClock(now func() time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = now
}

// State returns a copy of the machine's state.
func (m *Machine) State() State {
	m.mu.Lock()
	defer m.mu.Unlock()
	return clone(m.s)
}

// BootedImage is the booted deployment's image, "" with none: what a
// test polling a thousand machines for convergence needs, without the deep
// copy State makes (at 1,000 nodes that copy, ten times a second, cost the
// test process a quarter of its CPU, which the API server shares).
func (m *Machine) BootedImage() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.s.Booted == nil {
		return ""
	}
	return m.s.Booted.Image
}

// Configure changes the knobs.
func (m *Machine) Configure(fn func(*Knobs)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fn(&m.s.Knobs)
}

// BootID returns the current boot ID.
func (m *Machine) BootID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.s.BootID
}

// Status returns the `bootc status --format=json` document: the frozen one
// while a stale window is open, else the current one.
func (m *Machine) Status() []byte {
	doc, _ := m.StatusFrom()
	return doc
}

// LastStatusBoot is the boot (as StatusFrom names it) the last Status or
// StatusFrom document described.
func (m *Machine) LastStatusBoot() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastBoot
}

// StatusFrom is Status plus the boot the document describes: "<boot ID>/<soft
// reboots>" of the boot it was true in, which is the current boot unless a
// stale window is open.
func (m *Machine) StatusFrom() (doc []byte, boot string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if st := m.s.Stale; st != nil {
		if st.Until.IsZero() || m.now().Before(st.Until) {
			m.lastBoot = st.Boot
			return append([]byte(nil), st.Document...), st.Boot
		}
		m.s.Stale = nil
	}
	m.lastBoot = m.bootLocked()
	return render(m.s), m.lastBoot
}

// Boot is the current boot as StatusFrom names it.
func (m *Machine) Boot() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bootLocked()
}

func (m *Machine) bootLocked() string {
	return fmt.Sprintf("%s/%d", m.s.BootID, m.s.SoftRebootCount)
}

// StatusError returns the StatusFailure knob's error, if it fires.
func (m *Machine) StatusError() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return fire(&m.s.Knobs.StatusFailure)
}

// Switch is `bootc switch --download-only ref` of the generation that has
// it: stage ref locked, replacing any staged deployment. Like every switch,
// it changes nothing when ref is already the tracked image.
func (m *Machine) Switch(ref string) error {
	_, err := m.SwitchTo(ref, true)
	return err
}

// SwitchTo is `bootc switch ref` (locked: with --download-only). bootc
// compares the new spec with the host's (crates/lib/src/cli.rs,
// switch_ostree): when ref is the image the host already tracks (the staged
// deployment's, else the booted one's) it prints "Image specification is
// unchanged." and stages nothing; changed reports whether it staged.
// Otherwise the new staged deployment replaces any staged one (ostree
// _ostree_sysroot_stage_deployment removes the previous staged deployment).
func (m *Machine) SwitchTo(ref string, locked bool) (changed bool, err error) {
	return m.SwitchFetched(ref, "", locked, "")
}

// SwitchFetched is SwitchTo with the origin's signature source sig
// (SigContainerPolicy or "") and, in pull mode, the manifest digest the
// pull imported (fetched; "" peels through ManifestLists). The spec
// compared is the whole image reference, signature included
// (crates/lib/src/cli.rs, switch_ostree: new_spec == host.spec).
func (m *Machine) SwitchFetched(ref, sig string, locked bool, fetched string) (changed bool, err error) {
	p, err := ParseSwitchRef(ref)
	if err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := fire(&m.s.Knobs.SwitchFailure); err != nil {
		return false, err
	}
	if m.specLocked() == p.String() && m.specSigLocked() == sig {
		return false, nil
	}
	m.stageLocked(p, sig, locked, fetched)
	return true, nil
}

// SpecSignature is spec.image.signature: the tracked image's signature source.
func (m *Machine) SpecSignature() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.specSigLocked()
}

func (m *Machine) specSigLocked() string {
	for _, d := range []*Deployment{m.s.Staged, m.s.Booted} {
		if d != nil {
			return d.Signature
		}
	}
	return ""
}

// Spec is spec.image of the status document: the image the host tracks.
func (m *Machine) Spec() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.specLocked()
}

// needsFetch: upgrade would download layers (the tracked image is neither
// staged nor booted), so the pull takes its time.
func (m *Machine) needsFetch() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, err := ParseSwitchRef(m.specLocked())
	if err != nil {
		return false
	}
	d := p.Digest
	if pd, ok := m.s.Knobs.ManifestLists[d]; ok {
		d = pd
	}
	return (m.s.Staged == nil || m.s.Staged.Digest != d) && (m.s.Booted == nil || m.s.Booted.Digest != d)
}

// specLocked is spec.image: what the host tracks (bootc status.rs takes it
// from the staged deployment's origin if one exists, else the booted one's).
func (m *Machine) specLocked() string {
	for _, d := range []*Deployment{m.s.Staged, m.s.Booted} {
		if d != nil {
			return d.Image
		}
	}
	return ""
}

// stageLocked stages the image p names. A manifest list is peeled to this
// host's platform manifest: bootc records the digest of the manifest it
// imported as imageDigest and keeps the reference as given (bootc PR #1239;
// ostree-ext container import).
func (m *Machine) stageLocked(p imageref.Pinned, sig string, locked bool, fetched string) {
	digest := p.Digest
	if d, ok := m.s.Knobs.ManifestLists[p.Digest]; ok {
		digest = d
	}
	if fetched != "" {
		digest = fetched
	}
	ts := m.now().UTC().Truncate(time.Second)
	m.s.Staged = &Deployment{
		Image:             p.String(),
		Digest:            digest,
		Version:           m.s.Knobs.Versions[digest],
		Timestamp:         &ts,
		DownloadOnly:      locked,
		SoftRebootCapable: m.s.Knobs.SoftRebootCapable,
		Signature:         sig,
	}
	m.pruneImagesLocked()
}

// UpgradeDownloadOnly is `bootc upgrade --download-only` (bootc >= 1.12,
// crates/lib/src/cli.rs, upgrade): pull the tracked image; if it is the
// staged one, lock that; if it is the booted one, nothing; else stage it
// locked. It returns the line bootc prints.
func (m *Machine) UpgradeDownloadOnly() (string, error) { return m.UpgradeFetched("") }

// UpgradeFetched is UpgradeDownloadOnly where the pull imported the
// manifest fetched (pull mode; "" peels through ManifestLists).
func (m *Machine) UpgradeFetched(fetchedDigest string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := fire(&m.s.Knobs.SwitchFailure); err != nil {
		return "", err
	}
	spec := m.specLocked()
	if spec == "" {
		return "", ErrNoImage
	}
	p, err := ParseSwitchRef(spec)
	if err != nil {
		return "", err
	}
	fetched := p.Digest
	if d, ok := m.s.Knobs.ManifestLists[p.Digest]; ok {
		fetched = d
	}
	if fetchedDigest != "" {
		fetched = fetchedDigest
	}
	switch st := m.s.Staged; {
	case st != nil && st.Digest == fetched:
		if st.DownloadOnly {
			return MsgStagedNotChanged, nil
		}
		st.DownloadOnly = true
		return MsgDownloadedLocked, nil
	case m.s.Booted != nil && m.s.Booted.Digest == fetched:
		return MsgNoUpdate, nil
	}
	m.stageLocked(p, m.specSigLocked(), true, fetched)
	return "", nil
}

// ParseSwitchRef validates a switch target like bootc would for this
// simulation: a digest reference; a tag would need a registry lookup.
func ParseSwitchRef(ref string) (imageref.Pinned, error) {
	if err := imageref.Validate(ref); err != nil {
		return imageref.Pinned{}, fmt.Errorf("%w: %w", ErrInvalidRef, err)
	}
	p, err := imageref.ParsePinned(ref)
	if err != nil {
		return imageref.Pinned{}, ErrTagRef
	}
	return p, nil
}

// Apply unlocks the staged deployment (`bootc upgrade --from-downloaded`).
// It prepares no soft reboot.
func (m *Machine) Apply() error { return m.ApplySoft("") }

// ApplySoft is ApplyStaged without the line bootc prints.
func (m *Machine) ApplySoft(mode SoftRebootMode) error {
	_, err := m.ApplyStaged(mode)
	return err
}

// ApplyStaged is `bootc upgrade --from-downloaded --soft-reboot=<mode>`, and
// returns the line bootc prints: it unlocks the staged deployment and then,
// with a mode, prepares a soft reboot into it if the staged deployment is
// soft-reboot capable (bootc crates/lib/src/cli.rs: upgrade() with
// from_downloaded calls handle_staged_soft_reboot, which runs ostree's
// deployment_set_soft_reboot, setting up /run/nextroot), also when it was
// unlocked already. "auto" on an incapable deployment prepares nothing and
// succeeds; "required" fails, after the unlock, as bootc does. Capability is
// the staged entry's as read before the unlock, as bootc reads host status
// once at the start of upgrade.
func (m *Machine) ApplyStaged(mode SoftRebootMode) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if mode != "" && mode != SoftRebootAuto && mode != SoftRebootRequired {
		return "", fmt.Errorf("test-bootc: soft-reboot mode %q is neither auto nor required", mode)
	}
	if err := fire(&m.s.Knobs.ApplyFailure); err != nil {
		return "", err
	}
	if m.s.Staged == nil {
		return "", ErrNoStaged
	}
	capable := m.s.Staged.SoftRebootCapable
	line := MsgAlreadyWillApply
	if m.s.Staged.DownloadOnly {
		m.s.Staged.DownloadOnly = false
		line = MsgWillApply
	}
	switch {
	case mode == "":
	case capable:
		m.s.NextRoot = m.s.Staged.Digest
	case mode == SoftRebootRequired:
		return line, ErrSoftRebootNotCapable // after the unlock, as bootc
	}
	return line, nil
}

// RebootOptions shape a simulated reboot.
type RebootOptions struct {
	// StaleFor keeps returning the pre-reboot document this long.
	StaleFor time.Duration
	// StaleUntilSettle keeps returning it until Settle.
	StaleUntilSettle bool
}

// Reboot plays a full reboot: an unlocked staged deployment becomes booted
// (the old booted becomes rollback); a locked one is not finalized and, since
// ostree keeps a staged deployment only in /run (/run/ostree/staged-deployment),
// it is gone after the reboot (bootc docs/src/upgrades.md: "the staged
// deployment will be discarded"; ostree-sysroot-deploy.c,
// _ostree_sysroot_finalize_impl_staged_deployment). The boot ID changes, and a
// prepared soft reboot (in /run) is gone. It returns the new boot ID.
func (m *Machine) Reboot(opts RebootOptions) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	pre := render(m.s)
	preBoot := m.bootLocked()
	m.transition(true)
	m.s.NextRoot = ""
	m.s.BootID = NewBootID()
	m.s.Reboots++
	m.stale(pre, preBoot, opts)
	return m.s.BootID
}

// SoftReboot plays a systemd soft reboot: the kernel stays, so the boot ID
// does not change and the soft-reboot count grows. systemd switches into
// /run/nextroot when it holds an OS tree (systemd-soft-reboot.service(8)),
// and for ostree only `bootc upgrade/switch --soft-reboot=auto|required` on
// a soft-reboot capable staged deployment puts it there (bootc
// crates/lib/src/cli.rs, prepare_soft_reboot: ostree's
// deployment_set_soft_reboot). So the staged deployment is entered only if
// it was unlocked and prepared that way and is still the one staged;
// otherwise userspace restarts on the same deployment, and the staged
// deployment stays as it was. The prepared root is used up either way.
func (m *Machine) SoftReboot(opts RebootOptions) uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	pre := render(m.s)
	preBoot := m.bootLocked()
	switch st, rb := m.s.Staged, m.s.Rollback; {
	case st != nil && !st.DownloadOnly && st.SoftRebootCapable && m.s.NextRoot == st.Digest:
		m.transition(false)
	case st == nil && m.s.RollbackQueued && rb != nil && rb.SoftRebootCapable && m.s.NextRoot == rb.Digest:
		m.bootRollback()
	}
	m.s.NextRoot = ""
	m.s.SoftRebootCount++
	m.s.SoftReboots++
	m.stale(pre, preBoot, opts)
	return m.s.SoftRebootCount
}

// transition is what a reboot (full) or a soft reboot into the staged
// deployment does to the deployments. An unlocked staged deployment is
// finalized first in the boot order, the booted one kept after it
// (ostree _ostree_sysroot_finalize_impl_staged_deployment:
// simple_write_deployment keeps the booted and merge deployments), so a
// queued rollback is dropped with the old rollback deployment. Without one,
// a full reboot boots the first bootloader entry: the rollback deployment
// when `bootc rollback` queued it (rollback.go).
func (m *Machine) transition(full bool) {
	st := m.s.Staged
	switch {
	case st != nil && !st.DownloadOnly:
		// Soft-reboot capability is ostree's comparison of a deployment's
		// kernel and arguments with the booted one's
		// (ostree_sysroot_deployment_can_soft_reboot), which is symmetric:
		// the old booted deployment, now the rollback, is capable exactly
		// when the staged one was. The booted entry keeps reading false.
		if m.s.Booted != nil {
			m.s.Booted.SoftRebootCapable = st.SoftRebootCapable
		}
		st.SoftRebootCapable = false
		m.s.Rollback, m.s.Booted, m.s.Staged = m.s.Booted, st, nil
		m.s.RollbackQueued = false
		return
	case st != nil && full:
		m.s.Staged = nil // locked: not finalized, and /run is gone
	}
	if full && m.s.RollbackQueued {
		m.bootRollback()
	}
}

// bootRollback boots the queued rollback deployment: it becomes booted and
// the previously booted one the rollback (bootc status.rs, get_status: the
// first deployment after the booted one is the rollback), with the
// capability carried over as transition does.
func (m *Machine) bootRollback() {
	rb := m.s.Rollback
	if rb == nil || m.s.Booted == nil {
		m.s.RollbackQueued = false
		return
	}
	m.s.Booted.SoftRebootCapable = rb.SoftRebootCapable
	rb.SoftRebootCapable = false
	m.s.Rollback, m.s.Booted = m.s.Booted, rb
	m.s.RollbackQueued = false
}

func (m *Machine) stale(pre []byte, preBoot string, opts RebootOptions) {
	switch {
	case opts.StaleUntilSettle:
		m.s.Stale = &Stale{Document: pre, Boot: preBoot}
	case opts.StaleFor > 0:
		m.s.Stale = &Stale{Document: pre, Until: m.now().Add(opts.StaleFor), Boot: preBoot}
	default:
		m.s.Stale = nil
	}
}

// SetStale freezes the current document for d (d <= 0: until Settle).
func (m *Machine) SetStale(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stale(render(m.s), m.bootLocked(), RebootOptions{StaleFor: d, StaleUntilSettle: d <= 0})
}

// Settle ends a stale window.
func (m *Machine) Settle() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.s.Stale = nil
}

// NewBootID returns a random ID in the format of /proc/sys/kernel/random/boot_id.
func NewBootID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func fire(f **Failure) error {
	if *f == nil {
		return nil
	}
	fl := **f
	if fl.Times > 0 {
		if fl.Times == 1 {
			*f = nil
		} else {
			(*f).Times--
		}
	}
	return &FailureError{Failure: fl}
}

func clone(s State) State {
	data, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	var c State
	if err := json.Unmarshal(data, &c); err != nil {
		panic(err)
	}
	return c
}

// Duration is a time.Duration written as "1.5s" in JSON.
type Duration time.Duration

// MarshalJSON writes d as a duration string ("1.5s").
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string ("1.5s"), as time.ParseDuration does.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}
