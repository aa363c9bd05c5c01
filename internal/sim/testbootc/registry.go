package testbootc

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// This file is the registry client of pull mode. It follows containers/image's
// docker transport (vendored by skopeo as go.podman.io/image/v5/docker), which
// is what bootc's image proxy (`skopeo experimental-image-proxy`) runs, so
// that failures read as they do on a real host:
//
//   - docker_client.go, detectPropertiesHelper: GET https://<host>/v2/,
//     200 or 401 accepted, the challenges kept; "pinging container registry
//     <host>: <cause>" on failure. Plain HTTP only for an insecure registry
//     (registries.conf), which is not modelled: pull mode requires TLS.
//   - docker_client.go, setupRequestAuth: a "basic" challenge gets the
//     credentials from auth.json (empty ones when there are none); "bearer"
//     token exchange is not modelled (an error says so).
//   - docker_client.go, fetchManifest: "reading manifest <ref> in <name>: <err>".
//   - errors.go, registryHTTPResponseToError, and distribution_error.go,
//     handleErrorResponse/parseHTTPErrorResponse: the registry's errcode
//     JSON, a default message printed alone, others as "<code>: <message>".
//   - docker_client.go, dockerCertDir, and pkg/tlsclientconfig: the system
//     roots plus every *.crt in the first existing of
//     /etc/containers/certs.d/<host:port> and /etc/docker/certs.d/<host:port>
//     (containers-certs.d(5)); client certificates (*.cert/*.key) are not
//     modelled.

// maxManifestBody is iolimits.MaxManifestBodySize (4 MiB) of containers/image.
const maxManifestBody = 4 << 20

// maxSignatureBody is iolimits.MaxSignatureBodySize (4 MiB).
const maxSignatureBody = 4 << 20

// Manifest media types containers/image asks for (manifest.DefaultRequestedManifestMIMETypes).
const (
	mediaOCIManifest    = "application/vnd.oci.image.manifest.v1+json"
	mediaOCIIndex       = "application/vnd.oci.image.index.v1+json"
	mediaDockerManifest = "application/vnd.docker.distribution.manifest.v2+json"
	mediaDockerList     = "application/vnd.docker.distribution.manifest.list.v2+json"
)

var acceptManifests = []string{mediaOCIManifest, mediaDockerManifest, mediaDockerList, mediaOCIIndex}

// registryClient talks to one registry as containers/image's dockerClient does.
type registryClient struct {
	host       string // host[:port] as in the reference
	endpoint   string // host the requests go to (docker.io: registry-1.docker.io)
	user, pass string
	http       *http.Client
	pinged     bool
	basic      bool // the ping offered a basic challenge
	bearer     bool
}

// newRegistryClient sets up TLS trust for host from root's certs.d.
func newRegistryClient(root, host string, cred credential) (*registryClient, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if err := addCertsD(pool, root, host); err != nil {
		return nil, err
	}
	endpoint := host
	if host == "docker.io" {
		endpoint = "registry-1.docker.io" // docker_client.go, dockerRegistry
	}
	tr := &http.Transport{
		TLSClientConfig:       &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   30 * time.Second,
		ResponseHeaderTimeout: 2 * time.Minute,
		Proxy:                 http.ProxyFromEnvironment,
	}
	return &registryClient{host: host, endpoint: endpoint, user: cred.user, pass: cred.pass,
		http: &http.Client{Transport: tr}}, nil
}

// addCertsD adds the *.crt files of the first existing per-host directory
// (docker_client.go, perHostCertDirs; tlsclientconfig.SetupCertificates).
func addCertsD(pool *x509.CertPool, root, host string) error {
	for _, base := range []string{"etc/containers/certs.d", "etc/docker/certs.d"} {
		dir := filepath.Join(root, base, host)
		entries, err := os.ReadDir(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		names := make([]string, 0, len(entries))
		for _, e := range entries {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		for _, name := range names {
			if !strings.HasSuffix(name, ".crt") {
				continue
			}
			data, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				return err
			}
			if !pool.AppendCertsFromPEM(data) {
				// tlsclientconfig: "unable to parse any certificates in %s"... the
				// system pool append silently ignores junk; containers/image
				// does the same (AppendCertsFromPEM result unchecked).
				continue
			}
		}
		return nil // only the first existing directory is used
	}
	return nil
}

// ping is detectPropertiesHelper: https only.
func (c *registryClient) ping(ctx context.Context) error {
	if c.pinged {
		return nil
	}
	u := "https://" + c.endpoint + "/v2/"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	res, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("pinging container registry %s: %w", c.host, err)
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20))
	if res.StatusCode != http.StatusOK && res.StatusCode != http.StatusUnauthorized {
		return fmt.Errorf("pinging container registry %s: %w", c.host, registryHTTPResponseToError(res))
	}
	for _, h := range res.Header.Values("WWW-Authenticate") {
		scheme, _, _ := strings.Cut(strings.TrimSpace(h), " ")
		switch strings.ToLower(scheme) {
		case "basic":
			c.basic = true
		case "bearer":
			c.bearer = true
		}
	}
	c.pinged = true
	return nil
}

func (c *registryClient) get(ctx context.Context, path string, accept []string) (*http.Response, error) {
	if err := c.ping(ctx); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+c.endpoint+path, nil)
	if err != nil {
		return nil, err
	}
	if len(accept) > 0 {
		req.Header.Set("Accept", strings.Join(accept, ", "))
	}
	switch {
	case c.basic:
		req.SetBasicAuth(c.user, c.pass)
	case c.bearer:
		return nil, errors.New("test-bootc: bearer token authentication is not modelled; use a registry with basic authentication")
	}
	return c.http.Do(req)
}

// manifest fetches repo's manifest tagOrDigest: body and media type.
func (c *registryClient) manifest(ctx context.Context, repo, tagOrDigest string) ([]byte, string, error) {
	name := c.host + "/" + repo
	res, err := c.get(ctx, "/v2/"+repo+"/manifests/"+tagOrDigest, acceptManifests)
	if err != nil {
		return nil, "", fmt.Errorf("fetching manifest %s in %s: %w", tagOrDigest, name, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, "", fmt.Errorf("reading manifest %s in %s: %w", tagOrDigest, name, registryHTTPResponseToError(res))
	}
	body, err := readAtMost(res.Body, maxManifestBody)
	if err != nil {
		return nil, "", fmt.Errorf("reading manifest body %s in %s: %w", tagOrDigest, name, err)
	}
	mt, _, _ := strings.Cut(res.Header.Get("Content-Type"), ";")
	return body, strings.TrimSpace(mt), nil
}

// blob fetches a blob of at most limit bytes and checks its digest
// (docker_client.go, getBlob and getOCIDescriptorContents).
func (c *registryClient) blob(ctx context.Context, repo, digest string, limit int) ([]byte, error) {
	if !isSHA256Digest(digest) {
		return nil, fmt.Errorf("invalid digest %q: unsupported digest algorithm or malformed value", digest)
	}
	res, err := c.get(ctx, "/v2/"+repo+"/blobs/"+digest, nil)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetching blob: %w", registryHTTPResponseToError(res))
	}
	data, err := readAtMost(res.Body, limit)
	if err != nil {
		return nil, fmt.Errorf("reading blob %s in %s/%s: %w", digest, c.host, repo, err)
	}
	if got := sha256Digest(data); got != digest {
		return nil, fmt.Errorf("digest mismatch, expected %q, got %q", digest, got)
	}
	return data, nil
}

func readAtMost(r io.Reader, limit int) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(data) > limit {
		return nil, fmt.Errorf("exceeded maximum allowed size of %d bytes", limit)
	}
	return data, nil
}

// errcodeDefaults are docker/distribution's registered error codes and
// their default messages (registry/api/errcode/register.go,
// registry/api/v2/errors.go), the ones containers/image prints alone.
var errcodeDefaults = map[string]string{
	"UNKNOWN":               "unknown error",
	"UNSUPPORTED":           "The operation is unsupported.",
	"UNAUTHORIZED":          "authentication required",
	"DENIED":                "requested access to the resource is denied",
	"UNAVAILABLE":           "service unavailable",
	"TOOMANYREQUESTS":       "too many requests",
	"MANIFEST_UNKNOWN":      "manifest unknown",
	"MANIFEST_INVALID":      "manifest invalid",
	"NAME_UNKNOWN":          "repository name not known to registry",
	"NAME_INVALID":          "invalid repository name",
	"BLOB_UNKNOWN":          "blob unknown to registry",
	"TAG_INVALID":           "manifest tag did not match URI",
	"MANIFEST_BLOB_UNKNOWN": "blob unknown to registry",
}

// registryError is one errcode.Error as containers/image prints it.
type registryError struct {
	Status  int
	Code    string
	Message string
}

func (e *registryError) Error() string {
	if e.Code == "" { // unexpectedHTTPResponseError
		return e.Message
	}
	if def, ok := errcodeDefaults[e.Code]; ok && e.Message == def {
		return e.Message
	}
	return strings.ToLower(strings.ReplaceAll(e.Code, "_", " ")) + ": " + e.Message
}

// manifestUnknown is isManifestUnknownError (docker_client.go).
func (e *registryError) manifestUnknown() bool {
	return e.Code == "MANIFEST_UNKNOWN" || e.Code == "" && e.Status == http.StatusNotFound ||
		e.Code == "UNKNOWN" && strings.Contains(strings.ToLower(e.Message), "not found")
}

// registryHTTPResponseToError turns an error response into the first
// errcode.Error of its body, as containers/image does.
func registryHTTPResponseToError(res *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	var doc struct {
		Details string `json:"details"`
		Errors  []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"errors"`
	}
	jsonErr := json.Unmarshal(body, &doc)
	switch {
	case jsonErr == nil && doc.Details != "":
		code := "UNKNOWN"
		switch res.StatusCode {
		case http.StatusUnauthorized:
			code = "UNAUTHORIZED"
		case http.StatusTooManyRequests:
			code = "TOOMANYREQUESTS"
		}
		return &registryError{Status: res.StatusCode, Code: code, Message: doc.Details}
	case jsonErr == nil && len(doc.Errors) > 0:
		e := doc.Errors[0]
		code := e.Code
		if _, ok := errcodeDefaults[code]; !ok {
			code = "UNKNOWN" // errcode.ParseErrorCode of an unregistered value
		}
		msg := e.Message
		if msg == "" {
			msg = errcodeDefaults[code]
		}
		return &registryError{Status: res.StatusCode, Code: code, Message: msg}
	case res.StatusCode == http.StatusUnauthorized:
		return &registryError{Status: res.StatusCode, Code: "UNAUTHORIZED", Message: errcodeDefaults["UNAUTHORIZED"]}
	}
	resp := string(body)
	if len(resp) > 50 {
		resp = resp[:50] + "..."
	}
	return &registryError{Status: res.StatusCode, Message: fmt.Sprintf("StatusCode: %d, %q", res.StatusCode, resp)}
}

func sha256Digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func isSHA256Digest(s string) bool {
	h, ok := strings.CutPrefix(s, "sha256:")
	return ok && isLowerHex64(h)
}

func isLowerHex64(s string) bool {
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
