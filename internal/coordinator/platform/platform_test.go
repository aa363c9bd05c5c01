package platform

import (
	"strings"
	"testing"
)

func dg(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

func TestKeyNormalizesLikeContainerd(t *testing.T) {
	for _, c := range []struct{ os, arch, variant, want string }{
		{"linux", "amd64", "", "linux/amd64"},
		{"linux", "amd64", "v1", "linux/amd64"},
		{"linux", "amd64", "v3", "linux/amd64/v3"},
		{"linux", "x86_64", "", "linux/amd64"},
		{"linux", "arm64", "", "linux/arm64"},
		{"linux", "arm64", "v8", "linux/arm64"},
		{"linux", "aarch64", "8", "linux/arm64"},
		{"linux", "arm64", "v9", "linux/arm64/v9"},
		{"linux", "arm", "", "linux/arm/v7"},
		{"linux", "arm", "7", "linux/arm/v7"},
		{"linux", "arm", "v6", "linux/arm/v6"},
		{"linux", "armhf", "", "linux/arm/v7"},
		{"linux", "s390x", "", "linux/s390x"},
		{"linux", "i686", "", "linux/386"},
	} {
		if got := Key(c.os, c.arch, c.variant); got != c.want {
			t.Errorf("Key(%q, %q, %q) = %q, want %q", c.os, c.arch, c.variant, got, c.want)
		}
	}
}

type entry struct{ os, arch, variant, digest string }

func index(t *testing.T, es ...entry) *Index {
	t.Helper()
	ix := &Index{Digest: dg('f')}
	for _, e := range es {
		if err := ix.Add(e.os, e.arch, e.variant, e.digest); err != nil {
			t.Fatal(err)
		}
	}
	return ix
}

func TestForMatchesTheNodesPlatform(t *testing.T) {
	for _, c := range []struct {
		name     string
		entries  []entry
		os, arch string
		want     string // digest, or the problem's reason
	}{
		{"amd64 node, two platforms", []entry{{"linux", "amd64", "", dg('a')}, {"linux", "arm64", "v8", dg('b')}}, "linux", "amd64", dg('a')},
		{"arm64 node takes the v8 entry", []entry{{"linux", "amd64", "", dg('a')}, {"linux", "arm64", "v8", dg('b')}}, "linux", "arm64", dg('b')},
		{"arm64 node takes a variant-less entry", []entry{{"linux", "arm64", "", dg('b')}}, "linux", "arm64", dg('b')},
		{"arm64 node ignores arm64/v9 and 32-bit arm", []entry{{"linux", "arm64", "v9", dg('c')}, {"linux", "arm", "v7", dg('d')}}, "linux", "arm64", ReasonNotInIndex},
		{"arm64 and arm64/v8 with different images are ambiguous", []entry{{"linux", "arm64", "", dg('b')}, {"linux", "arm64", "v8", dg('c')}}, "linux", "arm64", ReasonAmbiguous},
		{"the same image listed twice is not ambiguous", []entry{{"linux", "arm64", "", dg('b')}, {"linux", "arm64", "v8", dg('b')}}, "linux", "arm64", dg('b')},
		{"amd64 node ignores amd64/v3", []entry{{"linux", "amd64", "v3", dg('e')}}, "linux", "amd64", ReasonNotInIndex},
		{"amd64/v1 is amd64", []entry{{"linux", "amd64", "v1", dg('e')}}, "linux", "amd64", dg('e')},
		{"missing platform", []entry{{"linux", "amd64", "", dg('a')}}, "linux", "s390x", ReasonNotInIndex},
		{"other os", []entry{{"windows", "amd64", "", dg('a')}}, "linux", "amd64", ReasonNotInIndex},
		{"empty index", nil, "linux", "amd64", ReasonNotInIndex},
		{"node without nodeInfo", []entry{{"linux", "amd64", "", dg('a')}}, "", "", ReasonNodeUnknown},
		{"node with a garbled architecture", []entry{{"linux", "amd64", "", dg('a')}}, "linux", "AMD 64", ReasonNodeUnknown},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, p := index(t, c.entries...).For(c.os, c.arch)
			switch {
			case strings.HasPrefix(c.want, "sha256:"):
				if got != c.want || p != nil {
					t.Fatalf("For = %q, %v; want %s", got, p, c.want)
				}
			case p == nil || p.Reason != c.want || got != "":
				t.Fatalf("For = %q, %v; want problem %s", got, p, c.want)
			case p.Message == "":
				t.Fatal("problem without a message")
			}
		})
	}
}

func TestProblemMessagesNameWhatIsThere(t *testing.T) {
	ix := index(t, entry{"linux", "amd64", "", dg('a')}, entry{"linux", "arm64", "v8", dg('b')})
	_, p := ix.For("linux", "s390x")
	if p == nil || !strings.Contains(p.Message, "linux/s390x") || !strings.Contains(p.Message, "linux/amd64, linux/arm64") {
		t.Fatalf("problem %v does not name the node's platform and the index's", p)
	}
	ix = index(t, entry{"linux", "arm64", "", dg('b')}, entry{"linux", "arm64", "v8", dg('c')})
	_, p = ix.For("linux", "arm64")
	if p == nil || !strings.Contains(p.Message, "linux/arm64 sha256:bbbb") || !strings.Contains(p.Message, "linux/arm64/v8 sha256:cccc") {
		t.Fatalf("problem %v does not name the candidates", p)
	}
}

func TestAddRejectsWhatIsNotAPlatformImage(t *testing.T) {
	for _, c := range []struct {
		name string
		e    entry
	}{
		{"empty os", entry{"", "amd64", "", dg('a')}},
		{"empty architecture", entry{"linux", "", "", dg('a')}},
		{"uppercase", entry{"Linux", "amd64", "", dg('a')}},
		{"slash in architecture", entry{"linux", "amd64/v2", "", dg('a')}},
		{"control character in variant", entry{"linux", "arm64", "v8\n", dg('a')}},
		{"overlong variant", entry{"linux", "arm64", strings.Repeat("v", 33), dg('a')}},
		{"sha512 digest", entry{"linux", "amd64", "", "sha512:" + strings.Repeat("a", 128)}},
		{"short digest", entry{"linux", "amd64", "", "sha256:abc"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ix := &Index{}
			if err := ix.Add(c.e.os, c.e.arch, c.e.variant, c.e.digest); err == nil {
				t.Fatalf("Add(%+v) accepted", c.e)
			}
			if len(ix.Entries) != 0 {
				t.Fatalf("rejected entry recorded: %+v", ix.Entries)
			}
		})
	}
	t.Run("bounded", func(t *testing.T) {
		ix := &Index{}
		for i := 0; i < MaxEntries; i++ {
			d := "sha256:" + strings.Repeat("0", 60) + strings.Repeat(string("0123456789abcdef"[i%16]), 2) + strings.Repeat(string("0123456789abcdef"[i/16%16]), 2)
			if err := ix.Add("linux", "amd64", "", d); err != nil {
				t.Fatalf("entry %d: %v", i, err)
			}
		}
		if err := ix.Add("linux", "arm64", "", dg('b')); err == nil {
			t.Fatalf("entry %d accepted", MaxEntries+1)
		}
	})
}
