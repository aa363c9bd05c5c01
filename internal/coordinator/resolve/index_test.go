package resolve

import (
	"context"
	"crypto/sha256"
	hexpkg "encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/bootc-fleet/bootc-fleet/internal/coordinator/platform"
)

// pushIndex writes a multi-arch index of fresh random images, one per
// platform ("os/arch[/variant]"), to ref (host-relative) and returns the
// index digest and each platform's image digest.
func (tr *testRegistry) pushIndex(t testing.TB, ref string, platforms ...string) (v1.Hash, map[string]v1.Hash) {
	t.Helper()
	var adds []mutate.IndexAddendum
	digests := map[string]v1.Hash{}
	for _, p := range platforms {
		img, err := random.Image(256, 1)
		if err != nil {
			t.Fatal(err)
		}
		pl, err := v1.ParsePlatform(p)
		if err != nil {
			t.Fatal(err)
		}
		if digests[p], err = img.Digest(); err != nil {
			t.Fatal(err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: pl}})
	}
	return tr.writeIndex(t, ref, mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)), digests
}

func (tr *testRegistry) writeIndex(t testing.TB, ref string, idx v1.ImageIndex) v1.Hash {
	t.Helper()
	tag, err := name.NewTag(tr.host+"/"+ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatalf("pushing index %s: %v", tag, err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// rawManifest is a manifest pushed byte for byte, as a registry might hold it.
type rawManifest struct {
	body []byte
	mt   types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.body, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mt, nil }

func (tr *testRegistry) putRaw(t testing.TB, ref string, mt types.MediaType, body []byte) {
	t.Helper()
	tag, err := name.NewTag(tr.host+"/"+ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Put(tag, rawManifest{body, mt}); err != nil {
		t.Fatalf("putting %s: %v", tag, err)
	}
}

func TestResolveMultiArchIndexGivesEachPlatformItsImage(t *testing.T) {
	tr := newRegistry(t)
	idx, imgs := tr.pushIndex(t, "fleet/multi:1", "linux/amd64", "linux/arm64/v8")
	r := tr.resolver(Options{})
	tr.manifests.Store(0)
	got, err := r.Resolve(context.Background(), tr.host+"/fleet/multi:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Image.String() != tr.host+"/fleet/multi@"+idx.String() {
		t.Fatalf("Image = %s, want the index digest %s", got.Image, idx)
	}
	if got.Index == nil || got.Index.Digest != idx.String() {
		t.Fatalf("Index = %+v, want the index read", got.Index)
	}
	for _, c := range []struct{ arch, want string }{{"amd64", "linux/amd64"}, {"arm64", "linux/arm64/v8"}} {
		d, p := got.Index.For("linux", c.arch)
		if p != nil || d != imgs[c.want].String() {
			t.Fatalf("image for linux/%s = %q, %v; want %s", c.arch, d, p, imgs[c.want])
		}
	}
	if _, p := got.Index.For("linux", "s390x"); p == nil || p.Reason != platform.ReasonNotInIndex {
		t.Fatalf("linux/s390x: %v, want %s", p, platform.ReasonNotInIndex)
	}
	if n := tr.manifests.Load(); n != 2 {
		t.Fatalf("first resolution of an index took %d manifest requests, want 2 (HEAD the tag, GET the index)", n)
	}
	// The tag still names the same index: HEAD only, as for a single manifest.
	tr.manifests.Store(0)
	again, err := r.Resolve(context.Background(), tr.host+"/fleet/multi:1", nil)
	if err != nil || again.Index != got.Index {
		t.Fatalf("again: %+v, %v", again, err)
	}
	if n := tr.manifests.Load(); n != 1 {
		t.Fatalf("re-resolving an unchanged index took %d manifest requests, want 1", n)
	}
	// The tag moves to a new index: read again.
	idx2, imgs2 := tr.pushIndex(t, "fleet/multi:1", "linux/amd64", "linux/arm64")
	moved, err := r.Resolve(context.Background(), tr.host+"/fleet/multi:1", nil)
	if err != nil || moved.Image.Digest != idx2.String() {
		t.Fatalf("after the tag moved: %+v, %v; want %s", moved, err, idx2)
	}
	if d, _ := moved.Index.For("linux", "arm64"); d != imgs2["linux/arm64"].String() {
		t.Fatalf("arm64 after the tag moved: %s, want %s", d, imgs2["linux/arm64"])
	}
}

func TestResolveDockerManifestListWhenHeadFails(t *testing.T) {
	tr := newRegistry(t)
	var adds []mutate.IndexAddendum
	imgs := map[string]v1.Hash{}
	for _, arch := range []string{"amd64", "arm64"} {
		img, _ := random.Image(128, 1)
		img = mutate.MediaType(img, types.DockerManifestSchema2)
		imgs[arch], _ = img.Digest()
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{MediaType: types.DockerManifestSchema2, Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	list := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.DockerManifestList), adds...)
	want := tr.writeIndex(t, "fleet/list:1", list)
	tr.wrap = func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if r.Method == http.MethodHead && strings.Contains(r.URL.Path, "/manifests/") {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	}
	got, err := tr.resolver(Options{}).Resolve(context.Background(), tr.host+"/fleet/list:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Image.Digest != want.String() || got.Index == nil {
		t.Fatalf("Resolve = %+v, want the manifest list %s read", got, want)
	}
	if d, _ := got.Index.For("linux", "arm64"); d != imgs["arm64"].String() {
		t.Fatalf("arm64: %s, want %s", d, imgs["arm64"])
	}
}

func TestResolveIndexSkipsWhatNoNodeCanBoot(t *testing.T) {
	tr := newRegistry(t)
	amd, _ := random.Image(128, 1)
	amdDigest, _ := amd.Digest()
	att, _ := random.Image(64, 1)
	nested, _ := random.Index(64, 1, 1)
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		// buildx's attestation manifest: an image manifest for unknown/unknown.
		mutate.IndexAddendum{Add: att, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "unknown", Architecture: "unknown"},
			Annotations: map[string]string{"vnd.docker.reference.type": "attestation-manifest", "vnd.docker.reference.digest": amdDigest.String()}}},
		// An index inside the index, claiming arm64: not an image manifest.
		mutate.IndexAddendum{Add: nested, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
	)
	tr.writeIndex(t, "fleet/mixed:1", idx)
	got, err := tr.resolver(Options{}).Resolve(context.Background(), tr.host+"/fleet/mixed:1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ps := got.Index.Platforms(); len(ps) != 1 || ps[0] != "linux/amd64" {
		t.Fatalf("platforms %v, want only linux/amd64", ps)
	}
	if d, _ := got.Index.For("linux", "amd64"); d != amdDigest.String() {
		t.Fatalf("amd64: %s, want %s", d, amdDigest)
	}
	if _, p := got.Index.For("linux", "arm64"); p == nil || p.Reason != platform.ReasonNotInIndex {
		t.Fatalf("arm64 matched a nested index: %v", p)
	}
}

func TestResolveRefusesIndexesItCannotUse(t *testing.T) {
	tr := newRegistry(t)
	img, _ := random.Image(64, 1)
	tag, _ := name.NewTag(tr.host+"/fleet/bad:base", name.Insecure)
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	sz, _ := img.Size()
	entry := func(plat string) string {
		return fmt.Sprintf(`{"mediaType":%q,"digest":%q,"size":%d,"platform":%s}`, types.OCIManifestSchema1, d, sz, plat)
	}
	index := func(entries ...string) []byte {
		return []byte(fmt.Sprintf(`{"schemaVersion":2,"mediaType":%q,"manifests":[%s]}`, types.OCIImageIndex, strings.Join(entries, ",")))
	}
	// Artifacts are not checked by the registry, so any number can be listed.
	many := make([]string, MaxIndexManifests+1)
	for i := range many {
		many[i] = fmt.Sprintf(`{"mediaType":"application/vnd.example.thing.v1+json","digest":"sha256:%064x","size":1}`, i)
	}
	huge, _ := json.Marshal(strings.Repeat("x", MaxIndexBytes))
	cases := []struct {
		name, want string
		body       []byte
	}{
		{"architecture not a platform name", "is not a platform name", index(entry(`{"os":"linux","architecture":"x86 64"}`))},
		{"uppercase os", "is not a platform name", index(entry(`{"os":"Linux","architecture":"amd64"}`))},
		{"empty architecture", "is not a platform name", index(entry(`{"os":"linux","architecture":""}`))},
		{"too many manifests", fmt.Sprintf("lists %d manifests, at most %d", MaxIndexManifests+1, MaxIndexManifests), index(many...)},
		{"too large", "at most 1048576", []byte(fmt.Sprintf(`{"schemaVersion":2,"mediaType":%q,"manifests":[%s],"annotations":{"pad":%s}}`, types.OCIImageIndex, entry(`{"os":"linux","architecture":"amd64"}`), huge))},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ref := fmt.Sprintf("fleet/bad:%d", i)
			tr.putRaw(t, ref, types.OCIImageIndex, c.body)
			_, err := tr.resolver(Options{}).Resolve(context.Background(), tr.host+"/"+ref, nil)
			if !errors.Is(err, ErrBadResponse) || Reason(err) != "RegistryBadResponse" {
				t.Fatalf("Resolve = %v, want ErrBadResponse", err)
			}
			t.Log(err)
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), tr.host+"/"+ref) {
				t.Fatalf("error %q does not say %q or name the reference", err, c.want)
			}
			// A digest reference to such an index is refused too: the
			// registry answered, and the answer is unusable.
			var e *Error
			errors.As(err, &e)
			dg := strings.Fields(strings.TrimPrefix(e.Err.Error(), "index "))[0]
			dg = strings.TrimSuffix(dg, ":")
			if _, err := tr.resolver(Options{}).Resolve(context.Background(), tr.host+"/fleet/bad@"+dg, nil); !errors.Is(err, ErrBadResponse) {
				t.Fatalf("digest reference to the index: %v, want ErrBadResponse", err)
			}
		})
	}
}

func TestResolveRefusesAnIndexThatIsNotJSON(t *testing.T) {
	tr := newRegistry(t)
	body := []byte(`{"schemaVersion":2,"manifests":[{`)
	sum := sha256.Sum256(body)
	dg := "sha256:" + hexpkg.EncodeToString(sum[:])
	// No registry stores such a manifest; a broken one may serve it.
	tr.wrap = func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if !strings.Contains(r.URL.Path, "/manifests/") {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", string(types.OCIImageIndex))
		w.Header().Set("Docker-Content-Digest", dg)
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		if r.Method == http.MethodGet {
			_, _ = w.Write(body)
		}
	}
	_, err := tr.resolver(Options{}).Resolve(context.Background(), tr.host+"/fleet/broken:1", nil)
	if !errors.Is(err, ErrBadResponse) || !strings.Contains(err.Error(), "index "+dg) {
		t.Fatalf("Resolve = %v, want ErrBadResponse naming the index", err)
	}
}
