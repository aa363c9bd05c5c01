package bootc

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// Digests that appear in testdata/ (read from the files).
const (
	d47e5 = "sha256:47e5ed613a970b6574bfa954ab25bb6e85656552899aa518b5961d9645102b38"
	d736b = "sha256:736b359467c9437c1ac915acaae952aad854e07eb4a16a94999a48af08c83c34"
	d16dc = "sha256:16dc2b6256b4ff0d2ec18d2dbfb06d117904010c8cf9732cdb022818cf7a7566"
	db5bb = "sha256:b5bb9d8014a0f9b1d61e21e796d78dccdf1352f23cd32812f4850b878ae4944c"

	centos  = "quay.io/centos-bootc/centos-bootc:stream9"
	someimg = "quay.io/example/someimage:latest"
	otherim = "quay.io/otherexample/otherimage:latest"
)

type wantEntry struct {
	image, transport, digest string
	version                  string
	timestamp                string // RFC 3339, "" for none
	downloadOnly             bool
	pinnedDeployment         bool
	incompatible             bool
	pinned                   string // Pinned() result; "" means Pinned() must fail
}

func reg(image, digest, version, ts string) *wantEntry {
	repo := image[:strings.LastIndexByte(image, ':')]
	return &wantEntry{image: image, transport: "registry", digest: digest, version: version, timestamp: ts, pinned: repo + "@" + digest}
}

func with(w *wantEntry, f func(*wantEntry)) *wantEntry { f(w); return w }

func TestParseFixtures(t *testing.T) {
	const v1a1 = APIVersionV1Alpha1
	tests := []struct {
		file                     string
		api                      string
		booted, staged, rollback *wantEntry
	}{
		{file: "spec-booted-pinned.json", api: v1a1,
			booted: with(reg(centos, d47e5, "stream9.20240807.0", ""), func(w *wantEntry) { w.pinnedDeployment = true })},
		{file: "spec-booted-update-same-digest.json", api: v1a1, booted: reg(centos, d47e5, "stream9.20240807.0", "")},
		{file: "spec-booted-usroverlay.json", api: v1a1, booted: reg(someimg, d736b, "nightly", "2023-09-30T19:22:16Z")},
		{file: "spec-booted-with-update-no-version.json", api: v1a1, booted: reg(centos, d47e5, "stream9.20240807.0", "")},
		{file: "spec-booted-with-update.json", api: v1a1, booted: reg(centos, d47e5, "stream9.20240807.0", "2024-08-07T12:00:00Z")},
		{file: "spec-only-booted.json", api: v1a1, booted: reg(centos, d47e5, "stream9.20240807.0", "")},
		{file: "spec-ostree-remote.json", api: v1a1, booted: reg(otherim, db5bb, "20231230.1", "2023-12-30T16:10:11Z")},
		{file: "spec-ostree-to-bootc.json", api: v1a1,
			staged: reg(centos, d47e5, "stream9.20240807.0", ""),
			booted: &wantEntry{}},
		{file: "spec-rfe-ostree-deployment.json", api: v1a1,
			staged: &wantEntry{incompatible: true},
			booted: &wantEntry{}},
		{file: "spec-staged-booted.json", api: v1a1,
			staged: reg(someimg, d16dc, "nightly", "2023-10-14T19:22:15.42Z"),
			booted: reg(someimg, d736b, "nightly", "2023-09-30T19:22:16Z")},
		{file: "spec-staged-download-only.json", api: v1a1,
			staged: with(reg(someimg, d16dc, "nightly", "2023-10-14T19:22:15.42Z"), func(w *wantEntry) { w.downloadOnly = true }),
			booted: reg(someimg, d736b, "nightly", "2023-09-30T19:22:16Z")},
		{file: "spec-staged-rollback.json", api: v1a1,
			staged:   reg(someimg, d16dc, "nightly", "2023-10-14T19:22:15Z"),
			rollback: reg(someimg, d736b, "nightly", "2023-09-30T19:22:16Z")},
		{file: "spec-v1-null.json", api: APIVersionV1},
		{file: "spec-v1a1-orig.json", api: v1a1,
			staged: reg(someimg, d16dc, "nightly", "2023-10-14T19:22:15Z"),
			booted: reg(someimg, d736b, "nightly", "2023-09-30T19:22:16Z")},
		{file: "spec-v1a1.json", api: v1a1, booted: reg(otherim, db5bb, "20231230.1", "2023-12-30T16:10:11Z")},
		{file: "spec-via-local-oci.json", api: v1a1,
			booted: &wantEntry{image: "/var/mnt/osupdate", transport: "oci", digest: d47e5, version: "stream9.20240807.0"}},
	}
	files, _ := filepath.Glob("testdata/*.json")
	covered := map[string]bool{"host-v1.schema.json": true}
	for _, tc := range tests {
		covered[tc.file] = true
		t.Run(strings.TrimSuffix(tc.file, ".json"), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			s, err := Parse(data)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if s.APIVersion != tc.api {
				t.Errorf("APIVersion = %q, want %q", s.APIVersion, tc.api)
			}
			checkEntry(t, "booted", s.Booted, tc.booted)
			checkEntry(t, "staged", s.Staged, tc.staged)
			checkEntry(t, "rollback", s.Rollback, tc.rollback)
		})
	}
	for _, f := range files {
		if !covered[filepath.Base(f)] {
			t.Errorf("fixture %s has no expectation in this table", f)
		}
	}
}

func checkEntry(t *testing.T, name string, got *Entry, want *wantEntry) {
	t.Helper()
	if want == nil {
		if got != nil {
			t.Errorf("%s = %+v, want nil", name, got)
		}
		return
	}
	if got == nil {
		t.Fatalf("%s = nil, want %+v", name, want)
	}
	ts := ""
	if got.Timestamp != nil {
		ts = got.Timestamp.Format(time.RFC3339Nano)
	}
	gotW := wantEntry{
		image: got.Image, transport: got.Transport, digest: got.Digest, version: got.Version,
		timestamp: ts, downloadOnly: got.DownloadOnly, pinnedDeployment: got.PinnedDeployment,
		incompatible: got.Incompatible,
	}
	p, err := got.Pinned()
	if err == nil {
		gotW.pinned = p.String()
	} else if !errors.Is(err, ErrNotPinnable) {
		t.Errorf("%s.Pinned() error %v does not wrap ErrNotPinnable", name, err)
	}
	if gotW != *want {
		t.Errorf("%s:\n got %+v\nwant %+v", name, gotW, *want)
	}
}

// serde_yaml writes enum variants as tags (`!ostreeRemote "fedora"`); its
// JSON form is {"ostreeRemote": "fedora"}.
var yamlTag = regexp.MustCompile(`!(ostreeRemote) ("[^"]*"|\S+)`)

func TestYAMLFixturesMatchJSON(t *testing.T) {
	yamls, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(yamls) == 0 {
		t.Fatalf("no YAML fixtures: %v", err)
	}
	for _, y := range yamls {
		name := strings.TrimSuffix(filepath.Base(y), ".yaml")
		t.Run(name, func(t *testing.T) {
			yb, err := os.ReadFile(y)
			if err != nil {
				t.Fatal(err)
			}
			jb, err := os.ReadFile(strings.TrimSuffix(y, ".yaml") + ".json")
			if err != nil {
				t.Fatal(err)
			}
			yb = yamlTag.ReplaceAll(yb, []byte("{$1: $2}"))
			fromYAML, err := yaml.YAMLToJSON(yb)
			if err != nil {
				t.Fatalf("YAMLToJSON: %v", err)
			}
			var a, b any
			if err := decodeNumbers(fromYAML, &a); err != nil {
				t.Fatal(err)
			}
			if err := decodeNumbers(jb, &b); err != nil {
				t.Fatal(err)
			}
			normalize(a)
			normalize(b)
			if !reflect.DeepEqual(a, b) {
				t.Errorf("YAML and JSON documents differ:\nyaml: %s\njson: %s", fromYAML, jb)
			}
			typed, err := json.Marshal(a)
			if err != nil {
				t.Fatal(err)
			}
			sy, err := Parse(typed)
			if err != nil {
				t.Fatalf("Parse(YAML as JSON): %v", err)
			}
			sj, err := Parse(jb)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(sy, sj) {
				t.Errorf("parsed statuses differ: %+v vs %+v", sy, sj)
			}
		})
	}
}

func decodeNumbers(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return dec.Decode(v)
}

// normalize reads a generic document the way bootc's typed reader does:
// RFC 3339 strings get one spelling (YAML writes 19:22:15.42Z where JSON
// has 19:22:15.420000Z), and a plain YAML scalar under "version"
// (version: 20231230.1) is the string bootc deserializes it to.
func normalize(v any) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			switch s := e.(type) {
			case string:
				if ts, err := time.Parse(time.RFC3339Nano, s); err == nil {
					x[k] = ts.UTC().Format(time.RFC3339Nano)
				}
			case json.Number:
				if k == "version" {
					x[k] = s.String()
				}
			default:
				normalize(e)
			}
		}
	case []any:
		for _, e := range x {
			normalize(e)
		}
	}
}

const okEntry = `{"image":{"image":{"image":"quay.io/a/b:1","transport":"registry"},"imageDigest":"` + d47e5 + `","architecture":"amd64"},"incompatible":false,"pinned":false}`

func doc(api, kind, status string) string {
	return `{"apiVersion":"` + api + `","kind":"` + kind + `","status":` + status + `}`
}

func TestParseAccepts(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want func(Status) bool
	}{
		{"signature as string", doc(APIVersionV1, Kind, `{"booted":{"image":{"image":{"image":"q.io/a:1","transport":"registry","signature":"insecure"},"imageDigest":"`+d47e5+`"}}}`),
			func(s Status) bool { return s.Booted.Digest == d47e5 && s.Booted.Signature == SignatureInsecure }},
		{"signature as object", doc(APIVersionV1, Kind, `{"booted":{"image":{"image":{"image":"q.io/a:1","transport":"registry","signature":{"ostreeRemote":"x"}},"imageDigest":"`+d47e5+`"}}}`),
			func(s Status) bool { return s.Booted.Digest == d47e5 && s.Booted.Signature == SignatureOstreeRemote }},
		{"signature containerPolicy", doc(APIVersionV1, Kind, `{"staged":{"image":{"image":{"image":"q.io/a:1","transport":"registry","signature":"containerPolicy"},"imageDigest":"`+d47e5+`"}}}`),
			func(s Status) bool { return s.Staged.Signature == SignatureContainerPolicy }},
		// bootc maps an unverified fetch to no signature (crates/lib/src/status.rs).
		{"signature absent is insecure", doc(APIVersionV1, Kind, `{"staged":`+okEntry+`}`),
			func(s Status) bool { return s.Staged.Signature == SignatureInsecure }},
		{"signature null is insecure", doc(APIVersionV1, Kind, `{"staged":{"image":{"image":{"image":"q.io/a:1","transport":"registry","signature":null},"imageDigest":"`+d47e5+`"}}}`),
			func(s Status) bool { return s.Staged.Signature == SignatureInsecure }},
		{"no image, no signature", doc(APIVersionV1, Kind, `{"booted":{"image":null}}`),
			func(s Status) bool { return s.Booted.Signature == SignatureNone }},
		{"unknown fields ignored", doc(APIVersionV1, Kind, `{"future":[1,2],"booted":{"composefs":{"x":1},"softRebootCapable":true,"image":{"image":{"image":"q.io/a:1","transport":"registry","new":1},"imageDigest":"`+d47e5+`"}}}`),
			func(s Status) bool { return s.Booted.SoftRebootCapable }},
		{"composefs entry with an OCI digest", doc(APIVersionV1, Kind, `{"booted":{"store":"composefs","ostree":null,"composefs":{"verity":"`+strings.Repeat("ab", 64)+`","bootType":"bls","bootloader":"systemd","missingVerityAllowed":false},"image":{"image":{"image":"q.io/a:1","transport":"registry"},"imageDigest":"`+d47e5+`"},"incompatible":false,"pinned":false}}`),
			func(s Status) bool { return s.Booted.Digest == d47e5 }},
		{"legacy composefs entry with a bare hex digest", doc(APIVersionV1, Kind, `{"booted":{"composefs":{"verity":"`+strings.Repeat("ab", 64)+`","bootType":"bls","bootloader":"grub","missingVerityAllowed":true},"image":{"image":{"image":"q.io/a:1","transport":"registry"},"imageDigest":"`+strings.TrimPrefix(d47e5, "sha256:")+`"},"incompatible":false,"pinned":false}}`),
			func(s Status) bool { return s.Booted.Digest == d47e5 }},
		{"absent entries are nil", doc(APIVersionV1, Kind, `{}`),
			func(s Status) bool { return s.Booted == nil && s.Staged == nil && s.Rollback == nil }},
		{"trailing newline", doc(APIVersionV1, Kind, `{"staged":`+okEntry+`}`) + "\n",
			func(s Status) bool { return s.Staged != nil && s.Staged.Digest == d47e5 }},
		{"rollback queued", doc(APIVersionV1, Kind, `{"booted":`+okEntry+`,"rollback":`+okEntry+`,"rollbackQueued":true}`),
			func(s Status) bool { return s.RollbackQueued && s.Rollback != nil }},
		{"rollback not queued", doc(APIVersionV1, Kind, `{"booted":`+okEntry+`,"rollback":`+okEntry+`,"rollbackQueued":false}`),
			func(s Status) bool { return !s.RollbackQueued && s.Rollback != nil }},
		{"rollbackQueued absent (older bootc)", doc(APIVersionV1, Kind, `{"booted":`+okEntry+`,"rollback":`+okEntry+`}`),
			func(s Status) bool { return !s.RollbackQueued }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse([]byte(tc.in))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !tc.want(s) {
				t.Errorf("unexpected result %+v", s)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	entryWith := func(digest string) string {
		return `{"booted":{"image":{"image":{"image":"quay.io/a/b:1","transport":"registry"},"imageDigest":"` + digest + `"}}}`
	}
	tests := []struct {
		name string
		in   string
	}{
		{"empty", ``},
		{"not JSON", `Image: quay.io/a/b:1`},
		{"YAML output", "apiVersion: org.containers.bootc/v1\nkind: BootcHost\n"},
		{"JSON array", `[]`},
		{"trailing garbage", doc(APIVersionV1, Kind, `{}`) + `x`},
		{"unknown apiVersion", doc("org.containers.bootc/v2", Kind, `{}`)},
		{"missing apiVersion", `{"kind":"BootcHost","status":{}}`},
		{"wrong kind", doc(APIVersionV1, "Host", `{}`)},
		{"no status", `{"apiVersion":"org.containers.bootc/v1","kind":"BootcHost"}`},
		{"status not an object", doc(APIVersionV1, Kind, `"booted"`)},
		{"entry not an object", doc(APIVersionV1, Kind, `{"booted":"quay.io/a/b"}`)},
		{"digest missing", doc(APIVersionV1, Kind, `{"booted":{"image":{"image":{"image":"quay.io/a/b:1","transport":"registry"}}}}`)},
		{"digest uppercase", doc(APIVersionV1, Kind, entryWith(strings.ToUpper(d47e5)))},
		{"digest short", doc(APIVersionV1, Kind, entryWith(d47e5[:70]))},
		{"digest sha512", doc(APIVersionV1, Kind, entryWith("sha512:"+strings.Repeat("a", 128)))},
		{"digest with newline", doc(APIVersionV1, Kind, entryWith(d47e5+`\n`))},
		{"bare hex digest outside composefs", doc(APIVersionV1, Kind, entryWith(strings.TrimPrefix(d47e5, "sha256:")))},
		{"image status without image ref", doc(APIVersionV1, Kind, `{"staged":{"image":{"imageDigest":"`+d47e5+`"}}}`)},
		{"image ref empty", doc(APIVersionV1, Kind, `{"staged":{"image":{"image":{"image":"","transport":"registry"},"imageDigest":"`+d47e5+`"}}}`)},
		{"no transport", doc(APIVersionV1, Kind, `{"staged":{"image":{"image":{"image":"q.io/a:1"},"imageDigest":"`+d47e5+`"}}}`)},
		{"signature unknown string", doc(APIVersionV1, Kind, `{"staged":{"image":{"image":{"image":"q.io/a:1","transport":"registry","signature":"trustMe"},"imageDigest":"`+d47e5+`"}}}`)},
		{"signature object without remote", doc(APIVersionV1, Kind, `{"staged":{"image":{"image":{"image":"q.io/a:1","transport":"registry","signature":{"other":"x"}},"imageDigest":"`+d47e5+`"}}}`)},
		{"signature remote not a string", doc(APIVersionV1, Kind, `{"staged":{"image":{"image":{"image":"q.io/a:1","transport":"registry","signature":{"ostreeRemote":1}},"imageDigest":"`+d47e5+`"}}}`)},
		{"signature a number", doc(APIVersionV1, Kind, `{"staged":{"image":{"image":{"image":"q.io/a:1","transport":"registry","signature":3},"imageDigest":"`+d47e5+`"}}}`)},
		{"bad timestamp", doc(APIVersionV1, Kind, `{"staged":{"image":{"image":{"image":"q.io/a:1","transport":"registry"},"imageDigest":"`+d47e5+`","timestamp":"yesterday"}}}`)},
		{"downloadOnly not a bool", doc(APIVersionV1, Kind, `{"staged":{"downloadOnly":"yes"}}`)},
		{"rollbackQueued not a bool", doc(APIVersionV1, Kind, `{"booted":`+okEntry+`,"rollback":`+okEntry+`,"rollbackQueued":"yes"}`)},
		// bootc queues a rollback only when there is one (crates/lib/src/status.rs).
		{"rollbackQueued without a rollback deployment", doc(APIVersionV1, Kind, `{"booted":`+okEntry+`,"rollbackQueued":true}`)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse([]byte(tc.in))
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", s)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("error %v does not wrap ErrMalformed", err)
			}
		})
	}
}

func TestEntryPinned(t *testing.T) {
	tests := []struct {
		name string
		e    *Entry
		want string // "" = error
	}{
		{"tag ref", &Entry{Image: "quay.io/a/b:1", Transport: "registry", Digest: d47e5}, "quay.io/a/b@" + d47e5},
		{"digest ref keeps entry digest", &Entry{Image: "quay.io/a/b@" + d736b, Transport: "registry", Digest: d736b}, "quay.io/a/b@" + d736b},
		{"tag and digest ref", &Entry{Image: "quay.io/a/b:1@" + d736b, Transport: "registry", Digest: d47e5}, "quay.io/a/b@" + d47e5},
		{"registry with port", &Entry{Image: "localhost:5000/os:v2", Transport: "registry", Digest: d47e5}, "localhost:5000/os@" + d47e5},
		{"nil entry", nil, ""},
		{"ostree only", &Entry{}, ""},
		{"oci transport", &Entry{Image: "quay.io/a/b:1", Transport: "oci", Digest: d47e5}, ""},
		{"invalid image", &Entry{Image: "quay.io/a/b:1; rm -rf /", Transport: "registry", Digest: d47e5}, ""},
		{"no digest", &Entry{Image: "quay.io/a/b:1", Transport: "registry"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := tc.e.Pinned()
			if tc.want == "" {
				if err == nil {
					t.Fatalf("Pinned() = %v, want an error", p)
				}
				if !errors.Is(err, ErrNotPinnable) {
					t.Errorf("error %v does not wrap ErrNotPinnable", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Pinned(): %v", err)
			}
			if p.String() != tc.want {
				t.Errorf("Pinned() = %s, want %s", p, tc.want)
			}
		})
	}
}
