// Package bootc reads `bootc status` and runs the few bootc commands the agent
// needs. Everything bootc prints is outside input: it is validated here and a
// document that does not fit is an error, never a guess.
package bootc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/bootc-fleet/bootc-fleet/api/imageref"
	"github.com/bootc-fleet/bootc-fleet/api/text"
)

// API versions of the BootcHost document this package understands. Current
// bootc prints v1; older hosts print v1alpha1 with the same fields.
const (
	APIVersionV1       = "org.containers.bootc/v1"
	APIVersionV1Alpha1 = "org.containers.bootc/v1alpha1"
	Kind               = "BootcHost"
)

// TransportRegistry is the transport bootc records for images pulled from a registry.
const TransportRegistry = "registry"

// ErrMalformed is wrapped by every error about a status document.
var ErrMalformed = errors.New("malformed bootc status")

// ErrNotPinnable is returned by Entry.Pinned when the entry does not name a
// registry image with a digest (e.g. an ostree-only deployment).
var ErrNotPinnable = errors.New("bootc entry has no registry image digest")

// Entry is one deployment (booted, staged or rollback) as bootc reports it.
type Entry struct {
	Image             string // status.<x>.image.image.image, the reference bootc tracks
	Transport         string // status.<x>.image.image.transport, e.g. "registry"
	Digest            string // status.<x>.image.imageDigest, sha256:<64 hex>
	Version           string
	Timestamp         *time.Time
	DownloadOnly      bool // staged but locked: not applied by the next reboot
	SoftRebootCapable bool
	// PinnedDeployment is bootc's "pinned" flag (kept from garbage
	// collection). Named apart from the Pinned method, which gives repo@digest.
	PinnedDeployment bool
	Incompatible     bool
	// Signature is how bootc verified the image when it fetched it
	// (image.image.signature); SignatureNone for an entry without image.
	Signature Signature
}

// Signature is bootc's ImageSignature in the agent's words (the values of
// fleetv1.ImageSignature).
type Signature string

// Values of Signature. bootc writes "containerPolicy", "insecure" or
// {"ostreeRemote": "<remote>"} (crates/lib/src/spec.rs, ImageSignature,
// camelCase), and nothing for an unverified fetch, which it maps to no
// signature (crates/lib/src/status.rs, From<OstreeImageReference>:
// ContainerPolicyAllowInsecure => None); older bootc wrote "insecure".
const (
	SignatureNone            Signature = ""
	SignatureInsecure        Signature = "Insecure"
	SignatureContainerPolicy Signature = "ContainerPolicy"
	SignatureOstreeRemote    Signature = "OstreeRemote"
)

// Status is the part of `bootc status` the agent acts on.
type Status struct {
	APIVersion               string
	Booted, Staged, Rollback *Entry // nil when bootc reports null or nothing
	// RollbackQueued: `bootc rollback` put the rollback deployment first in
	// the boot order, so the next boot boots it (status.rollbackQueued;
	// spec.bootOrder is then "rollback"). bootc sets it only when there is
	// a rollback deployment (crates/lib/src/status.rs, get_status).
	RollbackQueued bool
}

// Pinned returns repo@digest of the entry, comparable with a desired
// imageref.Pinned. The repository is the tracked image without tag or digest.
func (e *Entry) Pinned() (imageref.Pinned, error) {
	if e == nil || e.Image == "" || e.Digest == "" {
		return imageref.Pinned{}, ErrNotPinnable
	}
	if e.Transport != TransportRegistry {
		return imageref.Pinned{}, fmt.Errorf("%w: transport %q", ErrNotPinnable, e.Transport)
	}
	repo, err := imageref.Repository(e.Image)
	if err != nil {
		return imageref.Pinned{}, fmt.Errorf("%w: %w", ErrNotPinnable, err)
	}
	p, err := imageref.ParsePinned(repo + "@" + e.Digest)
	if err != nil {
		return imageref.Pinned{}, fmt.Errorf("%w: %w", ErrNotPinnable, err)
	}
	return p, nil
}

type rawHost struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Status     *rawStatus `json:"status"`
}

type rawStatus struct {
	Booted         *rawEntry `json:"booted"`
	Staged         *rawEntry `json:"staged"`
	Rollback       *rawEntry `json:"rollback"`
	RollbackQueued bool      `json:"rollbackQueued"`
}

type rawEntry struct {
	Image *rawImageStatus `json:"image"`
	// Composefs is set on a native composefs deployment (no ostree).
	Composefs         json.RawMessage `json:"composefs"`
	DownloadOnly      bool            `json:"downloadOnly"`
	SoftRebootCapable bool            `json:"softRebootCapable"`
	Pinned            bool            `json:"pinned"`
	Incompatible      bool            `json:"incompatible"`
}

type rawImageStatus struct {
	Image       *rawImageRef `json:"image"`
	ImageDigest string       `json:"imageDigest"`
	Version     *string      `json:"version"`
	Timestamp   *string      `json:"timestamp"`
}

type rawImageRef struct {
	Image     string          `json:"image"`
	Transport string          `json:"transport"`
	Signature json.RawMessage `json:"signature"`
}

// Parse reads the output of `bootc status --format=json`.
func Parse(data []byte) (Status, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return Status{}, fmt.Errorf("%w: not a JSON object", ErrMalformed)
	}
	var h rawHost
	if err := json.Unmarshal(trimmed, &h); err != nil {
		return Status{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if h.APIVersion != APIVersionV1 && h.APIVersion != APIVersionV1Alpha1 {
		return Status{}, fmt.Errorf("%w: apiVersion %q, want %s or %s", ErrMalformed, h.APIVersion, APIVersionV1, APIVersionV1Alpha1)
	}
	if h.Kind != Kind {
		return Status{}, fmt.Errorf("%w: kind %q, want %s", ErrMalformed, h.Kind, Kind)
	}
	if h.Status == nil {
		return Status{}, fmt.Errorf("%w: no status", ErrMalformed)
	}
	s := Status{APIVersion: h.APIVersion}
	var err error
	if s.Booted, err = convert("booted", h.Status.Booted); err != nil {
		return Status{}, err
	}
	if s.Staged, err = convert("staged", h.Status.Staged); err != nil {
		return Status{}, err
	}
	if s.Rollback, err = convert("rollback", h.Status.Rollback); err != nil {
		return Status{}, err
	}
	if h.Status.RollbackQueued && s.Rollback == nil {
		return Status{}, fmt.Errorf("%w: status.rollbackQueued without a rollback deployment", ErrMalformed)
	}
	s.RollbackQueued = h.Status.RollbackQueued
	return s, nil
}

func convert(name string, r *rawEntry) (*Entry, error) {
	if r == nil {
		return nil, nil
	}
	e := &Entry{
		DownloadOnly:      r.DownloadOnly,
		SoftRebootCapable: r.SoftRebootCapable,
		PinnedDeployment:  r.Pinned,
		Incompatible:      r.Incompatible,
	}
	// image: null is an ostree deployment bootc does not track (e.g. before
	// the first switch to a container image): valid, but not pinnable.
	if r.Image == nil {
		return e, nil
	}
	is := r.Image
	if is.Image == nil || is.Image.Image == "" {
		return nil, fmt.Errorf("%w: status.%s.image has no image reference", ErrMalformed, name)
	}
	if is.Image.Transport == "" {
		return nil, fmt.Errorf("%w: status.%s.image.image has no transport", ErrMalformed, name)
	}
	sig, err := parseSignature(is.Image.Signature)
	if err != nil {
		return nil, fmt.Errorf("%w: status.%s.image.image.signature: %w", ErrMalformed, name, err)
	}
	e.Signature = sig
	if composefs(r) && isHex64(is.ImageDigest) {
		// A composefs deployment made before bootc stored the manifest
		// digest in its origin reports a bare hex sha256 it computed
		// itself (crates/lib/src/bootc_composefs/status.rs, get_imginfo).
		is.ImageDigest = "sha256:" + is.ImageDigest
	}
	if !imageref.IsDigest(is.ImageDigest) {
		return nil, fmt.Errorf("%w: status.%s.image.imageDigest %q is not sha256:<64 lowercase hex>", ErrMalformed, name, is.ImageDigest)
	}
	e.Image = is.Image.Image
	e.Transport = is.Image.Transport
	e.Digest = is.ImageDigest
	if is.Version != nil {
		e.Version = *is.Version
	}
	if is.Timestamp != nil {
		ts, err := time.Parse(time.RFC3339Nano, *is.Timestamp)
		if err != nil {
			return nil, fmt.Errorf("%w: status.%s.image.timestamp: %w", ErrMalformed, name, err)
		}
		e.Timestamp = &ts
	}
	return e, nil
}

func composefs(r *rawEntry) bool {
	c := bytes.TrimSpace(r.Composefs)
	return len(c) > 0 && c[0] == '{'
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// parseSignature reads what bootc writes: absent or null (an unverified
// fetch), "insecure", "containerPolicy" or {"ostreeRemote": "<remote>"}.
func parseSignature(raw json.RawMessage) (Signature, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return SignatureInsecure, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		switch s {
		case "insecure":
			return SignatureInsecure, nil
		case "containerPolicy":
			return SignatureContainerPolicy, nil
		}
		return "", fmt.Errorf("unknown signature %q, want insecure or containerPolicy", text.Truncate(s, 40))
	case '{':
		var o map[string]json.RawMessage
		if err := json.Unmarshal(raw, &o); err != nil {
			return "", err
		}
		var remote string
		if v, ok := o["ostreeRemote"]; len(o) == 1 && ok && json.Unmarshal(v, &remote) == nil && remote != "" {
			return SignatureOstreeRemote, nil
		}
		return "", fmt.Errorf("want {\"ostreeRemote\": \"<remote>\"}, got %s", text.Truncate(string(raw), 80))
	}
	return "", fmt.Errorf("want a string or an object, got %s", text.Truncate(string(raw), 40))
}
