package testbootc

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"runtime"
	"time"
)

// Output types mirror bootc's BootcHost serialization (host-v1.schema.json):
// same field names, same nulls, same order.
type docHost struct {
	APIVersion string    `json:"apiVersion"`
	Kind       string    `json:"kind"`
	Metadata   docMeta   `json:"metadata"`
	Spec       docSpec   `json:"spec"`
	Status     docStatus `json:"status"`
}

type docMeta struct {
	Name string `json:"name"`
}

type docSpec struct {
	Image     *docImageRef `json:"image"`
	BootOrder string       `json:"bootOrder"`
}

type docImageRef struct {
	Image     string `json:"image"`
	Transport string `json:"transport"`
	// Signature is absent for an unverified fetch (bootc's
	// skip_serializing_if on Option<ImageSignature>, crates/lib/src/spec.rs).
	Signature string `json:"signature,omitempty"`
}

type docStatus struct {
	Staged         *docEntry `json:"staged"`
	Booted         *docEntry `json:"booted"`
	Rollback       *docEntry `json:"rollback"`
	RollbackQueued bool      `json:"rollbackQueued"`
	Type           *string   `json:"type"`
}

type docEntry struct {
	Image             *docImageStatus `json:"image"`
	CachedUpdate      *docImageStatus `json:"cachedUpdate"`
	Incompatible      bool            `json:"incompatible"`
	Pinned            bool            `json:"pinned"`
	SoftRebootCapable bool            `json:"softRebootCapable"`
	DownloadOnly      bool            `json:"downloadOnly"`
	Store             string          `json:"store"`
	Ostree            docOstree       `json:"ostree"`
}

type docImageStatus struct {
	Image        docImageRef `json:"image"`
	Version      *string     `json:"version"`
	Timestamp    *string     `json:"timestamp"`
	ImageDigest  string      `json:"imageDigest"`
	Architecture string      `json:"architecture"`
}

type docOstree struct {
	Checksum     string `json:"checksum"`
	DeploySerial uint32 `json:"deploySerial"`
	Stateroot    string `json:"stateroot"`
}

const defaultAPIVersion = "org.containers.bootc/v1"

func render(s State) []byte {
	api := s.Knobs.APIVersion
	if api == "" {
		api = defaultAPIVersion
	}
	h := docHost{
		APIVersion: api,
		Kind:       "BootcHost",
		Metadata:   docMeta{Name: "host"},
		Spec:       docSpec{BootOrder: "default"},
		Status: docStatus{
			Staged:   entry(s.Staged),
			Booted:   entry(s.Booted),
			Rollback: entry(s.Rollback),
		},
	}
	// A queued rollback shows as rollbackQueued and spec.bootOrder
	// "rollback"; it needs a booted and a rollback deployment (bootc
	// crates/lib/src/status.rs, get_status).
	if s.RollbackQueued && s.Booted != nil && s.Rollback != nil {
		h.Status.RollbackQueued = true
		h.Spec.BootOrder = "rollback"
	}
	// spec.image is what the next boot tracks: the staged image if any.
	for _, d := range []*Deployment{s.Staged, s.Booted} {
		if d != nil {
			h.Spec.Image = &docImageRef{Image: d.Image, Transport: "registry", Signature: d.Signature}
			break
		}
	}
	if s.Booted != nil {
		t := "bootcHost"
		h.Status.Type = &t
	}
	out, err := json.Marshal(h)
	if err != nil {
		panic(err) // only plain types above
	}
	return out
}

func entry(d *Deployment) *docEntry {
	if d == nil {
		return nil
	}
	is := &docImageStatus{
		Image:        docImageRef{Image: d.Image, Transport: "registry", Signature: d.Signature},
		ImageDigest:  d.Digest,
		Architecture: runtime.GOARCH,
	}
	if d.Version != "" {
		v := d.Version
		is.Version = &v
	}
	if d.Timestamp != nil {
		ts := d.Timestamp.UTC().Format(time.RFC3339Nano)
		is.Timestamp = &ts
	}
	// A stable stand-in for the ostree commit the image was imported into.
	sum := sha256.Sum256([]byte(d.Digest))
	return &docEntry{
		Image:             is,
		SoftRebootCapable: d.SoftRebootCapable,
		DownloadOnly:      d.DownloadOnly,
		Store:             "ostreeContainer",
		Ostree:            docOstree{Checksum: hex.EncodeToString(sum[:]), Stateroot: "default"},
	}
}
